"""Attack: start a host while its Redis Cluster is down. "Start-up does not need Redis": a writer
must be built, record in memory, and deliver everything once the cluster answers, and a reader
(collector, exporter) must serve redis_stats_up 0 then the data, as for every other URL.
(redis-py's sync Cluster client connects when it is built: connection.make_client builds it at
its first command.)"""

from __future__ import annotations

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from tests.conftest import sample_catalog
from tests.servers import Cluster

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
        # As with any URL: the batch that failed goes again (same sequence number), then what was
        # recorded since.
        assert writer.flush()
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


def test_a_reader_built_while_the_cluster_is_down_shows_up_0_then_the_data(namespace):
    # Before: StatsReader(...) raised RedisClusterException (redis-py's Cluster client connects
    # when built): a view served inside vLLM, or the plugin's reporter, stopped the host.
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


def test_an_async_reader_built_while_the_cluster_is_down_reads_once_it_is_up(namespace):
    # redis.asyncio's Cluster client connects at its first command: built while the cluster is
    # down, the reader raises a connection error per read, then reads the data.
    import asyncio

    from redis_stats.aio import AsyncStatsReader
    from redis_stats.errors import error_kind

    cluster = Cluster()
    cfg = StatsConfig(url=cluster.url, namespace=namespace, connect_timeout_ms=300, socket_timeout_ms=1000)

    async def scenario() -> None:
        reader = AsyncStatsReader(cfg, sample_catalog())
        with pytest.raises(Exception) as raised:
            await reader.snapshot()
        assert error_kind(raised.value) == "connection"
        cluster.start()
        writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
        writer.counter("tokens").labels(engine=0).inc(5)
        assert writer.flush()
        writer.close()
        assert (await reader.snapshot()).engines[0].counter("tokens") == 5
        await reader.aclose()

    try:
        asyncio.run(scenario())
    finally:
        cluster.close()


def test_the_lazy_cluster_client_is_built_once_across_threads_and_retried_after_a_failure():
    import threading

    from redis_stats.connection import LazyCluster, is_cluster

    built, fail = [], [True]

    class Fake:
        def get(self, key):
            return f"v:{key}"

        def close(self):
            built.append("closed")

    def build():
        if fail[0]:
            raise ConnectionError("no node answers")
        built.append("built")
        return Fake()

    lazy = LazyCluster(build)
    assert is_cluster(lazy) and lazy.connection_pool is None and built == []  # no I/O yet
    with pytest.raises(ConnectionError):
        lazy.get("k")
    fail[0] = False
    results = []
    threads = [threading.Thread(target=lambda: results.append(lazy.get("k"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["v:k"] * 8 and built == ["built"]
    lazy.close()
    assert built == ["built", "closed"]


def test_the_exporter_command_starts_while_the_cluster_is_down_and_serves_up_0(namespace):
    # Before: `redis-stats exporter` exited 1 at start ("reading redis+cluster://... failed").
    import os
    import subprocess
    import sys
    import urllib.request

    from redis_stats.tools.embedded import free_port

    cluster = Cluster()
    env = {
        **os.environ,
        "REDIS_STATS_URL": cluster.url,
        "REDIS_STATS_NAMESPACE": namespace,
        "REDIS_STATS_CONNECT_TIMEOUT_MS": "200",
    }
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "redis_stats", "exporter", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "serving" in proc.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert "redis_stats_up 0" in resp.read().decode()
    finally:
        proc.terminate()
        proc.wait(10)
        cluster.close()
