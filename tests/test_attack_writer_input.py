"""Attacks on what a writer is built with: a value that can never be sent must be refused where
it enters, never by every flush afterwards (one bad value must not silence a writer)."""

from __future__ import annotations

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.errors import ConfigError

from .conftest import sample_catalog

pytestmark = pytest.mark.redis_server

NEGATIVE_ENGINE_SILENCES = pytest.mark.xfail(
    strict=True,
    reason="StatsWriter(engines=[-1]) is accepted, then every flush of the writer is refused "
    "(bad engine block): nothing it records ever reaches Redis",
)


@NEGATIVE_ENGINE_SILENCES
def test_a_negative_engine_is_refused_at_construction(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    with pytest.raises(ConfigError, match=r"engines.*-1"):
        StatsWriter(cfg, sample_catalog(), engines=[0, -1], start=False)


@pytest.mark.parametrize(
    "engines",
    [
        pytest.param([1.5], marks=pytest.mark.xfail(strict=True, reason="1.5 silently heartbeats engine 1")),
        pytest.param([True], marks=pytest.mark.xfail(strict=True, reason="True heartbeats engine 1")),
        pytest.param(["x"], marks=pytest.mark.xfail(strict=True, reason="a bare ValueError from int()")),
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
