"""The watch feed's read, made cheaper at fleet size (issue 47, item 4): each load hash field's
engine parsed once, and an engine whose entries were stored again with the same numbers (a
flush of an idle engine: only the stored time moves) not decoded again. Neither may hide a
change: the same events as a read that decodes everything."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.server.states.load_feed import LoadFeed
from redis_stats.server.states.watch_feed import WatchFeed

pytestmark = pytest.mark.redis_server


def feed_of(cfg: StatsConfig) -> tuple[WatchFeed, LoadFeed]:
    reader = StatsReader(cfg)
    load = LoadFeed(reader, refresh=60.0)
    load._refresh_once()
    # What the feed asks of a namespace's source: its reader, the server's budget, its kept entries.
    source = SimpleNamespace(
        reader=reader, options=SimpleNamespace(view_budget=256 << 20), kept=lambda *a, **k: None
    )
    return WatchFeed(source, lambda: load), load  # type: ignore[arg-type]


def events(feed: WatchFeed, since: int) -> list[dict]:
    return [doc for doc in feed.snapshot()["engines"].values() if doc["seq"] > since]


def test_the_same_numbers_stored_again_make_no_event_and_a_change_after_them_does(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=1.0, stale_after=3.0)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0, 1], start=False, load=VLLM_LOAD)
    waiting = [w.metric("vllm:num_requests_waiting").labels(e, model_name="m") for e in (0, 1)]
    for g in waiting:
        g.set(0)
    assert w.flush()
    feed, load = feed_of(cfg)
    try:
        feed._read_once()
        seq = feed.seq
        assert seq == 2
        for _ in range(3):  # stored again, the same numbers: a new stored time only
            time.sleep(0.01)
            assert w.flush()
            feed._read_once()
        assert feed.seq == seq
        waiting[1].set(5)
        assert w.flush()
        feed._read_once()
        assert [(d["engine"], d["requests_waiting"]) for d in events(feed, seq)] == [(1, 5)]
        # A second writer of engine 0 (a field the feed never saw), its entry read before the
        # /load refresh counts it live: its numbers count at the first read after that refresh,
        # its entry unchanged (before: only once its entry changed again, up to a flush later).
        other = StatsWriter(cfg, vllm_catalog(), engines=[0], role="b", start=False, load=VLLM_LOAD)
        other.metric("vllm:num_requests_running").labels(0, model_name="m").set(3)
        assert other.flush()
        seq = feed.seq
        feed._read_once()  # its entry read; not live yet by the last refresh: not counted
        assert events(feed, seq) == []
        load._refresh_once()  # its liveness, as the refresher's next read gives it
        feed._read_once()
        assert [(d["engine"], d["requests_running"]) for d in events(feed, seq)] == [(0, 3)]
        other.close()
    finally:
        w.close()


def test_a_state_change_with_the_same_entries_is_an_event(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.2, stale_after=1.0)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0], start=False, load=VLLM_LOAD)
    w.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(2)
    assert w.flush()
    feed, load = feed_of(cfg)
    try:
        feed._read_once()
        assert feed.snapshot()["engines"]["0"]["state"] == "up"
        time.sleep(0.7)  # silent past max(2 x flush_interval, + 1 s)... stale once 1.2 s old
        deadline = time.monotonic() + 5.0
        while feed.snapshot()["engines"]["0"]["state"] == "up":
            assert time.monotonic() < deadline
            load._refresh_once()
            feed._read_once()
            time.sleep(0.1)
        assert feed.snapshot()["engines"]["0"]["state"] in ("stale", "down")
        assert w.flush()  # back, the same entry's numbers
        load._refresh_once()
        feed._read_once()
        assert feed.snapshot()["engines"]["0"]["state"] == "up"
        assert feed.snapshot()["engines"]["0"]["requests_waiting"] == 2
    finally:
        w.close()


@pytest.mark.slow
def test_the_feed_follows_a_cluster_of_three_shards(namespace):
    """(Before: every read raised on a Cluster, redis-py refusing TIME in a Cluster pipeline: a
    /watch subscriber got the state and then nothing, for ever.)"""
    from tests.servers import Cluster

    cluster = Cluster().start()
    try:
        cfg = StatsConfig(url=cluster.url, namespace=namespace, shards=3, flush_interval=1.0)
        writers = [
            StatsWriter(cfg, vllm_catalog(), engines=[e], role=f"api{e}", start=False, load=VLLM_LOAD)
            for e in range(3)
        ]
        gauges = [
            w.metric("vllm:num_requests_waiting").labels(e, model_name="m") for e, w in enumerate(writers)
        ]
        for g, w in zip(gauges, writers):
            g.set(0)
            assert w.flush()
        feed, _ = feed_of(cfg)
        feed._read_once()
        assert feed.seq == 3
        seq = feed.seq
        for e, (g, w) in enumerate(zip(gauges, writers)):  # one change in each shard
            g.set(10 + e)
            assert w.flush_load()
        feed._read_once()
        assert sorted((d["engine"], d["requests_waiting"]) for d in events(feed, seq)) == [
            (0, 10),
            (1, 11),
            (2, 12),
        ]
        assert all(0 <= d["age_seconds"] < 5 for d in feed.snapshot()["engines"].values())
        for w in writers:
            w.close()
    finally:
        cluster.close()
