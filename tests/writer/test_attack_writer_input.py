"""Attacks on what a writer is built with: a value that can never be sent must be refused where
it enters, never by every flush afterwards (one bad value must not silence a writer)."""

from __future__ import annotations

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.errors import ConfigError
from tests.conftest import sample_catalog

pytestmark = pytest.mark.redis_server


def test_a_negative_engine_is_refused_at_construction(redis_server, namespace):
    # Before: accepted, then every flush was refused ("bad engine block"): nothing it recorded
    # ever reached Redis, and close() reported it all lost.
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    with pytest.raises(ConfigError, match=r"engines.*-1"):
        StatsWriter(cfg, sample_catalog(), engines=[0, -1], start=False)


@pytest.mark.parametrize(
    "engines",
    [
        pytest.param([1.5], id="float (was heartbeating engine 1)"),
        pytest.param([True], id="bool (was heartbeating engine 1)"),
        pytest.param(["x"], id="str (was a bare ValueError from int())"),
        pytest.param([None], id="None"),
    ],
)
def test_an_engine_that_is_not_an_integer_is_refused_naming_it(redis_server, namespace, engines):
    # labels(engine=...) refuses these with a clear error; the constructor should as well.
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    with pytest.raises(ConfigError, match="engines"):
        StatsWriter(cfg, sample_catalog(), engines=engines, start=False)


def test_valid_engines_still_work_and_store_exactly(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    w = StatsWriter(cfg, sample_catalog(), engines=[0, 2**40], start=False)
    try:
        w.counter("tokens").labels(engine=2**40).inc(7)
        assert w.flush()
    finally:
        w.close()
    snap = StatsReader(cfg, sample_catalog()).snapshot()
    assert sorted(snap.engines) == [0, 2**40]
    assert snap.engines[2**40].counter("tokens") == 7
