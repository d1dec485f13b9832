"""Attack: start a host while its Redis Cluster is down. "Start-up does not need Redis": a writer
must be built, record in memory, and deliver everything once the cluster answers, as it does for
every other URL. (redis-py's Cluster client connects when it is built.)"""

from __future__ import annotations

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter

from .conftest import sample_catalog
from .servers import Cluster

pytestmark = pytest.mark.redis_server


def test_a_writer_built_while_the_cluster_is_down_delivers_everything_once_it_is_up(namespace):
    # Before: StatsWriter(...) raised RedisClusterException here (the Cluster client connects when
    # it is built), so the host failed to start because Redis was down.
    cluster = Cluster()  # ports chosen, nothing started yet
    cfg = StatsConfig(url=cluster.url, namespace=namespace, connect_timeout_ms=300, socket_timeout_ms=1000)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    try:
        tokens = writer.counter("tokens").labels(engine=0)
        tokens.inc(40)
        assert not writer.flush()  # counted, not raised
        assert writer.stats.errors
        cluster.start()
        tokens.inc(2)
        assert writer.flush() and not writer.pending()
        snap = StatsReader(cfg, sample_catalog()).snapshot()
        assert snap.engines[0].counter("tokens") == 42
    finally:
        writer.close()
        cluster.close()


def test_close_with_the_cluster_down_is_bounded_and_never_raises(namespace):
    cfg = StatsConfig(url="redis+cluster://127.0.0.1:1,127.0.0.1:2", namespace=namespace, close_timeout=0.3)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0])
    writer.counter("tokens").labels(engine=0).inc(1)
    assert writer.close() is False


@pytest.mark.xfail(
    strict=True,
    reason="StatsReader(...) with a redis+cluster:// URL raises RedisClusterException when no node "
    "answers (the Cluster client connects when built): a view served inside vLLM, or the vLLM plugin's "
    "reporter, stops the host from starting instead of showing redis_stats_up 0",
)
def test_a_reader_built_while_the_cluster_is_down_shows_up_0_then_the_data(namespace):
    from redis_stats.prometheus.collector import RedisCollector

    cluster = Cluster()
    cfg = StatsConfig(url=cluster.url, namespace=namespace, connect_timeout_ms=300, socket_timeout_ms=1000)
    try:
        collector = RedisCollector(StatsReader(cfg, sample_catalog()))
        assert "redis_stats_up 0" in collector.render_text()
        cluster.start()
        writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
        writer.counter("tokens").labels(engine=0).inc(5)
        assert writer.flush()
        writer.close()
        text = collector.render_text()
        assert "redis_stats_up 1" in text and 'tokens_total{engine="0"} 5' in text
    finally:
        cluster.close()


def test_a_cluster_that_cannot_be_reached_is_kind_connection(namespace):
    # Before: kind "other" (redis-py's RedisClusterException is not a RedisError).
    from redis_stats.errors import error_kind

    cfg = StatsConfig(url="redis+cluster://127.0.0.1:1,127.0.0.1:2", namespace=namespace, close_timeout=0.1)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    writer.counter("tokens").labels(engine=0).inc(1)
    assert not writer.flush()
    assert dict(writer.stats.errors) == {"connection": 1}
    with pytest.raises(Exception) as raised:
        StatsReader(cfg, sample_catalog()).snapshot()
    assert error_kind(raised.value) == "connection"
    writer.close()
