"""Time travel the way production does it, on real servers (issue 24): a restart from an older
RDB, an AOF crash (appendfsync everysec, SIGKILL), a lagging replica promoted, one and three
shards; writers with their flusher running (the sync thread and the asyncio task), which must bring
every reader back to the exact totals within two flushes, with no chunk left ``bad_chunk``.

"Within two flushes" is counted in the writer's own confirmed flushes (``stats.flushes``) from the
moment the server is back, not in wall time: the machine is shared, a timing window would flake.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsWriter
from redis_stats.capability import check_store
from redis_stats.integrations.vllm.logline import VllmLogLines
from redis_stats.keys import Keys
from redis_stats.leader import Rank0Leader
from redis_stats.ops.retention import collect_garbage
from redis_stats.reporting import StatsReporter
from redis_stats.server import Exporter
from redis_stats.tools.cli import main
from redis_stats.tools.embedded import EmbeddedRedis
from tests.conftest import PYTHON, ROOT, sample_catalog
from tests.proxy import CuttingProxy
from tests.store.test_liveness import _agree, _views

pytestmark = pytest.mark.redis_server

INTERVAL = 0.1  # the writers' flush interval


def _cfg(url: str, namespace: str, **kw: Any) -> StatsConfig:
    return StatsConfig(url=url, namespace=namespace, **{"flush_interval": INTERVAL, **kw})


# What each scenario records: (engine, reason) -> count, in two steps. The second adds a series to
# engine 0 (its chunk's names change) and only counts on engine 1 (its chunk's names do not).
FIRST = {(0, "stop"): 100, (1, "stop"): 100}
SECOND = {(0, "length"): 25, (1, "stop"): 10}
THIRD = {(1, "stop"): 1, (0, "abort"): 4}


def _total(*steps: dict[tuple[int, str], int]) -> dict[tuple[int, str], int]:
    out: dict[tuple[int, str], int] = {}
    for step in steps:
        for k, v in step.items():
            out[k] = out.get(k, 0) + v
    return out


def _seen(url: str, namespace: str, shards: int) -> tuple[dict[tuple[int, str], int], dict[str, int]]:
    reader = StatsReader(_cfg(url, namespace, shards=shards), sample_catalog())
    try:
        snap = reader.snapshot()
    finally:
        reader.close()
    counts = {
        (e, reason): int(snap.engines[e].counter("requests", reason))
        for e in snap.engines
        for reason in ("stop", "length", "abort")
        if snap.engines[e].counter("requests", reason)
    }
    return counts, dict(snap.skipped)


def _wait(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class _Writer:
    """A writer with its flusher running: the sync thread, or the asyncio task on a loop of its own
    thread (the test drives both the same way)."""

    def __init__(self, kind: str, url: str, namespace: str, shards: int) -> None:
        self.kind, self.shards = kind, shards
        cfg = _cfg(url, namespace, shards=shards)
        if kind == "sync":
            self.w: Any = StatsWriter(cfg, sample_catalog(), engines=[0, 1])
            self.loop = None
        else:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, daemon=True).start()

            async def make() -> AsyncStatsWriter:
                w = AsyncStatsWriter(cfg, sample_catalog(), engines=[0, 1])
                w.start()
                return w

            self.w = asyncio.run_coroutine_threadsafe(make(), self.loop).result(10)

    def _in_loop(self, fn: Callable[[], Any]) -> Any:
        if self.loop is None:
            return fn()

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def record(self, step: dict[tuple[int, str], int]) -> None:
        def go() -> None:
            for (engine, reason), n in step.items():
                self.w.counter("requests").labels(engine=engine, reason=reason).inc(n)

        self._in_loop(go)

    def flushes(self) -> int:
        return int(self._in_loop(lambda: self.w.stats.flushes))

    def confirmed(self) -> None:
        """Wait until Redis confirmed everything recorded (the flusher sends it)."""
        _wait(lambda: not self._in_loop(lambda: self.w.pending()), "the flusher to confirm")

    def flushed_twice_since(self, start: int) -> None:
        """Two flushes confirmed since *start* (``stats.flushes`` counts one per shard called:
        shard 0, the home, and the shards of engines 0 and 1)."""
        calls = len({0} | {e % self.shards for e in (0, 1)})
        _wait(lambda: self.flushes() >= start + 2 * calls, "two confirmed flushes")

    def close(self) -> None:
        if self.loop is None:
            self.w.close(timeout=5)
            return
        asyncio.run_coroutine_threadsafe(self.w.close(timeout=5), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    s = EmbeddedRedis()
    yield s
    s.close()


def _back_in_time_then_exact(
    writer: _Writer, url: str, namespace: str, shards: int, travel: Callable[[], int]
) -> None:
    """Record, *travel* (the server loses some of it; returns the writer's flush count as the
    server came back), then: exact within two confirmed flushes, no ``bad_chunk``, and exact from
    then on."""
    writer.record(FIRST)
    writer.confirmed()
    writer.flushed_twice_since(travel())
    counts, skipped = _seen(url, namespace, shards)
    assert "bad_chunk" not in skipped, skipped
    assert counts == _total(FIRST, SECOND), counts
    writer.record(THIRD)
    writer.confirmed()
    counts, skipped = _seen(url, namespace, shards)
    assert "bad_chunk" not in skipped and counts == _total(FIRST, SECOND, THIRD), (counts, skipped)


@pytest.mark.parametrize(("kind", "shards"), [("sync", 1), ("sync", 3), ("asyncio", 1), ("asyncio", 3)])
@pytest.mark.parametrize("stop", ["SHUTDOWN NOSAVE", "SIGKILL"])
def test_a_restart_from_an_older_rdb_is_exact_again_within_two_flushes(server, namespace, kind, shards, stop):
    server.start()
    url = server.url
    writer = _Writer(kind, url, namespace, shards)

    def travel() -> int:
        redis.Redis.from_url(url).save()  # dump.rdb holds FIRST only
        writer.record(SECOND)
        writer.confirmed()
        assert _seen(url, namespace, shards)[0] == _total(FIRST, SECOND)
        if stop == "SIGKILL":
            server.kill()
        else:
            try:
                redis.Redis.from_url(url).shutdown(nosave=True)
            except redis.ConnectionError:
                pass
            assert server.process is not None
            server.process.wait(10)
            server.process = None
        assert (server.dir / "dump.rdb").exists()
        flushes = writer.flushes()
        server.start()  # same port, same dir: loads the older dump.rdb
        return flushes

    try:
        _back_in_time_then_exact(writer, url, namespace, shards, travel)
    finally:
        writer.close()


def _aof_tail(server: EmbeddedRedis) -> Path:
    """The incremental AOF file Redis 7 appends to (appendonlydir/<name>.<n>.incr.aof)."""
    [tail] = sorted((server.dir / "appendonlydir").glob("*.incr.aof"))
    return tail


@pytest.mark.parametrize("cut", ["between commands", "inside a command"])
@pytest.mark.parametrize(("kind", "shards"), [("sync", 1), ("asyncio", 3)])
def test_an_aof_crash_is_exact_again_within_two_flushes(server, namespace, kind, shards, cut):
    """appendonly yes, appendfsync everysec, SIGKILL right after the flushes. A SIGKILL alone loses
    nothing (Redis wrote the AOF before it answered; the page cache keeps it): what everysec loses
    is the last second that never reached the disk when the host crashed. The test cuts the AOF
    back to its size before SECOND as that crash would (at a command boundary, or inside one:
    Redis loads a truncated AOF up to its last whole command, aof-load-truncated yes)."""
    server.extra_args = ["--appendonly", "yes", "--appendfsync", "everysec"]
    server.start()
    url = server.url
    writer = _Writer(kind, url, namespace, shards)

    def travel() -> int:
        tail = _aof_tail(server)
        synced = tail.stat().st_size  # what reached the disk
        writer.record(SECOND)
        writer.confirmed()
        server.kill()
        grown = tail.stat().st_size
        assert grown > synced
        with tail.open("r+b") as f:
            f.truncate(synced if cut == "between commands" else synced + (grown - synced) // 2)
        flushes = writer.flushes()
        server.start()
        return flushes

    try:
        _back_in_time_then_exact(writer, url, namespace, shards, travel)
    finally:
        writer.close()


@pytest.mark.parametrize(("kind", "shards"), [("sync", 1), ("sync", 3), ("asyncio", 1)])
def test_a_lagging_replica_promoted_is_exact_again_within_two_flushes(namespace, kind, shards):
    # No 5 s wait before the first full sync (repl-diskless-sync-delay): the test only needs a replica.
    master = EmbeddedRedis(extra_args=["--repl-diskless-sync-delay", "0"]).start()
    replica = EmbeddedRedis()
    link = CuttingProxy(master.port)  # the replication link, which the test stalls
    replica.extra_args = ["--replicaof", "127.0.0.1", str(link.port)]
    front = CuttingProxy(master.port)  # the address writers and readers use: switched on failover
    writer = None
    try:
        replica.start()
        rm, rr = redis.Redis(port=master.port), redis.Redis(port=replica.port)
        _wait(lambda: rr.info("replication").get("master_link_status") == "up", "the link")
        url = front.url
        writer = _Writer(kind, url, namespace, shards)

        def travel() -> int:
            assert rm.execute_command("WAIT", 1, 5000) == 1  # the replica holds FIRST
            link.stall()
            writer.record(SECOND)
            writer.confirmed()  # on the master only
            rr.execute_command("REPLICAOF", "NO", "ONE")
            # What the new master holds: FIRST only (the writer does not reach it yet).
            assert _seen(f"redis://127.0.0.1:{replica.port}/0", namespace, shards)[0] == _total(FIRST)
            front.retarget(replica.port)
            return writer.flushes()

        _back_in_time_then_exact(writer, url, namespace, shards, travel)
    finally:
        if writer is not None:
            writer.close()
        front.close()
        link.resume()
        link.close()
        replica.close()
        master.close()


class _Proc:
    """A writer process (tests/helpers/scripted_writer.py) driven line by line."""

    def __init__(
        self, env: dict[str, str], url: str, namespace: str, engine: int, interval: float, stale: float
    ):
        self.p = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "tests.helpers.scripted_writer",
                url,
                namespace,
                str(engine),
                str(interval),
                str(stale),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.writer_id = self._line()

    def _line(self) -> str:
        assert self.p.stdout is not None
        line = self.p.stdout.readline().strip()
        assert line, f"writer process exited ({self.p.poll()})"
        return line

    def send(self, command: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()

    def do(self, command: str) -> str:
        self.send(command)
        return self._line()

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


def test_a_writer_process_stopped_past_twice_the_retention_is_counted_once_and_loses_nothing(
    redis_server, namespace, python_env
):
    """SIGSTOP with an update not flushed yet; another writer keeps the engine live, gc runs every
    50 ms until the stopped writer is folded and twice the retention has passed; SIGCONT: exact."""
    url = redis_server.url
    gc_cfg = _cfg(url, namespace, retention=0.3, stale_after=0.15, flush_interval=0.05)
    other = StatsWriter(_cfg(url, namespace), sample_catalog(), engines=[0], start=False)
    other.counter("tokens").labels(engine=0).inc(50)
    assert other.flush()
    # Its flush interval (0.5 s) makes the update before the stop surely unflushed.
    paused = _Proc(python_env, url, namespace, 0, 0.5, 1.0)
    seq = redis.Redis.from_url(url, decode_responses=True)
    try:
        assert paused.do("inc 100") == "ok" and paused.do("sync") == "ok"
        paused.send("inc-stop 10")  # recorded after its last confirmed flush, then stopped
        _wait(lambda: open(f"/proc/{paused.p.pid}/stat").read().split(")")[1].split()[0] == "T", "the stop")
        stopped_at = time.monotonic()
        tombstone_seen = False
        while True:
            time.sleep(0.05)
            assert other.flush()  # right before gc: the other writer is never silent for it
            collect_garbage(gc_cfg)
            entry = seq.hget(Keys(namespace).seq, paused.writer_id)
            tombstone_seen |= bool(entry and entry.startswith("x"))
            # Past twice the retention: a closed writer's tombstone would be gone (this one's stays).
            if tombstone_seen and time.monotonic() - stopped_at > 3 * 0.3:
                break
            assert time.monotonic() - stopped_at < 10, "gc did not fold the stopped writer"
        snap = StatsReader(_cfg(url, namespace), sample_catalog()).snapshot()
        assert snap.engines[0].counter("tokens") == 150  # folded once, while it was stopped
        os.kill(paused.p.pid, signal.SIGCONT)
        assert paused._line() == "ok"  # the inc-stop command, continued
        assert paused.do("inc 5") == "ok" and paused.do("sync") == "ok"
        assert other.flush()
        snap = StatsReader(_cfg(url, namespace), sample_catalog()).snapshot()
        assert "bad_chunk" not in snap.skipped
        assert snap.engines[0].counter("tokens") == 50 + 100 + 10 + 5
        assert paused.do("close") == "closed True"
        snap = StatsReader(_cfg(url, namespace), sample_catalog()).snapshot()
        assert snap.engines[0].counter("tokens") == 165
    finally:
        paused.close()
        other.close()


@pytest.mark.parametrize("skew", [30.0, -30.0, 300.0, -300.0])
def test_a_writer_process_whose_clock_is_off_neither_wins_gauges_nor_changes_liveness(
    redis_server, namespace, python_env, skew
):
    """``running`` is a mostrecent gauge: the value set last wins. The skewed process's engine is up
    while it flushes (its stale_after 1 s, a 5 min skew either way) and DOWN at once once it closes."""
    url = redis_server.url
    env = {**python_env, "REDIS_STATS_TEST_SKEW": str(skew)}
    skewed = _Proc(env, url, namespace, 0, 0.05, 1.0)
    honest = StatsWriter(_cfg(url, namespace), sample_catalog(), engines=[0], start=False)
    try:
        assert skewed.do("inc 1") == "ok" and skewed.do("sync") == "ok"  # it heard the server's clock
        honest.counter("tokens").labels(engine=0).inc(1)
        assert honest.flush()  # a second writer of engine 0 (an API server beside the core)

        def running() -> float:
            snap = StatsReader(_cfg(url, namespace, stale_after=30.0), sample_catalog()).snapshot()
            return float(snap.engines[0].gauge("running"))

        assert skewed.do("set 10") == "ok" and skewed.do("sync") == "ok"
        assert running() == 10
        time.sleep(0.02)
        honest.gauge("running").labels(engine=0).set(3)
        assert honest.flush()
        assert running() == 3  # the newer value, whatever the skewed host's clock says
        time.sleep(0.02)
        assert skewed.do("set 7") == "ok" and skewed.do("sync") == "ok"
        assert running() == 7
        # Liveness: the skewed writer stays live past its stale_after (it flushes every 50 ms) ...
        time.sleep(1.3)
        assert honest.flush()
        _agree(_views(url, namespace), {0: True})
        snap = StatsReader(_cfg(url, namespace), sample_catalog()).snapshot()
        assert snap.writers[skewed.writer_id].live and snap.writers[honest.writer_id].live
        assert snap.engines[0].counter("tokens") == 2
        # ... closed, it is not live at once; the engine is DOWN at once when the other closes too.
        assert skewed.do("close") == "closed True"
        snap = StatsReader(_cfg(url, namespace), sample_catalog()).snapshot()
        assert not snap.writers[skewed.writer_id].live and snap.writers[honest.writer_id].live
        _agree(_views(url, namespace), {0: True})
        honest.close()
        _agree(_views(url, namespace), {0: False})
    finally:
        skewed.close()
        honest.close()


def _every_reader(
    url: str, namespace: str, reporter: Any, exporter: Any, caplog: pytest.LogCaptureFixture
) -> dict[str, dict[int, bool]]:
    """engine -> up, as each reader says it, one read each. The readers' own stale_after (30 s,
    top's default) is far from the writers' (1 s and 10 s): they must judge by what the writers stored."""
    out: dict[str, dict[int, bool]] = {}
    reader = StatsReader(_cfg(url, namespace, stale_after=30.0), sample_catalog())
    try:
        out["StatsReader.snapshot"] = {e: s.up for e, s in reader.snapshot().engines.items()}
        text = RedisCollector(reader).render_text()
    finally:
        reader.close()
    out["redis_stats_engine_up"] = {
        int(m[1]): m[2] == "1.0" for m in re.finditer(r'redis_stats_engine_up\{engine="(\d+)"\} (\S+)', text)
    }
    env = {"REDIS_STATS_URL": url, "REDIS_STATS_NAMESPACE": namespace, "REDIS_STATS_STALE_AFTER": "30"}
    top = CliRunner().invoke(main, ["top", "--once", "--interval", "0.2"], env=env)
    assert top.exit_code == 0, top.output
    out["top --once"] = {
        int(m[1]): m[2] == "up" for m in re.finditer(r"^[\s│|]*(\d+)[\s│|]+(up|DOWN)\b", top.output, re.M)
    }
    inspect = CliRunner().invoke(main, ["inspect"], env=env)
    assert inspect.exit_code == 0, inspect.output
    out["inspect"] = {
        int(m[1]): m[2] == "up" for m in re.finditer(r"^\s+engine (\d+): (up|DOWN),", inspect.output, re.M)
    }
    doc = json.loads(urllib.request.urlopen(exporter.url + "/snapshot", timeout=10).read())
    out["exporter /snapshot"] = {int(e): v["up"] for e, v in doc["engines"].items()}
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="redis_stats.reporter"):
        reporter.tick()  # an idle engine's line is logged at DEBUG: it is in the log all the same
    lines = [r.getMessage() for r in caplog.records if r.name == "redis_stats.reporter"]
    logged = {int(m[1]): False for ln in lines if (m := re.match(r"Engine (\d+): DOWN", ln))}
    logged |= {int(m[1]): True for ln in lines if (m := re.match(r"Engine (\d+): Avg", ln))}
    out["StatsReporter log"] = logged
    return out


def test_every_reader_calls_an_engine_down_within_one_read_of_a_kill_and_at_once_after_a_close(
    redis_server, namespace, python_env, caplog
):

    url = redis_server.url
    killed = _Proc(python_env, url, namespace, 0, 0.05, 1.0)
    alive = _Proc(python_env, url, namespace, 1, 0.05, 10.0)
    closing = _Proc(python_env, url, namespace, 2, 0.05, 10.0)
    reader = StatsReader(_cfg(url, namespace, stale_after=30.0), sample_catalog())
    exporter = Exporter(reader, port=0).start()
    # Every engine logs at INFO (not idle): each line is returned by tick().
    reporter = StatsReporter(
        StatsReader(_cfg(url, namespace, stale_after=30.0), sample_catalog()),
        Rank0Leader([0]),
        lines=VllmLogLines(),
    )
    try:
        for p in (killed, alive, closing):
            assert p.do("inc 1") == "ok" and p.do("sync") == "ok"
        reporter.tick()  # the first tick only takes its starting snapshot
        _agree(_every_reader(url, namespace, reporter, exporter, caplog), {0: True, 1: True, 2: True})
        # A clean close: DOWN at once, in every reader, long before any stale_after.
        assert closing.do("close") == "closed True"
        started = time.monotonic()
        _agree(_every_reader(url, namespace, reporter, exporter, caplog), {0: True, 1: True, 2: False})
        assert time.monotonic() - started < 10.0  # engine 2's writer declared 10 s
        # SIGKILL: no close. Past its writer's stale_after (1 s), one read of each says DOWN.
        last_beat = time.monotonic()
        killed.p.kill()
        killed.p.wait(10)
        time.sleep(max(0.0, last_beat + 1.0 + 0.3 - time.monotonic()))
        _agree(_every_reader(url, namespace, reporter, exporter, caplog), {0: False, 1: True, 2: False})
    finally:
        exporter.close()
        reader.close()
        for p in (killed, alive, closing):
            p.close()


@pytest.mark.parametrize("lost", ["first batch", "a later batch"])
def test_a_writer_paused_with_a_flush_in_flight_past_twice_the_retention_is_counted_once(
    redis_server, namespace, lost
):
    """A partition (or SIGSTOP, a VM freeze) that starts while a flush is in flight: Redis applied
    it, the writer never heard. gc folds the silent writer; a closed writer's tombstone would be
    dropped by now, this one's is kept; the writer then retries the same batch: counted once."""
    url = redis_server.url
    gc_cfg = _cfg(url, namespace, retention=0.3, stale_after=0.15, flush_interval=0.05)
    other = StatsWriter(_cfg(url, namespace), sample_catalog(), engines=[0], start=False)
    other.counter("tokens").labels(engine=0).inc(50)
    assert other.flush()  # the script is loaded: the cut below is the flush's own reply
    proxy = CuttingProxy(redis_server.port)
    # Configured as the fleet's gc is: gc removes a writer only once silent for 2 x its stale_after.
    fleet = {"retention": 0.3, "stale_after": 0.15}
    w = StatsWriter(_cfg(proxy.url, namespace, **fleet), sample_catalog(), engines=[0], start=False)
    tokens = w.counter("tokens").labels(engine=0)
    seq = redis.Redis.from_url(url, decode_responses=True)
    try:
        tokens.inc(100)
        if lost == "a later batch":
            assert w.flush()
            tokens.inc(10)
        assert w._client is not None
        # Connected and the server checked (redis_stats/capability.py, before a first flush):
        # the next reply through the proxy is the flush's.
        w._client.ping()
        w.store_checked = check_store(w._client, w.config, writes=True) is not None
        proxy.cut_probability = 1.0
        assert not w.flush()  # applied, its reply lost
        proxy.cut_probability = 0.0
        expected = 50 + 100 + (10 if lost == "a later batch" else 0)
        assert (
            StatsReader(_cfg(url, namespace), sample_catalog()).snapshot().engines[0].counter("tokens")
            == expected
        )
        folded_at, started = None, time.monotonic()
        while True:  # the writer is silent; the other one flushes, gc every 50 ms
            time.sleep(0.05)
            assert other.flush()
            collect_garbage(gc_cfg)
            entry = seq.hget(Keys(namespace).seq, w.writer_id)
            if folded_at is None and entry and entry.startswith("x"):
                folded_at = time.monotonic()
            # Past the time a closed writer's tombstone is dropped (one more retention).
            if folded_at is not None and time.monotonic() - folded_at > 3 * gc_cfg.retention:
                break
            assert time.monotonic() - started < 10, "gc did not fold the silent writer"
        assert w.flush() and w.flush() and other.flush()
        snap = StatsReader(_cfg(url, namespace), sample_catalog()).snapshot()
        assert snap.engines[0].counter("tokens") == expected
    finally:
        w.close(timeout=2)
        other.close()
        proxy.close()


@pytest.mark.slow
def test_a_cluster_restarted_from_older_rdbs_is_exact_again_within_two_flushes(namespace):
    """A real 3-master Cluster, shards=3 (the shards' hash tags spread over the masters): every
    master SAVEd, more flushed, every master SIGKILLed and restarted from its older dump.rdb (and
    its nodes.conf): the writer (flusher running) is exact again within two flushes."""
    from tests.servers import Cluster

    cluster = Cluster().start()
    writer = None
    try:
        url = cluster.url
        writer = _Writer("sync", url, namespace, 3)

        def travel() -> int:
            for node in cluster.nodes:
                redis.Redis(port=node.port).save()
            writer.record(SECOND)
            writer.confirmed()
            for node in cluster.nodes:
                node.kill()
            flushes = writer.flushes()
            for node in cluster.nodes:
                node.start()
            _wait(
                lambda: all(
                    redis.Redis(port=n.port).cluster("info")["cluster_state"] == "ok" for n in cluster.nodes
                ),
                "the cluster to be ok again",
                timeout=30,
            )
            return flushes

        _back_in_time_then_exact(writer, url, namespace, 3, travel)
    finally:
        if writer is not None:
            writer.close()
        cluster.close()
