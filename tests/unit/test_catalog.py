import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from redis_stats import Catalog, CatalogError, MetricSpec, RedisCollector, StatsReader, StatsWriter
from redis_stats.keys import Keys

from ..chunked import add_series_line


@pytest.mark.parametrize(
    "make, word",
    [
        (lambda c: c.counter("bad name", "h"), "not a valid Prometheus name"),
        (lambda c: c.counter("x", "h", labels=["engine"]), "added by redis_stats"),
        (lambda c: c.counter("x", "h", labels=["a", "a"]), "declared twice"),
        (lambda c: c.counter("x", "h", labels=["__x"]), "not valid"),
        (lambda c: c.histogram("x", "h", buckets=[]), "at least one"),
        (lambda c: c.histogram("x", "h", buckets=[2, 1]), "strictly increasing"),
        (lambda c: c.histogram("x", "h", buckets=[1, math.nan]), "finite"),
        (lambda c: c.histogram("x", "h", buckets=[1], labels=["le"]), "reserved"),
        (lambda c: c.gauge("x", "h", mode="avg"), "mode"),
    ],
)
def test_bad_definitions_fail_at_definition(make, word):
    with pytest.raises(CatalogError, match=word):
        make(Catalog())


@pytest.mark.parametrize(
    "buckets, named",
    [(["a"], "'a'"), ([None], "None"), ([0.1, "x"], "'x'"), ([True], "True"), ("0.5", "'0.5'")],
)
def test_a_bucket_bound_that_is_not_a_number_is_a_catalog_error_naming_it(buckets, named):
    with pytest.raises(CatalogError) as err:
        Catalog().histogram("latency_seconds", "help", buckets)
    assert "latency_seconds" in str(err.value) and named in str(err.value)
    with pytest.raises(CatalogError, match="latency_seconds"):
        MetricSpec("latency_seconds", "histogram", "help", buckets=buckets)
    # Numbers and number strings (as prometheus_client takes them) stay accepted.
    assert MetricSpec("h", "histogram", "help", buckets=(1, "2.5", "+Inf")).buckets == (1.0, 2.5)


def test_counter_total_suffix_is_stripped_like_prometheus_client():
    spec = Catalog().counter("tokens_total", "h")
    assert spec.name == "tokens"


def test_histogram_inf_bound_is_implied_not_duplicated():
    spec = Catalog().histogram("h", "h", buckets=[1, 2, math.inf])
    assert spec.buckets == (1.0, 2.0)


def test_redefining_differently_is_an_error_identically_is_fine():
    cat = Catalog()
    a = cat.counter("x", "help", labels=["a"])
    assert cat.counter("x", "help", labels=["a"]) is a
    with pytest.raises(CatalogError, match="already defined differently"):
        cat.counter("x", "help", labels=["b"])


def test_unknown_metric_and_wrong_labels_are_clear_errors():
    cat = Catalog()
    cat.counter("x", "h", labels=["reason"])
    with pytest.raises(CatalogError, match="unknown metric 'nope'"):
        cat["nope"]
    with pytest.raises(CatalogError, match=r"missing \['reason'\], unknown \['reasn'\]"):
        cat["x"].label_values({"reasn": "stop"})


def test_spec_json_round_trips():
    for spec in [
        MetricSpec("c", "counter", 'help "quoted"', ("a", "b")),
        MetricSpec("g", "gauge", "h", (), mode="max"),
        MetricSpec("h", "histogram", "h", ("x",), buckets=(0.5, 1.0, 1e6)),
    ]:
        assert MetricSpec.from_json(spec.name, spec.to_json()) == spec


@pytest.mark.parametrize(
    "first, second, sample",
    [
        (lambda c: c.counter("x", "h"), lambda c: c.gauge("x_total", "h"), "x_total"),
        (lambda c: c.gauge("x_total", "h"), lambda c: c.counter("x", "h"), "x_total"),
        (lambda c: c.counter("x", "h"), lambda c: c.gauge("x_created", "h"), "x_created"),
        (lambda c: c.counter("x", "h"), lambda c: c.counter("x_created", "h"), "x_created"),
        (lambda c: c.histogram("h", "h", [1]), lambda c: c.gauge("h_count", "h"), "h_count"),
        (lambda c: c.histogram("h", "h", [1]), lambda c: c.gauge("h_sum", "h"), "h_sum"),
        (lambda c: c.histogram("h", "h", [1]), lambda c: c.counter("h_bucket", "h"), "h_bucket"),
        (lambda c: c.histogram("h", "h", [1]), lambda c: c.counter("h_sum_total", "h"), "h_sum"),
        (lambda c: c.gauge("h_created", "h"), lambda c: c.histogram("h", "h", [1]), "h_created"),
        (lambda c: c.counter("a_count", "h"), lambda c: c.histogram("a", "h", [1]), "a_count"),
    ],
)
def test_metrics_whose_samples_would_share_a_name_are_refused_at_definition(first, second, sample):
    cat = Catalog()
    a = first(cat)
    with pytest.raises(CatalogError) as info:
        second(cat)
    message = str(info.value)
    # Both metrics and the sample name they would both print are named.
    assert repr(a.name) in message and repr(sample) in message and "rename one" in message
    assert list(cat) == [a]  # nothing half-added


def test_names_that_only_look_alike_are_accepted():
    cat = Catalog()
    cat.counter("x", "h")
    cat.gauge("x_totals", "h")
    cat.gauge("xx_total", "h")
    cat.histogram("h", "h", [1])
    cat.gauge("h_counts", "h")
    cat.gauge("h_bucket_size", "h")
    cat.counter("h_seconds", "h")
    assert cat.counter("x_total", "h") is cat["x"]  # the same counter, `_total` stripped
    assert len(cat) == 7


@pytest.mark.parametrize(
    "make",
    [
        lambda c: c.gauge("redis_stats_up", "h"),
        lambda c: c.counter("redis_stats_read_errors", "h", labels=["kind"]),
        lambda c: c.counter("redis_stats_writer_flushes_total", "h"),
        lambda c: c.histogram("redis_stats_writer_flush_duration_seconds", "h", [1]),
        lambda c: c.gauge("redis_stats_anything_new", "h"),
    ],
)
def test_the_self_metrics_prefix_is_reserved(make):
    with pytest.raises(CatalogError, match="'redis_stats_' are reserved"):
        make(Catalog())
    with pytest.raises(CatalogError, match="reserved"):  # nor can a reader load one from Redis
        MetricSpec.from_json("redis_stats_up", '{"kind":"gauge","help":"h","labels":[]}')


def test_the_vllm_catalogue_still_loads():
    from redis_stats.integrations.vllm.catalog import vllm_catalog

    cat = vllm_catalog()
    samples = [s for spec in cat for s in spec.sample_names]
    assert len(cat) > 30 and len(samples) == len(set(samples))


def test_merged_leaves_out_a_stored_spec_that_clashes_and_says_why():
    local = Catalog()
    local.counter("x", "h")
    stored = [
        MetricSpec("x_total", "gauge", "h"),  # clashes with the reader's own counter
        MetricSpec("h_sum", "gauge", "h"),  # clashes with h, first in name order
        MetricSpec("h", "histogram", "h", buckets=(1.0,)),
        MetricSpec("ok", "gauge", "h"),
    ]
    left_out: list[tuple[str, str]] = []
    for order in (stored, stored[::-1]):  # the same result whatever order Redis returns
        left_out.clear()
        merged = local.merged(order, lambda spec, why: left_out.append((spec.name, why)))
        assert sorted(s.name for s in merged) == ["h", "ok", "x"]
        assert sorted(name for name, _ in left_out) == ["h_sum", "x_total"]
        assert all("would both print" in why for _, why in left_out)


def _series_lines(text: str) -> list[str]:
    """Each sample line's name and labels (what must be unique in an exposition)."""
    return [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]


def test_a_reader_never_prints_a_series_twice_when_redis_holds_clashing_names(config, fake_client):
    # Two writers (an older version, another program) each with a valid catalogue of its own,
    # whose union in Redis clashes: counter `x` prints x_total, and so would gauge `x_total`.
    # And a spec named like a self-metric, stored by hand.
    mine, theirs = Catalog(), Catalog()
    mine.counter("x", "h")
    theirs.gauge("x_total", "h")
    theirs.gauge("ok", "h")
    a = StatsWriter(config, mine, engines=[0], client=fake_client(), start=False)
    b = StatsWriter(config, theirs, engines=[0], client=fake_client(), start=False)
    a.counter("x").labels(engine=0).inc(5)
    b.gauge("x_total").labels(engine=0).set(7)
    b.gauge("ok").labels(engine=0).set(1)
    assert a.flush() and b.flush()
    keys, raw = Keys(config.namespace), fake_client()
    raw.hset(keys.meta, "m:redis_stats_up", '{"kind":"gauge","help":"h","labels":[]}')
    raw.hincrby(keys.meta, "_v", 1)
    add_series_line(raw, keys.counters(0), b.writer_id, "redis_stats_up", f"{int(time.time() * 1000)}|0")

    reg = CollectorRegistry()
    reg.register(RedisCollector(StatsReader(config, client=fake_client())))
    slow = generate_latest(reg).decode()
    fast = RedisCollector(StatsReader(config, client=fake_client())).render_text()
    for text in (slow, fast):
        lines = _series_lines(text)
        assert len(lines) == len(set(lines)), text
        assert 'x_total{engine="0"}' in lines and 'ok{engine="0"}' in lines
        assert lines.count("redis_stats_up") == 1
        assert 'redis_stats_skipped_fields{reason="name_clash"}' in lines
    for w in (a, b):
        w._closed = True


_BASES = ["a", "a_total", "a_created", "a_count", "a_sum", "a_bucket", "a_count_total", "a_sum_total"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["counter", "gauge", "histogram"]), st.sampled_from(_BASES))))
def test_a_definition_is_refused_exactly_when_prometheus_client_refuses_to_register_it(definitions):
    import prometheus_client

    cat, registry = Catalog(), prometheus_client.CollectorRegistry()
    make = {
        "counter": lambda name: prometheus_client.Counter(name, "h", registry=registry),
        "gauge": lambda name: prometheus_client.Gauge(name, "h", registry=registry),
        "histogram": lambda name: prometheus_client.Histogram(name, "h", buckets=[1], registry=registry),
    }
    for kind, name in definitions:
        spec = MetricSpec(name, kind, "h", buckets=(1.0,) if kind == "histogram" else ())
        if cat.get(spec.name) == spec:
            continue  # the same definition again: returned, where prometheus_client refuses
        try:
            cat.add(spec)
            ours = True
        except CatalogError:
            ours = False
        try:
            make[kind](name)
            theirs = True
        except ValueError:  # "Duplicated timeseries in CollectorRegistry"
            theirs = False
        assert ours == theirs, (kind, name, [s.name for s in cat])
