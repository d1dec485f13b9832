"""Writers' self-metric series stay bounded: every process start is a new writer id, so a
departed writer (closed, or stale) leaves the view at once instead of staying until gc removes it
(the retention, 24 h), and `redis_stats_writers{state}` counts them in 3 series."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsReader, StatsWriter
from redis_stats.keys import Keys
from redis_stats.prometheus.collector import RedisCollector
from tests.prometheus.test_collector import scrape


def writer_ids(families) -> set[str]:
    return {
        s.labels["writer"]
        for f in families
        if f.name.startswith("redis_stats_writer_")
        for s in f.samples
        if "writer" in s.labels
    }


def states(families) -> dict[str, float]:
    (fam,) = [f for f in families if f.name == "redis_stats_writers"]
    return {s.labels["state"]: s.value for s in fam.samples}


def test_restarts_do_not_grow_the_writer_series(config, catalog, fake_client):
    for _ in range(10):  # ten process lifetimes, one after another, each closed cleanly
        w = StatsWriter(config, catalog, engines=[0], client=fake_client(), start=False)
        w.counter("tokens").labels(engine=0).inc()
        assert w.flush() and w.close()
    crashed = StatsWriter(config, catalog, engines=[1], client=fake_client(), start=False)
    assert crashed.flush()
    crashed._closed = True  # killed: no close, and no heartbeat since long enough ago
    old = (time.time() - config.stale_after - 1) * 1000
    fake_client().zadd(Keys(config.namespace).writers, {crashed.writer_id: old})
    live = StatsWriter(config, catalog, engines=[0], client=fake_client(), start=False)
    assert live.flush()
    reader = StatsReader(config, catalog, client=fake_client())
    by_collect, _ = scrape(reader)
    by_text = list(text_string_to_metric_families(RedisCollector(reader).render_text()))
    for families in (list(by_collect.values()), by_text):
        assert writer_ids(families) == {live.writer_id}  # before: all 12 writer ids, for 24 h
        assert states(families) == {"live": 1.0, "stale": 1.0, "closed": 10.0}
    live._closed = True


def test_the_view_says_which_namespace_it_serves_even_with_redis_down(config, catalog, fake_client):
    w = StatsWriter(config, catalog, engines=[0], client=fake_client(), start=False)
    assert w.flush()
    fams, _ = scrape(StatsReader(config, catalog, client=fake_client()))
    (sample,) = fams["redis_stats_namespace_info"].samples
    assert sample.labels == {"redis_stats_namespace": config.namespace} and sample.value == 1.0
    down, _ = scrape(StatsReader(config.replace(url="redis://127.0.0.1:1/0"), catalog))
    assert [s.value for s in down["redis_stats_up"].samples] == [0.0]
    assert [s.labels for s in down["redis_stats_namespace_info"].samples] == [
        {"redis_stats_namespace": config.namespace}
    ]
    w._closed = True
