"""The fast text renderer says exactly what the prometheus_client path says, on the same reads."""

import gc
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import Catalog, RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.keys import Keys
from redis_stats.prometheus import exposition

VOLATILE = {
    "redis_stats_read_duration_seconds",
    "redis_stats_engine_data_age_seconds",
    "redis_stats_writer_last_flush_age_seconds",
    "redis_stats_store_used_memory_bytes",
}  # clocks move between the two reads


def parsed(text: str) -> dict:
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in VOLATILE:
            continue
        out[fam.name] = (
            fam.type,
            fam.documentation,
            sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in fam.samples),
        )
    return out


def both(reader) -> tuple[dict, dict]:
    collector = RedisCollector(reader)
    fast = collector.render_text()
    reg = CollectorRegistry()
    reg.register(RedisCollector(reader))
    slow = generate_latest(reg).decode()
    return parsed(fast), parsed(slow)


def test_fast_text_equals_prometheus_client_text(config, catalog, fake_client):
    writers = [
        StatsWriter(config, catalog, engines=[0, 1, 2], client=fake_client(), start=False) for _ in range(2)
    ]
    for i, w in enumerate(writers):
        for e in (0, 1, 2):
            w.counter("requests").labels(engine=e, reason="stop").inc(3 + i)
            w.counter("tokens").labels(engine=e).inc(0.25 * (i + 1))
            for name in ("running", "inflight", "peak", "floor"):
                w.gauge(name).labels(engine=e).set(e * 10 + i)
            h = w.histogram("latency_seconds").labels(engine=e)
            for v in (0.05, 0.3, 0.3, 7):
                h.observe(v * (i + 1))
        assert w.flush()
    client = fake_client()
    keys = Keys(config.namespace)
    client.zadd(keys.engines, {"2": (time.time() - 100) * 1000})  # engine 2 stale: no gauges
    client.hset(keys.counters(0), mapping={"tokens|x": "1", "nosuch": "2", "tokens": "garbage"})
    fast, slow = both(StatsReader(config, catalog, client=fake_client()))
    assert fast == slow
    assert fast["redis_stats_skipped_fields"][2]  # the garbage was counted by both


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    values=st.lists(st.text(st.characters(codec="utf-8"), max_size=12), min_size=1, max_size=4, unique=True)
)
def test_fast_text_escapes_any_label_value_like_prometheus_client(fake_client, namespace, values):
    cat = Catalog()
    cat.counter("c", "help with \\ backslash\nand newline", labels=["a"])
    cat.gauge("g", "g", labels=["a"])
    cfg = StatsConfig(namespace=namespace)
    client = fake_client()
    client.flushall()
    w = StatsWriter(cfg, cat, client=client, start=False)
    for i, v in enumerate(values):
        w.counter("c").labels(engine=0, a=v).inc(i + 1)
        w.gauge("g").labels(engine=0, a=v).set(-i)
    assert w.flush()
    fast, slow = both(StatsReader(cfg, cat, client=fake_client()))
    assert fast == slow


def test_render_plans_are_kept_for_the_engines_and_names_fields_of_the_last_read(
    config, catalog, fake_client
):
    """The renderer kept a plan per engine and names field (~35 KB for a vLLM engine: every line
    prefix and histogram template) and per engine read line by line, and never dropped one: an
    engine gc removed, or a names field no writer holds any more (a writer that restarted with
    its series in another order, or a new label value), stayed until 2 million fields had been
    planned (~1.3 GB). Like the chunk parses, the plans kept are now the last read's."""
    keys = Keys(config.namespace)
    client = fake_client()
    collector = RedisCollector(StatsReader(config, catalog, client=fake_client()))
    traced = tracemalloc.Filter(True, exposition.__file__)

    def held() -> int:
        gc.collect()
        return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([traced]).traces)

    def step(k: int) -> None:
        """Engines 4k..4k+3 (those of step k-1 removed, as gc removes them), each written by a
        new writer whose series come in another order than the last step's (another names
        field); engine 4k+3 has a field of garbage (read line by line)."""
        engines = list(range(4 * k, 4 * k + 4))
        for old in range(4 * k - 4, 4 * k):
            client.zrem(keys.engines, str(old))
            client.delete(keys.counters(old))
        w = StatsWriter(config, catalog, engines=engines, client=fake_client(), start=False)
        for e in engines:
            first, second = ("tokens", "requests") if k % 2 else ("requests", "tokens")
            for name in (first, second):
                labels = {"reason": "stop"} if name == "requests" else {}
                w.counter(name).labels(engine=e, **labels).inc(k + 1)
            w.histogram("latency_seconds").labels(engine=e).observe(0.1 * k)
        assert w.flush()
        w._closed = True
        client.hset(keys.counters(engines[-1]), "nosuch", "1")

    tracemalloc.start()
    try:
        step(0)
        collector.render_text()
        for k in range(1, 30):
            step(k)
            text = collector.render_text()
        assert 'tokens_total{engine="119"} 30\n' in text and 'engine="115"' not in text
        ours = held()
        fresh = RedisCollector(StatsReader(config, catalog, client=fake_client()))
        fresh.render_text()
        both = held()
    finally:
        tracemalloc.stop()
    # What the renderer holds is what a renderer of the same store holds after one read.
    assert ours < 2 * (both - ours), (ours, both - ours)


@pytest.mark.parametrize("writers", [1, 2])  # one writer's stored texts; two writers' ints added up
@pytest.mark.parametrize("value", ["100%", "%s", "%d", "%%", "%(x)s", "{0}", "%"])
def test_a_percent_in_a_histogram_label_value_leaves_every_series_shown(
    fake_client, namespace, value, writers
):
    """Issue 32: the histogram's text was a %-template with the label values in it, so one such
    value failed every read of the namespace: redis_stats_up 0, every series gone."""
    cat = Catalog()
    cat.histogram("h", "h", labels=["a"], buckets=[1.0])
    cat.counter("c", "c")
    cfg = StatsConfig(namespace=namespace)
    for _ in range(writers):
        wr = StatsWriter(cfg, cat, engines=[0, 1], client=fake_client(), start=False)
        wr.histogram("h").labels(engine=0, a=value).observe(0.5)
        wr.histogram("h").labels(engine=1, a="plain").observe(2.0)
        wr.counter("c").labels(engine=1).inc(7)
        assert wr.flush()
    text = RedisCollector(StatsReader(cfg, cat, client=fake_client())).render_text()
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert got[("redis_stats_up", ())] == 1.0
    assert got[("h_bucket", (("a", value), ("engine", "0"), ("le", "1.0")))] == writers
    assert got[("h_count", (("a", value), ("engine", "0")))] == writers
    assert got[("h_sum", (("a", value), ("engine", "0")))] == 0.5 * writers
    assert got[("h_bucket", (("a", "plain"), ("engine", "1"), ("le", "1.0")))] == 0
    assert got[("h_count", (("a", "plain"), ("engine", "1")))] == writers
    assert got[("c_total", (("engine", "1"),))] == 7 * writers
