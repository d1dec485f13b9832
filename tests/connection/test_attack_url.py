"""Attacks on the Redis URL: a typo in a query parameter must be refused where the URL enters,
not make every flush of a writer (and every read) fail for the life of the process."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsReader, AsyncStatsWriter
from redis_stats.errors import ConfigError
from redis_stats.tools.cli import main
from tests.conftest import sample_catalog

pytestmark = pytest.mark.redis_server


@pytest.mark.parametrize("make", [StatsWriter, StatsReader, AsyncStatsWriter, AsyncStatsReader])
def test_an_unknown_url_query_parameter_is_refused_naming_it(redis_server, namespace, make):
    # Before: accepted; then every flush failed as kind "other" (nothing stored, close reported
    # it lost) and every read raised a bare TypeError.
    with pytest.raises(ConfigError, match="socket_timout"):
        cfg = StatsConfig(url=f"{redis_server.url}?socket_timout=5", namespace=namespace)
        make(cfg, sample_catalog())


def test_known_url_query_parameters_still_work(redis_server, namespace):
    cfg = StatsConfig(url=f"{redis_server.url}?socket_timeout=5&client_name=rs", namespace=namespace)
    w = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    try:
        w.counter("tokens").labels(engine=0).inc(10)
        assert w.flush()
    finally:
        w.close()
    assert StatsReader(cfg, sample_catalog()).snapshot().engines[0].counter("tokens") == 10


@pytest.mark.parametrize("command", [["inspect"], ["gc"], ["top", "--once"], ["exporter", "--port", "0"]])
def test_the_cli_refuses_a_misspelt_query_parameter_as_a_usage_error(redis_server, namespace, command):
    # One line naming the parameter, exit code 2, no traceback and no password.
    url = redis_server.url.replace("redis://", "redis://default:Pw-5ecret@") + "?socket_timout=5"
    env = {"REDIS_STATS_URL": url, "REDIS_STATS_NAMESPACE": namespace}
    result = CliRunner().invoke(main, command, env=env)
    assert result.exit_code == 2, result.output
    assert "socket_timout" in result.output and "Traceback" not in result.output
    assert "Pw-5ecret" not in result.output


@pytest.mark.parametrize(
    ("url", "nodes"),
    [
        # Before: a Cluster host without a port got Sentinel's 26379, so `redis+cluster://n1,n2`
        # connected to no node of the Cluster (each failed flush said "connection", nothing more).
        ("redis+cluster://n1,n2:7000", ["n1:6379", "n2:7000"]),
        ("rediss+cluster://u:p@n1", ["n1:6379"]),
        # An IPv6 host in brackets without a port was refused as "a port that is not a number".
        ("redis+cluster://[::1],[::1]:7001", ["::1:6379", "::1:7001"]),
    ],
)
def test_a_cluster_host_without_a_port_is_on_redis_port_6379(url, nodes):
    from redis_stats.connection import make_async_client

    client = make_async_client(StatsConfig(url=url))
    assert list(client.nodes_manager.startup_nodes) == nodes


def test_a_sentinel_host_without_a_port_is_on_sentinel_port_26379():
    from redis_stats.connection import make_async_client

    master = make_async_client(StatsConfig(url="redis+sentinel://s1,[::1],s2:5000/mymaster"))
    sentinels = master.connection_pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26379, 5000]
