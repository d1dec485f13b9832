"""The snapshot API's arithmetic (what routers and autoscalers compute from two reads), with no
Redis: rates across a reset, recent histograms, quantiles as Prometheus interpolates them."""

import json
import math

import pytest

from redis_stats import Catalog, EngineSnapshot, HistogramValue, Snapshot

INF = math.inf


def _snap(time: float, tokens: dict[int, float], hist: HistogramValue | None = None) -> Snapshot:
    engines = {}
    for e, v in tokens.items():
        engine = EngineSnapshot(e, time, 0.0, True)
        engine.counters[("tokens", ("m",))] = v
        if hist is not None:
            engine.histograms[("latency", ("m",))] = hist
        engines[e] = engine
    return Snapshot(time, engines, {}, Catalog())


def test_rate_sums_engines_and_counts_a_reset_from_zero():
    before = _snap(100.0, {0: 50.0, 1: 1000.0})
    after = _snap(110.0, {0: 150.0, 1: 20.0})  # engine 1's Redis lost its data: 20 since the reset
    assert after.rate(before, "tokens", "m", engine=0) == pytest.approx(10.0)
    assert after.rate(before, "tokens", "m") == pytest.approx((100.0 + 20.0) / 10)
    assert after.total("tokens", "m") == 170.0
    assert after.rate(after, "tokens", "m") == 0.0  # no time passed: no division by zero


def test_quantile_interpolates_within_a_bucket_like_histogram_quantile():
    h = HistogramValue((0.1, 1.0, INF), (10.0, 30.0, 40.0), 25.0)
    assert h.count == 40.0
    assert h.quantile(0.25) == pytest.approx(0.1)  # the 10th observation: the first bucket's top
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.9 * (20 - 10) / 20)
    assert h.quantile(0.99) == 1.0  # in the +Inf bucket: the highest finite bound
    assert math.isnan(HistogramValue((0.1, INF), (0.0, 0.0), 0.0).quantile(0.5))
    with pytest.raises(ValueError, match="between 0 and 1"):
        h.quantile(1.5)


def test_histogram_since_is_the_observations_between_two_reads():
    early = HistogramValue((0.1, 1.0, INF), (10.0, 30.0, 40.0), 25.0)
    late = HistogramValue((0.1, 1.0, INF), (10.0, 35.0, 50.0), 40.0)
    before, after = _snap(100.0, {0: 0.0}, early), _snap(110.0, {0: 0.0}, late)
    recent = after.histogram_since(before, "latency", "m", engine=0)
    assert recent == HistogramValue((0.1, 1.0, INF), (0.0, 5.0, 10.0), 15.0)


def test_to_dict_is_strict_json_whatever_the_values():
    snap = _snap(100.0, {0: INF}, HistogramValue((0.1, INF), (0.0, 0.0), math.nan))
    snap.engines[0].gauges[("running", ("m",))] = -INF
    json.dumps(snap.to_dict(), allow_nan=False)  # raises on NaN or infinities
