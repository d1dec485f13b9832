"""prometheus_client-shaped classes over a writer (what vLLM's connector metrics are built with).

The same calls go to prometheus_client's own classes and to redis_stats' (two writers, as two API
servers); the Redis view must print every sample prometheus_client prints, with the same value.
Needs no vLLM.
"""

import random

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsReader, StatsWriter
from redis_stats.catalog import Catalog, CatalogError
from redis_stats.integrations.vllm.prom import gauge_mode, metric_classes
from tests.prometheus.test_collector import scrape

LABELS = ["model_name", "engine"]
PER_ENGINE = {0: ["m", "0"], 1: ["m", "1"]}


def define(gauge, counter, histogram):
    """Families shaped as vLLM's connectors define them (OffloadPromMetrics, NIXL, LMCache)."""
    return {
        "bytes": counter(name="vllm:xfer_bytes", documentation="Bytes.", labelnames=LABELS),
        "by_type": counter(
            name="vllm:xfer_total", documentation="By type.", labelnames=[*LABELS, "transfer_type"]
        ),
        "usage": gauge(
            name="vllm:xfer_usage_perc",
            documentation="Usage.",
            labelnames=LABELS,
            multiprocess_mode="mostrecent",
        ),
        "size": histogram(
            name="vllm:xfer_size", documentation="Size.", labelnames=LABELS, buckets=[1e6, 5e6, 10e6, 50e6]
        ),
        "default_buckets": histogram(name="vllm:xfer_seconds", documentation="Time.", labelnames=LABELS),
        "info": gauge(name="vllm:xfer_config_info", documentation="Info.", labelnames=[*LABELS, "backend"]),
    }


def drive(metrics, seed: int, engines=(0, 1)) -> None:
    rng = random.Random(seed)
    bound = {
        name: {e: m.labels(*PER_ENGINE[e]) for e in engines}
        for name, m in metrics.items()
        if name not in ("by_type", "info")
    }
    for e in engines:
        metrics["info"].labels(model_name="m", engine=str(e), backend="cpu").set(1)
    for _ in range(300):
        e = rng.choice(engines)
        bound["bytes"][e].inc(rng.randint(0, 10**6))
        bound["usage"][e].set(rng.random())
        metrics["by_type"].labels(*PER_ENGINE[e], rng.choice(["CPU_to_GPU", "GPU_to_CPU"])).inc(rng.random())
        bound["size"][e].observe(rng.uniform(0, 6e7))
        bound["default_buckets"][e].observe(rng.expovariate(5))


def test_same_calls_give_the_same_samples_as_prometheus_client(config, fake_client):
    registry = prometheus_client.CollectorRegistry()

    def prom(cls):
        return lambda **kw: cls(registry=registry, **kw)

    theirs = define(
        prom(prometheus_client.Gauge), prom(prometheus_client.Counter), prom(prometheus_client.Histogram)
    )
    writers = [
        StatsWriter(config, Catalog(), engines=[0, 1], client=fake_client(), start=False) for _ in range(2)
    ]
    ours = [define(*metric_classes(w)) for w in writers]
    drive(theirs, 1)
    drive(theirs, 2)
    drive(ours[0], 1)
    drive(ours[1], 2)  # the second API server's share; its gauge values are the newest
    for w in writers:
        assert w.flush()
    _, text = scrape(StatsReader(config, Catalog(), client=fake_client()))  # the stored catalogue only
    got = {}
    families = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name] = fam
        for s in fam.samples:
            got[(s.name, tuple(sorted(s.labels.items())))] = s.value
    compared = 0
    for fam in registry.collect():
        assert families[fam.name].type == fam.type, fam.name
        assert families[fam.name].documentation == fam.documentation, fam.name
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key in got, f"missing {key}"
            assert got[key] == pytest.approx(s.value, rel=1e-9), key
            compared += 1
    assert compared > 50
    for w in writers:
        w._closed = True


def test_a_metric_without_an_engine_label_goes_to_the_fallback_engine(config, fake_client):
    writer = StatsWriter(config, Catalog(), engines=[3, 4], client=fake_client(), start=False)
    gauge, counter, _ = metric_classes(writer, fallback_engine=3)
    counter(name="vllm:rejections", documentation="R.", labelnames=["model_name", "reason"]).labels(
        model_name="m", reason="full"
    ).inc(2)
    plain = counter(name="vllm:plain_total", documentation="P.")
    plain.inc()
    plain.inc(4)
    gauge(name="vllm:when", documentation="W.").set_to_current_time()
    assert writer.flush()
    fams, _ = scrape(StatsReader(config, Catalog(), client=fake_client()))
    assert {(s.labels["engine"], s.labels["reason"], s.value) for s in fams["vllm:rejections"].samples} == {
        ("3", "full", 2.0)
    }
    assert [(s.name, s.labels, s.value) for s in fams["vllm:plain"].samples] == [
        ("vllm:plain_total", {"engine": "3"}, 5.0)
    ]
    assert fams["vllm:when"].samples[0].value > 1.7e9
    writer._closed = True


def test_wrong_labels_and_conflicting_definitions_are_refused_like_prometheus_client(config, fake_client):
    writer = StatsWriter(config, Catalog(), engines=[0], client=fake_client(), start=False)
    gauge, counter, _ = metric_classes(writer)
    c = counter(name="vllm:c", documentation="C.", labelnames=LABELS)
    with pytest.raises(ValueError):
        c.labels("m")  # one value short
    with pytest.raises(ValueError):
        c.labels(model_name="m", engine="0", extra="x")
    with pytest.raises(ValueError):
        c.inc()  # a labelled metric is used through labels()
    with pytest.raises(CatalogError):
        c.labels("m", "not-an-engine")
    # The same definition again (a second connector instance) is the same family; another is refused.
    counter(name="vllm:c", documentation="C.", labelnames=LABELS).labels("m", "0").inc()
    with pytest.raises(CatalogError):
        gauge(name="vllm:c", documentation="C.", labelnames=LABELS)
    writer._closed = True


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("mostrecent", "mostrecent"), ("livemostrecent", "mostrecent"), ("sum", "sum"), ("livesum", "sum"),
     ("max", "max"), ("min", "min"), ("all", "mostrecent"), ("liveall", "mostrecent"), (None, "mostrecent")],
)  # fmt: skip
def test_gauge_modes_map_to_redis_stats_roll_ups(mode, expected):
    assert gauge_mode(mode) == expected
