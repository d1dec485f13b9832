"""The load lane (issue 40): a writer's router numbers reach Redis between its flushes, by default,
when they change and only then.

Every 10 ms (``LANE_POLL``) the flusher looks at the gauges that feed the load feed (requests
running and waiting, KV usage, ...); the engines whose numbers changed since their last entry are
stored at once, or ``load_interval`` (0.08 s by default) after the lane's last call: a plain
``HSET`` of their entries. Unchanged numbers cost nothing; the flushes still store every entry,
so what Redis lost (a restart, an older RDB) is back within one flush interval. Run against a
private real server (its ``INFO commandstats`` counts the lane's calls)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import redis

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD

pytestmark = pytest.mark.redis_server

SLOW_FLUSH = 5.0  # seconds between flushes: whatever reaches Redis sooner came by the lane


def hset_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_hset", {}).get("calls", 0))


def waiting_in_redis(reader: StatsReader, engine: int) -> float | None:
    return reader.load().engines[engine].requests_waiting


def until(predicate, timeout: float) -> float:
    """Seconds until *predicate* held (polled every 2 ms); AssertionError past *timeout*."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"not within {timeout} s"
        time.sleep(0.002)
    return time.monotonic() - start


@pytest.fixture
def server(own_redis_server):
    return own_redis_server


def writer(server, namespace, **config) -> tuple[StatsWriter, StatsConfig]:
    cfg = StatsConfig(url=server.url, namespace=namespace, flush_interval=SLOW_FLUSH, **config)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0, 1], load=VLLM_LOAD)
    for e in (0, 1):
        w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(0)
        w.metric("vllm:kv_cache_usage_perc").labels(e, model_name="m").set(0.1)
    assert w.flush()
    return w, cfg


def test_by_default_a_change_is_in_redis_within_the_lane_not_the_flush(server, namespace):
    assert StatsConfig().load_interval == 0.08 and StatsConfig().lane_interval == 0.08
    w, cfg = writer(server, namespace)
    reader = StatsReader(cfg)
    try:
        waiting = w.metric("vllm:num_requests_waiting").labels(1, model_name="m")
        took = []
        for n in range(1, 11):
            time.sleep(0.03 * (n % 4))  # changes at odd moments, some right after a lane call
            waiting.set(n)
            took.append(until(lambda n=n: waiting_in_redis(reader, 1) == n, timeout=2.0))
        assert max(took) < 1.0 < SLOW_FLUSH  # the lane's, not a flush's (generous: a loaded machine)
        assert w.stats.flushes == 1
    finally:
        w.close()


def test_numbers_that_do_not_change_cost_redis_nothing(server, namespace):
    """(Before: the lane stored every entry every load_interval, changed or not.)"""
    w, _ = writer(server, namespace, load_interval=0.05)
    client = redis.Redis.from_url(server.url)
    try:
        time.sleep(0.2)  # the lane's first look stores nothing new: the flush stored every entry
        before = hset_calls(client)
        for _ in range(20):  # the same values set again: no change
            w.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(0)
            w.metric("vllm:kv_cache_usage_perc").labels(0, model_name="m").set(math.nan)
            w.metric("vllm:kv_cache_usage_perc").labels(0, model_name="m").set(0.1)
            time.sleep(0.02)
        w.metric("vllm:kv_cache_usage_perc").labels(1, model_name="m").set(math.nan)  # null, once
        time.sleep(0.5)
        assert hset_calls(client) - before <= 2  # the NaN entry once (a NaN never equals itself)
    finally:
        w.close()


def test_changes_faster_than_the_lane_are_coalesced_and_the_last_one_lands(server, namespace):
    w, cfg = writer(server, namespace, load_interval=0.1)
    client = redis.Redis.from_url(server.url)
    reader = StatsReader(cfg)
    kv = w.metric("vllm:kv_cache_usage_perc").labels(0, model_name="m")
    try:
        before, start = hset_calls(client), time.monotonic()
        for i in range(200):  # a change every 5 ms for a second: 200 changes
            kv.set(i / 1000)
            time.sleep(0.005)
        spent = time.monotonic() - start
        until(lambda: reader.load().engines[0].kv_cache_usage == 0.199, timeout=1.0)
        calls = hset_calls(client) - before
        assert calls <= spent / 0.1 + 2  # at most one lane call per load_interval
        assert calls >= spent / 0.1 / 3  # and it kept sending while the numbers moved
    finally:
        w.close()


def test_no_lane_when_it_is_off_or_not_quicker_than_the_flushes(server, namespace):
    for load_interval in (0.0, SLOW_FLUSH, 60.0):
        cfg = StatsConfig(
            url=server.url, namespace=namespace, flush_interval=SLOW_FLUSH, load_interval=load_interval
        )
        assert cfg.lane_interval == 0.0
    w, cfg = writer(server, namespace, load_interval=0.0)
    reader = StatsReader(cfg)
    try:
        w.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(7)
        time.sleep(0.5)
        assert waiting_in_redis(reader, 0) == 0  # only the next flush will carry it
        assert w.flush() and waiting_in_redis(reader, 0) == 7
    finally:
        w.close()


def test_a_redis_restart_loses_nothing_for_longer_than_a_flush(server, namespace):
    """Redis down: the lane's calls fail and are counted, never raised; back empty (a restart
    without data): the next flush stores every entry again, the lane goes on from there."""
    cfg = StatsConfig(url=server.url, namespace=namespace, flush_interval=1.0, stale_after=10.0)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0], load=VLLM_LOAD)
    reader = StatsReader(cfg)
    waiting = w.metric("vllm:num_requests_waiting").labels(0, model_name="m")
    try:
        waiting.set(1)
        assert w.flush()
        server.stop()
        waiting.set(2)
        time.sleep(0.3)
        assert w.stats.errors.get("load_connection", 0) + w.stats.errors.get("load_timeout", 0) >= 1
        server.start()  # empty
        until(
            lambda: reader.load().engines.get(0) is not None and waiting_in_redis(reader, 0) == 2, timeout=5.0
        )
        waiting.set(3)  # the lane again, between flushes
        until(lambda: waiting_in_redis(reader, 0) == 3, timeout=0.9)
    finally:
        w.close()


def test_the_entries_it_stores_are_the_flushs_own(server, namespace):
    """What the lane stores is what a flush stores (the same entry, an age from Redis' clock):
    the reader cannot tell them apart, and a newer writer of the engine still wins mostrecent."""
    w, cfg = writer(server, namespace)
    other = StatsWriter(cfg, vllm_catalog(), engines=[0], role="other", load=VLLM_LOAD, start=False)
    reader = StatsReader(cfg)
    try:
        w.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(4)
        until(lambda: waiting_in_redis(reader, 0) == 4, timeout=1.0)
        load = reader.load().engines[0]
        assert 0 <= load.age_seconds < 0.5 and load.state == "up"
        other.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(9)  # set later: newer
        assert other.flush()
        assert waiting_in_redis(reader, 0) == 9
        w.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(5)  # newer again, by the lane
        until(lambda: waiting_in_redis(reader, 0) == 5, timeout=1.0)
    finally:
        other.close()
        w.close()


def test_the_asyncio_writer_has_the_same_lane(server, namespace):
    async def run() -> list[float]:
        cfg = StatsConfig(url=server.url, namespace=namespace, flush_interval=SLOW_FLUSH)
        w = AsyncStatsWriter(cfg, vllm_catalog(), engines=[0], load=VLLM_LOAD)
        reader = StatsReader(cfg)
        waiting = w.metric("vllm:num_requests_waiting").labels(0, model_name="m")
        waiting.set(0)
        assert await w.flush()
        w.start()
        took = []
        try:
            for n in (3, 4, 5):
                waiting.set(n)
                start = time.monotonic()
                while waiting_in_redis(reader, 0) != n:
                    assert time.monotonic() - start < 2.0
                    await asyncio.sleep(0.005)
                took.append(time.monotonic() - start)
        finally:
            await w.close()
        return took

    assert max(asyncio.run(run())) < 1.0 < SLOW_FLUSH
