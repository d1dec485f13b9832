"""The Prometheus view: exposition text parsed back with prometheus_client's own parser."""

import math

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import Catalog, RedisCollector, StatsReader, StatsWriter
from redis_stats.keys import Keys


def scrape(reader, **kw) -> dict:
    reg = CollectorRegistry()
    reg.register(RedisCollector(reader, **kw))
    text = generate_latest(reg).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def samples(family):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}


@pytest.fixture
def writer(config, catalog, fake_client):
    w = StatsWriter(config, catalog, engines=[0, 1], client=fake_client(), start=False)
    yield w
    w._closed = True


def test_every_kind_is_exposed_with_engine_label(writer, config, catalog, fake_client):
    for engine in (0, 1):
        writer.counter("requests").labels(engine=engine, reason="stop").inc(engine + 1)
        writer.gauge("running").labels(engine=engine).set(10 + engine)
        h = writer.histogram("latency_seconds").labels(engine=engine)
        h.observe(0.2)
        h.observe(7)
    writer.flush()
    fams, _ = scrape(StatsReader(config, catalog, client=fake_client()))
    assert fams["requests"].type == "counter"
    assert samples(fams["requests"]) == {
        ("requests_total", (("engine", "0"), ("reason", "stop"))): 1.0,
        ("requests_total", (("engine", "1"), ("reason", "stop"))): 2.0,
    }
    assert samples(fams["running"]) == {
        ("running", (("engine", "0"),)): 10.0,
        ("running", (("engine", "1"),)): 11.0,
    }
    hist = samples(fams["latency_seconds"])
    for engine in ("0", "1"):
        le = [
            hist[("latency_seconds_bucket", (("engine", engine), ("le", b)))]
            for b in ("0.1", "0.5", "1.0", "5.0", "+Inf")
        ]
        assert le == [0, 1, 1, 1, 2]
        assert hist[("latency_seconds_count", (("engine", engine),))] == 2
        assert hist[("latency_seconds_sum", (("engine", engine),))] == pytest.approx(7.2)
    assert samples(fams["redis_stats_engine_up"]) == {
        ("redis_stats_engine_up", (("engine", "0"),)): 1.0,
        ("redis_stats_engine_up", (("engine", "1"),)): 1.0,
    }
    assert samples(fams["redis_stats_up"]) == {("redis_stats_up", ()): 1.0}


def test_engines_filter_limits_the_view(writer, config, catalog, fake_client):
    writer.counter("tokens").labels(engine=0).inc(1)
    writer.counter("tokens").labels(engine=1).inc(1)
    writer.flush()
    fams, _ = scrape(StatsReader(config, catalog, client=fake_client()), engines=[1])
    assert {s.labels["engine"] for s in fams["tokens"].samples} == {"1"}


def test_redis_error_gives_up_zero_not_an_exception(config, catalog, namespace):
    from redis_stats import StatsConfig

    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace, connect_timeout_ms=50)
    reader = StatsReader(cfg, catalog)
    reg = CollectorRegistry()
    collector = RedisCollector(reader)
    reg.register(collector)
    generate_latest(reg)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert samples(fams["redis_stats_up"]) == {("redis_stats_up", ()): 0.0}
    assert samples(fams["redis_stats_read_errors"]) == {
        ("redis_stats_read_errors_total", (("kind", "connection"),)): 2.0
    }


def test_registering_does_not_read_redis(config, catalog):
    class Exploding(StatsReader):
        def snapshot(self, engines=None):
            raise AssertionError("read at registration")

    reg = CollectorRegistry()
    reg.register(RedisCollector(Exploding(config, catalog, client=redis.Redis(port=1))))


def test_garbage_fields_are_skipped_and_counted(writer, config, catalog, fake_client):
    writer.counter("tokens").labels(engine=0).inc(4)
    writer.flush()
    client = fake_client()
    key = Keys(config.namespace).counters(0)
    # (schema 2: the writer's own "tokens" is a line of its chunk; a base field "tokens" would be
    # a departed writer's part, added to it)
    client.hset(key, mapping={"nosuchmetric": "1", "requests|a|extra": "1"})
    client.hset(key, "tokens|x", "1")
    client.hset(Keys(config.namespace).gauges(0), "running|w", "garbage")
    client.zadd(Keys(config.namespace).engines, {"zero": 1})
    fams, _ = scrape(StatsReader(config, catalog, client=fake_client()))
    assert samples(fams["tokens"]) == {("tokens_total", (("engine", "0"),)): 4.0}
    skipped = {s.labels["reason"]: s.value for s in fams["redis_stats_skipped_fields"].samples}
    assert skipped == {"unknown_metric": 1, "bad_field": 2, "bad_engine": 1}


label_text = st.text(st.characters(codec="utf-8"), max_size=20)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(values=st.lists(st.tuples(label_text, label_text), min_size=1, max_size=5, unique=True))
def test_any_label_values_round_trip_to_the_exposition_text(fake_client, namespace, values):
    from redis_stats import StatsConfig

    cat = Catalog()
    cat.counter("c", "h", labels=["a", "b"])
    cat.histogram("h", "h", buckets=[1.0], labels=["a", "b"])
    cfg = StatsConfig(namespace=namespace)
    client = fake_client()
    client.flushall()
    w = StatsWriter(cfg, cat, client=client, start=False)
    for i, (a, b) in enumerate(values):
        w.counter("c").labels(engine=0, a=a, b=b).inc(i + 1)
        w.histogram("h").labels(engine=0, a=a, b=b).observe(0.5)
    assert w.flush()
    fams, _ = scrape(StatsReader(cfg, cat, client=fake_client()))
    got = {(s.labels["a"], s.labels["b"]): s.value for s in fams["c"].samples}
    assert got == {(a, b): float(i + 1) for i, (a, b) in enumerate(values)}
    counts = {(s.labels["a"], s.labels["b"]) for s in fams["h"].samples if s.name == "h_count"}
    assert counts == set(values)


@given(st.lists(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False), min_size=1, max_size=50))
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_histogram_matches_prometheus_client_for_any_observations(fake_client, namespace, observations):
    from prometheus_client import Histogram

    from redis_stats import StatsConfig

    bounds = [-10.0, 0.0, 0.5, 1.0, 1000.0]
    cat = Catalog()
    cat.histogram("h", "h", buckets=bounds)
    cfg = StatsConfig(namespace=namespace)
    client = fake_client()
    client.flushall()  # one fake server serves every hypothesis example
    w = StatsWriter(cfg, cat, client=client, start=False)
    ours = w.histogram("h").labels(engine=0)
    reg = CollectorRegistry()
    theirs = Histogram("h", "h", buckets=bounds, registry=reg)
    for v in observations:
        ours.observe(v)
        theirs.observe(v)
    w.flush()
    h = StatsReader(cfg, cat, client=fake_client()).snapshot().engines[0].histogram("h")
    expected = {s.labels["le"]: s.value for s in reg.collect().__next__().samples if s.name == "h_bucket"}
    from prometheus_client.utils import floatToGoString

    assert {floatToGoString(b): c for b, c in zip(h.bounds, h.cumulative)} == expected
    assert h.sum == pytest.approx(math.fsum(observations), rel=1e-9, abs=1e-6)
