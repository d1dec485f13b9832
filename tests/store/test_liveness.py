"""One answer to "is engine N up": every reader judges by what the writers stored, not by a setting
of its own (issue 24). The readers here are configured differently on purpose: top's default
(30 s), a short one, and the exporter's text; they must agree at the same moment."""

from __future__ import annotations

import re
import time

import pytest
import redis

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.ops.inspection import inspect_namespace
from redis_stats.ops.namespaces import describe_namespaces
from redis_stats.prometheus.recent import snapshot_document
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
