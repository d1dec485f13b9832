"""Each key can vanish alone (issue 32): every key kind of the schema deleted by itself, between two
flushes or between a flush and its reply, with one and three shards, sync and asyncio writers. The
view (a StatsReader snapshot and the load feed, ``/load``) must be exact again within two flushes,
nothing may stay at 0 or ``bad_chunk``, and the writer must say what it found gone.

Before this change, an engine's hash (or one chunk's names field) deleted while its writer's
sequence entry survived left that engine's series missing or ``bad_chunk`` for good: a flush sends
only the chunks that changed, and names only when they change.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsWriter
from redis_stats.keys import Keys
from redis_stats.load import LoadMap, LoadSource
from tests import chunked
from tests.conftest import sample_catalog

pytestmark = pytest.mark.redis_server

LOAD = LoadMap(requests_running=LoadSource("running"), generation_tokens_per_second=LoadSource("tokens"))
ENGINES = [0, 1, 2]  # writer a's (declared); it also records for engine 4 once, then leaves it idle
IDLE = 4


def _cfg(url: str, namespace: str, shards: int) -> StatsConfig:
    # stale_after 2 s: claims renewed every 0.5 s (the test flushes by hand, well within it).
    return StatsConfig(url=url, namespace=namespace, shards=shards, flush_interval=0.05, stale_after=2.0)


class _Writer:
    """A sync or asyncio writer driven by hand: record, flush, and a hook run inside the next
    script call after Redis applied it and before the writer reads the reply."""

    def __init__(self, kind: str, cfg: StatsConfig, engines: list[int], owner: str, role: str) -> None:
        self.loop = asyncio.new_event_loop() if kind == "asyncio" else None
        if self.loop is None:
            self.w: Any = StatsWriter(
                cfg, sample_catalog(), engines=engines, owner=owner, role=role, load=LOAD, start=False
            )
        else:

            async def make() -> AsyncStatsWriter:
                return AsyncStatsWriter(
                    cfg, sample_catalog(), engines=engines, owner=owner, role=role, load=LOAD
                )

            self.w = self.loop.run_until_complete(make())

    def flush(self) -> bool:
        if self.loop is None:
            return bool(self.w.flush())
        return bool(self.loop.run_until_complete(self.w.flush()))

    def before_reply(self, hook: Callable[[], None]) -> None:
        """Run *hook* once, inside the next script call: applied, its reply not read yet."""
        real = self.w._script

        if self.loop is None:

            def call(keys: Any, args: Any, *more: Any, **kw: Any) -> Any:
                reply = real(keys, args, *more, **kw)
                self.w._script = real
                hook()
                return reply

        else:

            async def call(keys: Any, args: Any, *more: Any, **kw: Any) -> Any:  # type: ignore[misc]
                reply = await real(keys, args, *more, **kw)
                self.w._script = real
                hook()
                return reply

        self.w._script = call

    def close(self) -> None:
        if self.loop is None:
            self.w.close(timeout=5)
        else:
            self.loop.run_until_complete(self.w.close(timeout=5))
            self.loop.close()


class _Fleet:
    """Writer a (engines 0, 1, 2, owner node-a, the load feed) and writer b (engine 0, owner
    node-b: a conflict on engine 0), and what they recorded: the truth the view must show."""

    def __init__(self, kind: str, url: str, namespace: str, shards: int) -> None:
        self.url, self.namespace, self.shards = url, namespace, shards
        self.cfg = _cfg(url, namespace, shards)
        self.a = _Writer(kind, self.cfg, ENGINES, "node-a", "a")
        self.a.w.stats_interval = 0.2  # (5 s by default: the routine self-metrics' cadence)
        self.b = _Writer(kind, self.cfg, [0], "node-b", "b")
        self.counts: dict[tuple[int, str], int] = {}
        self.running: dict[int, float] = {}
        self.latency: dict[int, int] = {}
        self.step = 0

    def record(self, engines: list[int]) -> None:
        """One round of traffic on *engines* (a new series on engine 0 in rounds 1, 4, ..., so its
        chunk's names change; engine 1 only counts)."""
        self.step += 1
        for e in engines:
            reason = f"r{self.step}" if e == 0 and self.step % 3 == 1 else "stop"
            self.a.w.counter("requests").labels(engine=e, reason=reason).inc(e + 1)
            self.counts[(e, reason)] = self.counts.get((e, reason), 0) + e + 1
            self.a.w.gauge("running").labels(engine=e).set(10 * e + self.step)
            self.running[e] = 10 * e + self.step
            self.a.w.counter("tokens").labels(engine=e).inc(7)
            self.counts[(e, "tokens")] = self.counts.get((e, "tokens"), 0) + 7
            self.a.w.histogram("latency_seconds").labels(engine=e).observe(0.2)
            self.latency[e] = self.latency.get(e, 0) + 1
        self.b.w.counter("tokens").labels(engine=0).inc(3)
        self.counts[(0, "tokens")] = self.counts.get((0, "tokens"), 0) + 3

    def flush(self) -> None:
        assert self.a.flush() and self.b.flush()

    def keys(self, engine: int) -> Keys:
        return Keys(self.namespace).shard(engine % self.shards, self.shards)

    def problems(self) -> list[str]:
        """How the view differs from what was recorded (empty: exact)."""
        reader = StatsReader(self.cfg, sample_catalog())
        try:
            snap, load = reader.snapshot(), reader.load()
        finally:
            reader.close()
        out = [f"skipped {dict(snap.skipped)}"] if snap.skipped else []
        for (e, what), n in sorted(self.counts.items()):
            engine = snap.engines.get(e)
            got = (
                None
                if engine is None
                else engine.counter(*(["tokens"] if what == "tokens" else ["requests", what]))
            )
            if got != n:
                out.append(f"engine {e} {what}: {got}, recorded {n}")
        for e in ENGINES:
            gauge = snap.engines[e].gauge("running") if e in snap.engines else None
            if gauge != self.running[e]:
                out.append(f"engine {e} running: {gauge}, set {self.running[e]}")
            hist = snap.engines[e].histogram("latency_seconds") if e in snap.engines else None
            if hist is None or hist.count != self.latency[e]:
                out.append(f"engine {e} latency count: {hist and hist.count}, observed {self.latency[e]}")
            entry = load.engines.get(e)
            if entry is None or not entry.up or entry.requests_running != self.running[e]:
                out.append(f"/load engine {e}: {entry}")
        if 0 not in snap.engines or set(snap.engines[0].conflict) != {"node-a", "node-b"}:
            out.append(f"engine 0 conflict: {snap.engines[0].conflict if 0 in snap.engines else None}")
        for w in (self.a.w, self.b.w):
            info = snap.writers.get(w.writer_id)
            if info is None or not info.live or "stale_ms" not in info.stats:
                out.append(f"writer {w.writer_id}: {info}")
        return out

    def close(self) -> None:
        self.a.close()
        self.b.close()


def _delete(fleet: _Fleet, what: str) -> set[str]:
    """Delete one key (or field) of *what* kind; returns what writer a may say it found gone."""
    raw = redis.Redis.from_url(fleet.url)
    a_id = fleet.a.w.writer_id
    k0, k1 = fleet.keys(0), fleet.keys(1)
    chunk = chunked.chunk_field(a_id, 0)
    deleted = {
        "engine hash": lambda: raw.delete(k0.counters(0)),
        "idle engine hash": lambda: raw.delete(fleet.keys(IDLE).counters(IDLE)),
        "names field": lambda: raw.hdel(k0.counters(0), chunk + chunked.NAMES_SUFFIX),
        "chunk field": lambda: raw.hdel(fleet.keys(IDLE).counters(IDLE), chunk),
        "seq entry": lambda: raw.hdel(k0.seq, a_id),
        "claims": lambda: raw.delete(k0.claims),
        "catalogue": lambda: raw.delete(k1.meta),
        "load hash": lambda: raw.delete(k0.load),
        "writers set": lambda: raw.delete(k0.writers),
        "engines set": lambda: raw.delete(k1.engines),
        "conflicts": lambda: raw.delete(k0.conflicts),
        "writer stats": lambda: raw.delete(Keys(fleet.namespace).writer_stats(a_id)),
    }[what]()
    assert deleted == 1, f"{what}: nothing deleted"
    return {
        "engine hash": {"engine"},
        "idle engine hash": {"engine"},
        "names field": {"names"},
        "chunk field": {"chunk"},
        "seq entry": {"seq"},
        "catalogue": {"catalogue"},
        "writers set": {"writers"},
        "engines set": {"engines"},
        "writer stats": {"stats"},
    }.get(what, set())


KINDS = [
    "engine hash",
    "idle engine hash",
    "names field",
    "chunk field",
    "seq entry",
    "claims",
    "catalogue",
    "load hash",
    "writers set",
    "engines set",
    "conflicts",
    "writer stats",
]


@pytest.mark.parametrize("moment", ["between flushes", "before the reply"])
@pytest.mark.parametrize("what", KINDS)
@pytest.mark.parametrize(("kind", "shards"), [("sync", 1), ("sync", 3), ("asyncio", 1), ("asyncio", 3)])
def test_a_key_deleted_alone_is_restored_within_two_flushes(
    redis_server, namespace, caplog, kind, shards, what, moment
):
    fleet = _Fleet(kind, redis_server.url, namespace, shards)
    try:
        fleet.record([*ENGINES, IDLE])
        fleet.flush()
        fleet.record(ENGINES)  # engine 4 idle from here on: no block of a's flushes names it
        fleet.flush()
        fleet.flush()  # b claims again (a conflict): engine 0's conflict is in the view
        assert fleet.problems() == []
        caplog.clear()
        fleet.record(ENGINES)
        expected: set[str] = set()
        if moment == "between flushes":
            expected = _delete(fleet, what)
        else:
            fleet.a.before_reply(lambda: expected.update(_delete(fleet, what)))
            fleet.flush()
        with caplog.at_level(logging.WARNING, logger="redis_stats.writer"):
            if what == "writer stats":
                # Found by the next flush that stores self-metrics: within the stats interval.
                time.sleep(fleet.a.w.stats_interval)
            fleet.flush()
            if what == "conflicts":
                # Nothing notices: the conflict is written again by the next claim that meets the
                # other owner's, at the latest one claim interval (stale_after / 4) on.
                time.sleep(fleet.a.w.claim_interval)
            fleet.flush()
        assert fleet.problems() == [], f"{what} deleted {moment}"
        if expected:  # the writer found its own key gone, counted it and said so
            assert set(fleet.a.w.stats.lost) & expected, dict(fleet.a.w.stats.lost)
            assert any("are gone from" in r.getMessage() for r in caplog.records)
        # ... and it stays exact.
        fleet.record(ENGINES)
        fleet.flush()
        assert fleet.problems() == []
    finally:
        fleet.close()


def test_a_writer_user_of_the_older_acl_rules_keeps_flushing_and_still_finds_a_lost_engine_hash(
    redis_server, namespace
):
    """``+hexists`` joined the writer's rules with the field checks: a user made by the older rules
    must still flush (HEXISTS refused inside the script is not a failed flush), and still notice a
    whole engine hash gone (TYPE)."""
    from tests import acl

    admin = redis.Redis.from_url(redis_server.url)
    for user, commands in (("new", acl.WRITER), ("old", acl.WRITER.replace(" +hexists", ""))):
        admin.execute_command("ACL", "SETUSER", f"{user}-{namespace}", *acl.rules(namespace, "pw", commands))
    host = redis_server.url.split("//", 1)[1]
    writers = {}
    for user in ("new", "old"):
        cfg = StatsConfig(url=f"redis://{user}-{namespace}:pw@{host}", namespace=namespace)
        writers[user] = StatsWriter(cfg, sample_catalog(), engines=[0], role=user, start=False)
    chunk = chunked.chunk_field
    for user, w in writers.items():
        tokens = w.counter("tokens").labels(engine=0)
        tokens.inc(5)
        w.counter("requests").labels(engine=0, reason="stop").inc(2)
        assert w.flush()
        admin.hdel(Keys(namespace).counters(0), chunk(w.writer_id, 0) + chunked.NAMES_SUFFIX)
        tokens.inc(1)
        assert w.flush() and w.flush()
        assert dict(w.stats.lost) == ({"names": 1} if user == "new" else {}), user
    snap = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog()).snapshot()
    # The older rules cannot check a field: the old writer's chunk stays without its names.
    assert snap.skipped.get("bad_chunk") == 1 and snap.engines[0].counter("tokens") == 6
    admin.delete(Keys(namespace).counters(0))
    for w in writers.values():
        w.counter("tokens").labels(engine=0).inc(1)
    for _ in range(2):  # both find it gone with their first flush, and store everything again
        assert all(w.flush() for w in writers.values())
    assert all(w.stats.lost["engine"] == 1 for w in writers.values())
    snap = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog()).snapshot()
    assert not snap.skipped and snap.engines[0].counter("tokens") == 14
    assert snap.engines[0].counter("requests", "stop") == 4
    for w in writers.values():
        assert w.close()


# -- evicted by Redis itself: a real server under maxmemory, every policy ---------------------------

POLICIES = [
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
]
EVICTION_ENGINES = 20


def _wait_for(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_view_is_exact_again_after_redis_evicted_keys_under_maxmemory(namespace, policy):
    """Four writers (flushers running) of 20 engines; other data fills Redis past ``maxmemory``
    while they count; then the pressure ends (the other data deleted). Within two flushes of each
    writer the view is exact: every engine, nothing at 0, no ``bad_chunk``. With ``allkeys-*``
    Redis evicts our keys too, and the writers say so; ``volatile-*`` evict only keys with a TTL
    (we set none on data), so they refuse writes as ``noeviction`` does."""
    from redis_stats.tools.embedded import EmbeddedRedis

    server = EmbeddedRedis(extra_args=["--maxmemory-policy", policy, "--maxmemory-samples", "5"]).start()
    raw = redis.Redis(port=server.port)
    cfg = StatsConfig(url=server.url, namespace=namespace, flush_interval=0.1, stale_after=5.0)
    per = EVICTION_ENGINES // 4
    writers = [
        StatsWriter(cfg, sample_catalog(), engines=list(range(i * per, (i + 1) * per)), role=f"w{i}")
        for i in range(4)
    ]
    truth: dict[int, int] = {}
    rounds = [0]

    def record(n: int) -> None:
        rounds[0] += 1
        for i, w in enumerate(writers):
            for e in range(i * per, (i + 1) * per):
                w.counter("tokens").labels(engine=e).inc(n)
                w.counter("requests").labels(engine=e, reason="stop").inc(1)
                w.gauge("running").labels(engine=e).set(n)
                truth[e] = truth.get(e, 0) + n

    try:
        record(10)
        _wait_for(lambda: not any(w.pending() for w in writers), "the first flushes")
        used = int(raw.info("memory")["used_memory"])
        raw.config_set("maxmemory", str(used + 2 * 1024 * 1024))
        ours_before = set(raw.scan_iter(match=f"rs:{{{namespace}}}*"))
        filler = b"x" * 2048
        refused = 0
        for k in range(6000):  # about 12 MB against 2 MB of room: evicts, or refuses
            if k % 300 == 0:
                record(1)  # the writers keep counting under pressure
            try:
                raw.set(f"other:{k}", filler)
            except redis.exceptions.OutOfMemoryError:
                refused += 1
                time.sleep(0.001)
        evicted = int(raw.info("stats")["evicted_keys"])
        ours_during = set(raw.scan_iter(match=f"rs:{{{namespace}}}*"))
        # What a writer checks with every flush (its stats hash w:<id>: with those that store
        # self-metrics, every 5 s).
        gone = {k for k in ours_before - ours_during if b":w:" not in k}
        # The pressure ends: the other data goes.
        for batch in range(0, 6000, 500):
            raw.delete(*[f"other:{k}" for k in range(batch, batch + 500)])
        record(5)
        start = [w.stats.flushes for w in writers]
        _wait_for(
            lambda: (
                all(w.stats.flushes >= s + 2 for w, s in zip(writers, start))
                and not any(w.pending() for w in writers)
            ),
            "two flushes of every writer after the pressure",
        )
        snap = StatsReader(cfg, sample_catalog()).snapshot()
        assert not snap.skipped, dict(snap.skipped)
        got = {e: snap.engines[e].counter("tokens") if e in snap.engines else None for e in truth}
        assert got == truth, f"{policy}: evicted {evicted}, of ours {sorted(ours_before - ours_during)}"
        assert all(snap.engines[e].gauge("running") == 5 for e in truth)
        assert all(snap.engines[e].counter("requests", "stop") == rounds[0] for e in truth)
        lost = sum(sum(w.stats.lost.values()) for w in writers)
        # `redis-stats inspect` says what the server evicted, and which writers found keys gone.
        from redis_stats.ops.inspection import inspect_namespace

        text = "\n".join(inspect_namespace(cfg))
        said = re.search(rf"policy {policy}, (\d+) keys evicted since start", text)
        assert said and int(said.group(1)) >= evicted, text
        assert ("found its keys gone" in text) == (lost > 0), text
        if policy.startswith("allkeys"):
            assert evicted > 0
            if gone:  # Redis took some of ours: the writers noticed
                assert lost > 0, sorted(gone)
        else:  # nothing of ours has a TTL: never evicted; writes refused instead (kind oom)
            assert evicted == 0 and refused > 0 and lost == 0
            assert sum(w.stats.errors["oom"] for w in writers) > 0 or policy == "noeviction"
    finally:
        for w in writers:
            w.close(timeout=5)
        server.close()


def test_a_lost_key_is_counted_in_the_self_metrics_of_every_view(redis_server, namespace):
    """``redis_stats_writer_keys_lost_total{writer,key}``: in the exporter's text and through
    prometheus_client (the two render paths of the self-metrics)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from redis_stats import RedisCollector

    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    w = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    w.counter("tokens").labels(engine=0).inc(3)
    assert w.flush()
    redis.Redis.from_url(redis_server.url).delete(Keys(namespace).counters(0))
    for _ in range(3):  # found gone, everything stored again, then the self-metrics with it
        assert w.flush()
    line = f'redis_stats_writer_keys_lost_total{{writer="{w.writer_id}",key="engine"}} 1'
    collector = RedisCollector(StatsReader(cfg, sample_catalog()))
    assert line in collector.render_text()
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    line = f'redis_stats_writer_keys_lost_total{{key="engine",writer="{w.writer_id}"}} 1.0'  # sorted
    assert line in text, [x for x in text.splitlines() if "lost" in x]
    assert w.close()
