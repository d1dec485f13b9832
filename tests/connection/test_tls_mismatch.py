"""A TLS mismatch says TLS (issue 50, item 2): ``rediss://`` to a plain server was reported as a
timeout ("raise REDIS_STATS_CONNECT_TIMEOUT_MS"), ``redis://`` to a TLS server as a closed
connection ("is Redis running there?"); the server is now asked which it speaks."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from redis_stats import StatsConfig, StatsReader
from redis_stats.connection import tls_mismatch
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.prometheus.collector import RedisCollector
from redis_stats.tools.cli import main
from redis_stats.tools.embedded import EmbeddedRedis, free_port
from tests.servers import make_certificates


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """A server with a plain port and a TLS port that requires a client certificate."""
    certs = make_certificates(tmp_path_factory.mktemp("certs"))
    server = EmbeddedRedis()
    server.tls_port = free_port()
    server.extra_args = [
        "--tls-port", str(server.tls_port),
        "--tls-cert-file", str(certs["cert"]),
        "--tls-key-file", str(certs["key"]),
        "--tls-ca-cert-file", str(certs["ca"]),
        "--tls-auth-clients", "yes",
    ]  # fmt: skip
    server.start()
    yield server
    server.close()


def inspect(url: str):
    return CliRunner().invoke(
        main, ["inspect", "--redis-url", url], env={"REDIS_STATS_CONNECT_TIMEOUT_MS": "500"}
    )


def test_rediss_to_a_plain_server_says_it_speaks_plain_redis_not_a_timeout(tls_server):
    result = inspect(f"rediss://127.0.0.1:{tls_server.port}/0")
    assert result.exit_code == 1, result.output
    assert "(timeout:" in result.output  # what failed, as before
    assert (
        f"the server at 127.0.0.1:{tls_server.port} speaks plain Redis, not TLS: use redis://"
        in result.output
    )
    assert "CONNECT_TIMEOUT" not in result.output, result.output  # was: raise the timeout


def test_redis_to_a_tls_server_says_it_speaks_tls(tls_server):
    result = inspect(f"redis://127.0.0.1:{tls_server.tls_port}/0")
    assert result.exit_code == 1, result.output
    assert f"the server at 127.0.0.1:{tls_server.tls_port} speaks TLS: use rediss://" in result.output
    assert "is Redis running there?" not in result.output, result.output


def test_no_mismatch_is_claimed_where_there_is_none(tls_server):
    assert tls_mismatch(StatsConfig(url=f"redis://127.0.0.1:{tls_server.port}/0")) is None
    assert tls_mismatch(StatsConfig(url=f"rediss://127.0.0.1:{tls_server.tls_port}/0")) is None
    nobody = free_port()
    assert tls_mismatch(StatsConfig(url=f"rediss://127.0.0.1:{nobody}/0")) is None
    assert tls_mismatch(StatsConfig(url=f"redis://127.0.0.1:{nobody}/0")) is None
    result = inspect(f"redis://127.0.0.1:{nobody}/0")
    assert "is Redis running there?" in result.output  # a refused connection keeps its own hint


def test_the_exporters_outage_log_says_tls_too(tls_server, caplog):
    config = StatsConfig(url=f"rediss://127.0.0.1:{tls_server.port}/0", connect_timeout_ms=300)
    collector = RedisCollector(StatsReader(config, vllm_catalog()))
    with caplog.at_level(logging.WARNING):
        text = collector.render_text()
    assert "redis_stats_up 0" in text
    assert any("speaks plain Redis, not TLS: use redis://" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
