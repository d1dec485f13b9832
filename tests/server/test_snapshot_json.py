"""Values that are not finite: strict JSON in /snapshot, ``+Inf``/``-Inf`` in /metrics."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from redis_stats import Catalog, RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.server import Exporter
from redis_stats.snapshot import EngineSnapshot, HistogramValue, Snapshot, WriterInfo
from tests.server import states


def _refuse(constant: str) -> float:
    raise ValueError(f"{constant} is not JSON (RFC 8259)")


def strict_loads(text: str) -> object:
    """json.loads that refuses Infinity, -Infinity and NaN, as strict parsers do."""
    return json.loads(text, parse_constant=_refuse)


def _catalog() -> Catalog:
    cat = Catalog()
    cat.gauge("g", "A gauge.", labels=["sign"])
    cat.gauge("g_sum_mode", "Summed over writers.", mode="sum")
    cat.histogram("lat", "A histogram.", buckets=[1.0], labels=["sign"])
    return cat


@pytest.fixture
def infinite(redis_server, namespace):
    """A namespace holding +inf and -inf gauges and histogram sums that overflowed to +-inf."""
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    writer = StatsWriter(config, _catalog(), engines=[0], start=False)
    writer.gauge("g").labels(engine=0, sign="pos").set(math.inf)
    writer.gauge("g").labels(engine=0, sign="neg").set(-math.inf)
    writer.gauge("g_sum_mode").labels(engine=0).set(math.inf)
    for _ in range(2):  # each finite, their sum is not: it overflows in Redis
        writer.histogram("lat").labels(engine=0, sign="pos").observe(1e308)
        writer.histogram("lat").labels(engine=0, sign="neg").observe(-1e308)
        assert writer.flush()
    yield config
    writer.close()


def _values(doc: dict, kind: str) -> dict:
    series = doc["engines"]["0"][kind]
    if isinstance(series, dict):  # /snapshot (schema_version 2): by metric name
        series = [s for by_name in series.values() for s in by_name]
    return {tuple(s["labels"].values()): s["value"] for s in series}


def test_snapshot_is_strict_json_with_non_finite_values_as_prometheus_strings(infinite):
    exporter = Exporter(StatsReader(infinite, _catalog()), port=0).start()
    try:
        status, doc = states.snapshot_json(exporter)
        assert status == 200
        text = json.dumps(doc, allow_nan=False)  # raised ValueError before
        with urllib.request.urlopen(f"{exporter.url}/snapshot", timeout=10) as resp:
            served = strict_loads(resp.read().decode())
    finally:
        exporter.close()
    for parsed in (strict_loads(text), served):
        gauges = _values(parsed, "gauges")
        assert gauges[("pos",)] == "+Inf" and gauges[("neg",)] == "-Inf" and gauges[()] == "+Inf"
        hists = _values(parsed, "histograms")
        assert hists[("pos",)]["sum"] == "+Inf" and hists[("neg",)]["sum"] == "-Inf"
        assert hists[("pos",)]["count"] == 2 and hists[("pos",)]["buckets"] == [[1.0, 0.0], ["+Inf", 2.0]]


def test_metrics_text_writes_plus_inf_as_prometheus_client_does(infinite):
    reg = CollectorRegistry()
    reg.register(RedisCollector(StatsReader(infinite, _catalog())))
    slow = generate_latest(reg).decode()
    fast = RedisCollector(StatsReader(infinite, _catalog())).render_text()
    expected = [
        'g{engine="0",sign="pos"} +Inf',
        'g{engine="0",sign="neg"} -Inf',
        'g_sum_mode{engine="0"} +Inf',
        'lat_sum{engine="0",sign="pos"} +Inf',
        'lat_sum{engine="0",sign="neg"} -Inf',
    ]
    for text in (slow, fast):
        lines = text.splitlines()
        assert all(line in lines for line in expected), text


_numbers = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=200, deadline=None)
@given(
    gauge=_numbers,
    counter=_numbers,
    hist_sum=_numbers,
    counts=st.lists(_numbers, min_size=2, max_size=2),
    age=_numbers,
)
def test_to_dict_is_strict_json_for_any_stored_value(gauge, counter, hist_sum, counts, age):
    cat = _catalog()
    cat.counter("c", "A counter.")
    engine = EngineSnapshot(
        engine=0,
        heartbeat=0.0,
        age=age,
        up=True,
        counters={("c", ()): counter},
        gauges={("g", ("x",)): gauge},
        histograms={("lat", ("x",)): HistogramValue((1.0, math.inf), tuple(counts), hist_sum)},
    )
    writers = {"w": WriterInfo(0.0, age, False, True)}
    snap = Snapshot(time=age, engines={0: engine}, writers=writers, catalog=cat)
    doc = strict_loads(json.dumps(snap.to_dict(), allow_nan=False))
    got = doc["engines"]["0"]["gauges"][0]["value"]
    if math.isfinite(gauge):
        assert got == gauge
    else:
        assert got == ("NaN" if math.isnan(gauge) else "+Inf" if gauge > 0 else "-Inf")
