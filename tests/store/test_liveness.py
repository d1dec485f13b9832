"""One answer to "is engine N up": every reader judges by what the writers stored, not by a setting
of its own (issue 24). The readers here are configured differently on purpose: top's default
(30 s), a short one, and the exporter's text; they must agree at the same moment."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import redis

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.keys import Keys
from redis_stats.ops.inspection import inspect_namespace
from redis_stats.ops.namespaces import describe_namespaces
from redis_stats.server.states.window import snapshot_document
from tests.conftest import sample_catalog

pytestmark = pytest.mark.redis_server

WRITER_STALE = 1.0  # what the writers declare


def _writer(url: str, namespace: str, engine: int) -> StatsWriter:
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=0.1, stale_after=WRITER_STALE)
    w = StatsWriter(cfg, sample_catalog(), engines=[engine], start=False)
    w.counter("tokens").labels(engine=engine).inc(5)
    w.gauge("running").labels(engine=engine).set(3)
    assert w.flush()
    return w


def _views(url: str, namespace: str) -> dict[str, dict[int, bool]]:
    """Every reader's answer, engine -> up, each reader with its own (different) stale_after."""
    out: dict[str, dict[int, bool]] = {}
    for stale in (30.0, 0.2):  # top's default, and one shorter than the writers'
        cfg = StatsConfig(url=url, namespace=namespace, flush_interval=0.1, stale_after=stale)
        reader = StatsReader(cfg, sample_catalog())
        snap = reader.snapshot()
        out[f"snapshot stale_after={stale}"] = {e: s.up for e, s in snap.engines.items()}
        text = RedisCollector(reader).render_text()
        out[f"/metrics stale_after={stale}"] = {
            int(m[1]): m[2] == "1.0"
            for m in re.finditer(r'redis_stats_engine_up\{engine="(\d+)"\} (\S+)', text)
        }
        reader.close()
    config = StatsConfig(url=url, namespace=namespace, stale_after=30.0)
    lines = list(inspect_namespace(config))
    out["inspect"] = {
        int(m[1]): m[2] == "up" for line in lines if (m := re.match(r"\s+engine (\d+): (up|DOWN),", line))
    }
    return out


def _agree(views: dict[str, dict[int, bool]], expected: dict[int, bool]) -> None:
    wrong = {who: seen for who, seen in views.items() if seen != expected}
    assert not wrong, (expected, wrong)


def test_every_reader_calls_a_killed_engine_down_after_its_writers_stale_after(redis_server, namespace):
    gone, alive = _writer(redis_server.url, namespace, 0), _writer(redis_server.url, namespace, 1)
    _agree(_views(redis_server.url, namespace), {0: True, 1: True})
    # Engine 0's writer is killed (never closes); engine 1's goes on flushing.
    deadline = time.monotonic() + WRITER_STALE + 0.3
    while time.monotonic() < deadline:
        time.sleep(0.1)
        alive.flush()
    _agree(_views(redis_server.url, namespace), {0: False, 1: True})
    [info] = describe_namespaces(
        redis.Redis.from_url(redis_server.url, decode_responses=True), 30.0, [namespace]
    )
    assert (info.engines, info.engines_up, info.writers, info.writers_live) == (2, 1, 2, 1)
    del gone


def test_an_engine_whose_writers_closed_is_down_at_once_and_leaves_the_fleet(redis_server, namespace):
    closing, alive = _writer(redis_server.url, namespace, 0), _writer(redis_server.url, namespace, 1)
    # A second writer of engine 0 (an API server beside the engine core) keeps it up ...
    second = _writer(redis_server.url, namespace, 0)
    closing.close()
    _agree(_views(redis_server.url, namespace), {0: True, 1: True})
    # ... until it closes too: down at once, well within the writers' stale_after.
    started = time.monotonic()
    second.close()
    _agree(_views(redis_server.url, namespace), {0: False, 1: True})
    assert time.monotonic() - started < WRITER_STALE
    reader = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog())
    fleet = snapshot_document(reader.snapshot(), None, requested=60.0)["fleet"]
    assert fleet["engines"] == 2 and fleet["engines_up"] == 1
    assert fleet["gauges"]["running"]["engines"] == 1 and fleet["gauges"]["running"]["sum"] == 3
    assert reader.snapshot().engines[0].counter("tokens") == 10  # its totals stay
    alive.close()


# -- what a writer stored is checked like the writer's own config (issue 32) -------------------

# Stored over each killed writer's own stale_ms (1000: its stale_after of 1 s), engine by engine:
STORED = {
    0: "1e12",  # huge: once borrowed by every writer whose value was garbage or missing
    1: "soon",
    2: "nan",
    3: "-5",
    4: "50",  # below the floor (100 ms)
    5: None,  # missing
    6: "1000",  # usable: the writer's own
    7: "1000",
}


def test_killed_writers_are_judged_by_their_own_value_or_the_one_default_and_gc_agrees(
    redis_server, namespace, python_env, monkeypatch
):
    from redis_stats._core.read import liveness
    from redis_stats.ops.retention import collect_garbage
    from tests.conftest import PYTHON, ROOT

    # The default (30 s, stale_after's) shortened for the test; readers and gc read it alike.
    default = 3.0
    monkeypatch.setattr(liveness, "DEFAULT_MS", default * 1000, raising=False)
    victims = [
        subprocess.Popen(
            [PYTHON, "-m", "tests.helpers.killable_writer", redis_server.url, namespace, str(e)],
            cwd=ROOT,
            env=python_env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for e in STORED
    ]
    ids = dict(zip(STORED, (v.stdout.readline().strip() for v in victims)))
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, stale_after=30.0)
    reader = StatsReader(cfg, sample_catalog())
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = Keys(namespace)
    deadline = time.monotonic() + 10
    while len(reader.snapshot().engines) < len(STORED) and time.monotonic() < deadline:
        time.sleep(0.05)
    for v in victims:
        v.kill()
        v.wait()
    for e, text in STORED.items():
        stats = keys.writer_stats(ids[e])
        if text is None:
            client.hdel(stats, "stale_ms")
        else:
            client.hset(stats, "stale_ms", text)
    judged = {e: (1.0 if e in (6, 7) else default) for e in STORED}
    gc_config = StatsConfig(
        url=redis_server.url, namespace=namespace, retention=0.2, stale_after=0.1, flush_interval=0.1
    )
    wrong: list[str] = []
    seen: dict[int, set[bool]] = {e: set() for e in STORED}
    deadline = time.monotonic() + 3 * default
    while time.monotonic() < deadline:
        snap, load = reader.snapshot(), reader.load()
        removed = set(collect_garbage(gc_config, dry_run=True).writers)
        for e, expected in judged.items():
            age = snap.engines[e].age
            if abs(age - expected) < 0.2:
                continue  # at the boundary: either answer is right
            up = age < expected
            seen[e].add(up)
            live = snap.writers[ids[e]].live
            if (snap.engines[e].up, load.engines[e].up, live) != (up, up, up):
                wrong.append(f"engine {e} ({STORED[e]}) at {age:.1f} s: up {snap.engines[e].up}, live {live}")
            if live and ids[e] in removed:
                wrong.append(
                    f"engine {e} ({STORED[e]}) at {age:.1f} s: gc removes a writer readers call live"
                )
        if all(age > default + 0.3 for age in (snap.engines[e].age for e in STORED)):
            break
        time.sleep(0.1)
    client.close()
    assert not wrong, wrong[:10]
    assert all(s == {True, False} for s in seen.values()), seen  # each seen up, then down


def test_a_live_writer_whose_stored_value_is_below_the_floor_reads_up_in_every_read(redis_server, namespace):
    # 100 ms stored by a writer flushing every 250 ms made it read down in 13 of 20 reads; a value
    # below the floor (100 ms) is not used, nor one below the writer's own flush_ms (test_freshness).
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.25, stale_after=1.0)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0])
    writer.gauge("running").labels(engine=0).set(3)
    reader = StatsReader(cfg, sample_catalog())
    deadline = time.monotonic() + 5
    while 0 not in reader.snapshot().engines and time.monotonic() < deadline:
        time.sleep(0.05)
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.hset(Keys(namespace).writer_stats(writer.writer_id), "stale_ms", "50")
    ups = []
    for _ in range(20):
        snap = reader.snapshot()
        ups.append(snap.engines[0].up and snap.writers[writer.writer_id].live)
        time.sleep(0.05)
    client.close()
    writer.close()
    assert all(ups), f"down in {ups.count(False)} of 20 reads"
