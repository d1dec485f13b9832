"""Freshness as a contract (issue 34 item 4, issue 32 item 7): each writer records its endpoint
and flush interval; a stored ``stale_ms`` below that writer's own flush interval is not used; one
state per engine (``up``, ``stale``, ``down``) and the newest flush (``seq``) in every view."""

from __future__ import annotations

import json
import sys
import time
import urllib.request

import pytest
import redis

from redis_stats import Catalog, ConfigError, StatsConfig, StatsReader, StatsWriter
from redis_stats.keys import Keys
from redis_stats.load import LoadMap, LoadSource
from redis_stats.ops.retention import collect_garbage
from redis_stats.server import Exporter

pytestmark = pytest.mark.redis_server

LOAD = LoadMap(requests_running=LoadSource("running"), requests_waiting=LoadSource("waiting"))


def catalog() -> Catalog:
    cat = Catalog()
    cat.gauge("running", "Requests running.")
    cat.gauge("waiting", "Requests waiting.")
    return cat


@pytest.fixture
def cfg(redis_server, namespace):
    return StatsConfig(url=redis_server.url, namespace=namespace)


def test_an_endpoint_is_a_short_printable_id():
    assert StatsConfig(endpoint="10.0.0.7:8000").endpoint == "10.0.0.7:8000"
    assert StatsConfig(endpoint="[fd00::7]:8000").endpoint == "[fd00::7]:8000"
    assert StatsConfig.from_env({"REDIS_STATS_ENDPOINT": "pod-a:8000"}).endpoint == "pod-a:8000"
    assert StatsConfig().endpoint is None
    for bad in ("", "a b:80", 'x"y', "a?b", "x" * 129, "é:80"):
        with pytest.raises(ConfigError, match=r"endpoint=.* is not an endpoint id"):
            StatsConfig(endpoint=bad)


def test_readers_see_each_engines_endpoint(cfg):
    a = StatsWriter(cfg.replace(endpoint="10.0.0.7:8000"), catalog(), engines=[0, 1], start=False, load=LOAD)
    b = StatsWriter(cfg.replace(endpoint="10.0.0.8:8000"), catalog(), engines=[2], start=False, load=LOAD)
    for w, engines in ((a, (0, 1)), (b, (2,))):
        for e in engines:
            w.metric("running").labels(e).set(e + 1)
        assert w.flush()
    reader = StatsReader(cfg, catalog())
    snap = reader.snapshot()
    assert {e: s.endpoint for e, s in snap.engines.items()} == {
        0: "10.0.0.7:8000",
        1: "10.0.0.7:8000",
        2: "10.0.0.8:8000",
    }
    load = reader.load()
    assert {e: v.endpoint for e, v in load.engines.items()} == {
        0: "10.0.0.7:8000",
        1: "10.0.0.7:8000",
        2: "10.0.0.8:8000",
    }
    assert snap.to_dict()["engines"]["2"]["endpoint"] == "10.0.0.8:8000"
    a.close()
    b.close()


def test_a_stale_ms_below_the_writers_flush_interval_is_not_used(cfg):
    """Issue 32 item 7: a writer flushing every 250 ms whose stored stale_ms says 100 ms read
    down between two of its own flushes (13 of 20 reads); it is judged by the default now, in
    every read (snapshot, load feed) and by gc."""
    short = cfg.replace(flush_interval=0.25, stale_after=1.0, retention=2.0)
    w = StatsWriter(short, catalog(), engines=[0], load=LOAD)
    w.metric("running").labels(0).set(3)
    assert w.flush()
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    client.hset(Keys(cfg.namespace).writer_stats(w.writer_id), "stale_ms", "100")
    reader = StatsReader(cfg, catalog())
    downs = []
    for _ in range(20):
        time.sleep(0.13)
        snap, load = reader.snapshot(), reader.load()
        downs += [not snap.engines[0].up, not load.engines[0].up, load.engines[0].state == "down"]
    assert not any(downs), f"{sum(downs)} reads of 60 said down"
    assert snap.engines[0].gauge("running") == 3
    # gc judges it by the same rule: a writer live for readers is never removed
    time.sleep(0.3)
    assert w.writer_id not in collect_garbage(short, client=client).writers
    w.close()
    client.close()


def test_one_state_per_engine_up_stale_down_and_the_newest_flush(cfg):
    """up while heartbeats come every flush; stale once one is older than max(2 x flush, flush +
    1 s) (1.2 s at 0.2 s) but within stale_after (3 s); down after that. ``seq`` is the newest
    flush's; /load and /snapshot say the same."""
    quick = cfg.replace(flush_interval=0.2, stale_after=3.0, retention=6.0)
    w = StatsWriter(quick, catalog(), engines=[0], start=False, load=LOAD)
    w.metric("running").labels(0).set(1)
    assert w.flush()
    reader = StatsReader(cfg, catalog())
    first = reader.load().engines[0]
    assert (first.state, first.up) == ("up", True)
    w.metric("running").labels(0).set(2)
    assert w.flush()
    second = reader.load().engines[0]
    assert second.seq is not None and first.seq is not None and second.seq > first.seq
    exporter = Exporter(reader, port=0, load_refresh=0.05).start()
    try:
        time.sleep(1.5)
        load = reader.load().engines[0]
        snap = reader.snapshot().engines[0]
        assert (load.state, load.up, snap.state, snap.up) == ("stale", True, "stale", True)
        assert load.requests_running == 2  # still counted: a stale engine's numbers are shown
        with urllib.request.urlopen(exporter.url + "/load") as r:
            doc = json.load(r)
        assert doc["engines"]["0"]["state"] == "stale" and doc["engines"]["0"]["seq"] == second.seq
        with urllib.request.urlopen(exporter.url + "/snapshot") as r:
            assert json.load(r)["engines"]["0"]["state"] == "stale"
        time.sleep(1.8)
        assert reader.load().engines[0].state == "down"
        assert reader.snapshot().engines[0].state == "down"
        assert w.flush()  # back
        assert reader.load().engines[0].state == "up"
    finally:
        exporter.close()
        w.close()


def test_the_router_example_falls_back_on_stale_engines_and_never_on_down_ones(cfg):
    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "docs" / "examples"))
    try:
        import load_router
    finally:
        sys.path.pop(0)
    quick = cfg.replace(flush_interval=0.2, stale_after=3.0, retention=6.0)
    busy = StatsWriter(quick, catalog(), engines=[0], start=False, load=LOAD)
    idle = StatsWriter(quick, catalog(), engines=[1], start=False, load=LOAD)
    busy.metric("waiting").labels(0).set(9)
    idle.metric("waiting").labels(1).set(1)
    assert busy.flush() and idle.flush()
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05).start()
    try:
        client = load_router.LoadClient(exporter.url)
        assert load_router.pick(client.poll(), client.refreshed) == 1  # fewest waiting
        deadline = time.monotonic() + 1.5  # engine 1 silent past max(2 x 0.2, 0.2 + 1) s: stale
        while time.monotonic() < deadline:
            assert busy.flush()
            time.sleep(0.1)
        doc = client.poll()
        assert (doc["engines"]["0"]["state"], doc["engines"]["1"]["state"]) == ("up", "stale")
        assert load_router.pick(doc, client.refreshed) == 0  # an up engine, though busier
        busy.close()  # closed: down at once
        time.sleep(0.2)
        doc = client.poll()
        assert doc["engines"]["0"]["state"] == "down"
        assert load_router.pick(doc, client.refreshed) == 1  # no engine up: the stale one
        idle.close()
        time.sleep(0.2)
        assert load_router.pick(client.poll(), client.refreshed) is None  # never a down one
    finally:
        exporter.close()
        busy.close()
        idle.close()
