"""Time is a fault like the others (issue 24): Redis going back in time, a writer paused past any
timeout, gc racing a writer that owns an engine it never declared, and host clocks that disagree.
Every case on a real server, counts asserted exact."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from unittest import mock

import pytest
import redis

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsWriter
from redis_stats.keys import Keys
from redis_stats.ops.retention import collect_garbage
from tests.conftest import sample_catalog

pytestmark = pytest.mark.redis_server


def _cfg(url: str, namespace: str, **kw: Any) -> StatsConfig:
    return StatsConfig(url=url, namespace=namespace, **{"flush_interval": 0.05, **kw})


def _keys_of(raw: redis.Redis, namespace: str) -> list[bytes]:
    return list(raw.scan_iter(match=f"rs:{{{namespace}*", count=1000))


def _save(raw: redis.Redis, namespace: str) -> dict[bytes, bytes]:
    """What an RDB taken now would hold of the namespace (every shard: their tags start {NS)."""
    return {k: raw.dump(k) for k in _keys_of(raw, namespace)}


def _restore(raw: redis.Redis, namespace: str, saved: dict[bytes, bytes]) -> None:
    """Redis restarted from that older RDB (or a replica that missed what came after promoted)."""
    for k in _keys_of(raw, namespace):
        raw.delete(k)
    for k, blob in saved.items():
        raw.restore(k, 0, blob)


def _read(url: str, namespace: str, shards: int) -> Any:
    snap = StatsReader(_cfg(url, namespace, shards=shards), sample_catalog()).snapshot()
    assert "bad_chunk" not in snap.skipped, dict(snap.skipped)
    return snap


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("restored", ["older copy", "empty"])
def test_a_store_that_went_back_in_time_is_exact_again_within_two_flushes(
    redis_server, namespace, shards, restored
):
    raw = redis.Redis.from_url(redis_server.url)
    w = StatsWriter(
        _cfg(redis_server.url, namespace, shards=shards), sample_catalog(), engines=[0, 1], start=False
    )
    requests = w.counter("requests")
    requests.labels(engine=0, reason="stop").inc(100)
    requests.labels(engine=1, reason="stop").inc(100)
    assert w.flush()
    saved = _save(raw, namespace) if restored == "older copy" else {}
    # After the copy: engine 0 gets a new series (its chunk's names change), engine 1 only counts.
    requests.labels(engine=0, reason="length").inc(25)
    requests.labels(engine=1, reason="stop").inc(10)
    assert w.flush()
    _restore(raw, namespace, saved)
    for _ in range(2):  # the first finds the store behind and applies nothing; the second restores
        assert w.flush()
    snap = _read(redis_server.url, namespace, shards)
    assert snap.engines[0].counter("requests", "stop") == 100
    assert snap.engines[0].counter("requests", "length") == 25
    assert snap.engines[1].counter("requests", "stop") == 110
    # ... and it stays exact from then on.
    requests.labels(engine=1, reason="stop").inc(1)
    assert w.flush()
    assert _read(redis_server.url, namespace, shards).engines[1].counter("requests", "stop") == 111
    w.close()


def test_an_asyncio_writer_restores_a_store_that_went_back_in_time(redis_server, namespace):
    raw = redis.Redis.from_url(redis_server.url)

    async def main() -> None:
        w = AsyncStatsWriter(_cfg(redis_server.url, namespace), sample_catalog(), engines=[0])
        tokens = w.counter("tokens").labels(engine=0)
        tokens.inc(7)
        assert await w.flush()
        saved = _save(raw, namespace)
        w.counter("requests").labels(engine=0, reason="new").inc(3)
        tokens.inc(5)
        assert await w.flush()
        _restore(raw, namespace, saved)
        assert await w.flush() and await w.flush()
        await w.close()

    asyncio.run(main())
    snap = _read(redis_server.url, namespace, 1)
    assert snap.engines[0].counter("tokens") == 12 and snap.engines[0].counter("requests", "new") == 3


def test_a_writer_paused_past_twice_the_retention_is_counted_exactly_once(redis_server, namespace):
    """gc folds the paused writer; the other writer keeps the engine live. Resumed after twice
    the retention, the paused one must not apply its totals again (160 expected, 260 read)."""
    gc_cfg = _cfg(redis_server.url, namespace, retention=0.3, stale_after=0.15, flush_interval=0.05)
    # Configured as the fleet's gc is: gc removes a writer only once silent for 2 x its stale_after.
    fleet = {"retention": 0.3, "stale_after": 0.15}
    paused = StatsWriter(
        _cfg(redis_server.url, namespace, **fleet), sample_catalog(), engines=[0], start=False
    )
    other = StatsWriter(_cfg(redis_server.url, namespace), sample_catalog(), engines=[0], start=False)
    paused.counter("tokens").labels(engine=0).inc(100)
    other.counter("tokens").labels(engine=0).inc(50)
    assert paused.flush() and other.flush()
    folded_at = None
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # paused: only the other writer flushes; gc every 50 ms
        time.sleep(0.05)
        assert other.flush()
        collect_garbage(gc_cfg)
        seq = redis.Redis.from_url(redis_server.url, decode_responses=True).hgetall(Keys(namespace).seq)
        if folded_at is None and seq.get(paused.writer_id, "").startswith("x"):
            folded_at = time.monotonic()
        if folded_at is not None and time.monotonic() - folded_at > 3 * gc_cfg.retention:
            break  # folded, and past the time a closed writer's tombstone is dropped
    assert folded_at is not None and seq["!folded"]
    paused.counter("tokens").labels(engine=0).inc(10)  # recorded during or after the pause
    assert paused.flush() and paused.flush()
    assert other.flush()
    assert _read(redis_server.url, namespace, 1).engines[0].counter("tokens") == 160
    paused.close()
    other.close()


def test_gc_never_removes_an_engine_a_live_writer_holds_without_declaring_it(redis_server, namespace):
    gc_cfg = _cfg(redis_server.url, namespace, retention=0.2, stale_after=0.1, flush_interval=0.05)
    w = StatsWriter(_cfg(redis_server.url, namespace), sample_catalog(), engines=[0], start=False)
    w.counter("tokens").labels(engine=0).inc(1)
    w.counter("requests").labels(engine=5, reason="stop").inc(40)  # engine 5: never declared
    assert w.flush()
    deadline = time.monotonic() + 0.8  # engine 5 idle for 4 retentions, gc every 50 ms
    while time.monotonic() < deadline:
        time.sleep(0.05)
        assert w.flush()  # heartbeats engine 0 only
        assert 5 not in collect_garbage(gc_cfg).engines
    w.counter("requests").labels(engine=5, reason="stop").inc(2)  # traffic returns: values only
    assert w.flush()
    assert _read(redis_server.url, namespace, 1).engines[5].counter("requests", "stop") == 42
    w.close()


@pytest.mark.parametrize("skew", [30.0, -30.0, 300.0, -300.0])
def test_a_gauge_is_ordered_by_when_it_was_set_whatever_the_writers_clocks(redis_server, namespace, skew):
    """``running`` is a mostrecent gauge: the value set last wins, whichever host's clock is off."""
    a = StatsWriter(_cfg(redis_server.url, namespace), sample_catalog(), engines=[0], start=False)
    b = StatsWriter(_cfg(redis_server.url, namespace), sample_catalog(), engines=[0], start=False)
    assert a.flush() and b.flush()  # both have heard the server's clock once
    real = time.time
    with mock.patch("time.time", lambda: real() + skew):  # a's host clock is off by *skew*
        a.gauge("running").labels(engine=0).set(10)
        assert a.flush()
    time.sleep(0.05)
    b.gauge("running").labels(engine=0).set(3)
    assert b.flush()
    assert _read(redis_server.url, namespace, 1).engines[0].gauge("running") == 3
    with mock.patch("time.time", lambda: real() + skew):
        time.sleep(0.05)
        a.gauge("running").labels(engine=0).set(7)
        assert a.flush()
    assert _read(redis_server.url, namespace, 1).engines[0].gauge("running") == 7
    a.close()
    b.close()


def test_a_writer_closing_right_after_the_store_went_back_in_time_stores_its_state_first(
    redis_server, namespace
):
    raw = redis.Redis.from_url(redis_server.url)
    w = StatsWriter(_cfg(redis_server.url, namespace), sample_catalog(), engines=[0], start=False)
    w.counter("tokens").labels(engine=0).inc(4)
    assert w.flush()
    saved = _save(raw, namespace)
    w.counter("tokens").labels(engine=0).inc(6)
    assert w.flush()
    _restore(raw, namespace, saved)
    assert w.close()  # its last flush finds the store behind: close stores everything, then stops
    assert _read(redis_server.url, namespace, 1).engines[0].counter("tokens") == 10


def test_a_store_found_behind_is_not_counted_as_a_duplicate(redis_server, namespace):
    raw = redis.Redis.from_url(redis_server.url)
    w = StatsWriter(_cfg(redis_server.url, namespace), sample_catalog(), engines=[0], start=False)
    w.counter("tokens").labels(engine=0).inc(1)
    assert w.flush()
    _restore(raw, namespace, {})  # restarted empty
    assert w.flush()  # answered "behind": nothing applied, and not a duplicate either
    assert w.stats.duplicates == 0
    w.close()
