import math

import pytest

from redis_stats import Catalog, CatalogError, MetricSpec


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
