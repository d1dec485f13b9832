"""Where the plugin serves the Redis view (REDIS_STATS_PORT / REDIS_STATS_ADDR); needs no vLLM."""

import urllib.error
import urllib.request

import pytest

from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.serve import maybe_serve


@pytest.fixture
def serve(monkeypatch, config):
    started = []

    def run(**env):
        for key in ("REDIS_STATS_PORT", "REDIS_STATS_ADDR"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        exporter = maybe_serve(config, vllm_catalog())
        if exporter is not None:
            started.append(exporter)
        return exporter

    yield run
    for exporter in started:
        exporter.close()


def test_without_a_port_nothing_is_served(serve):
    assert serve() is None


def test_the_view_is_on_loopback_unless_an_address_is_given(serve):
    exporter = serve(REDIS_STATS_PORT="0")
    assert exporter._server.server_address[0] == "127.0.0.1"
    # It answers there (the reader cannot reach Redis: /healthz says so, the server still serves).
    try:
        status = urllib.request.urlopen(exporter.url + "/healthz", timeout=10).status
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status in (200, 503)


def test_an_explicit_address_opts_in_to_other_interfaces(serve):
    exporter = serve(REDIS_STATS_PORT="0", REDIS_STATS_ADDR="0.0.0.0")
    assert exporter._server.server_address[0] == "0.0.0.0"


def test_a_taken_port_is_left_to_the_process_that_has_it(serve):
    first = serve(REDIS_STATS_PORT="0")
    assert serve(REDIS_STATS_PORT=str(first.port)) is None


@pytest.mark.parametrize("port", ["abc", "9400x", "70000", "-1"])
def test_a_port_that_is_not_a_port_number_is_refused_naming_the_variable(serve, port):
    from redis_stats.config import ConfigError

    # Before: int("abc") raised a bare ValueError ("invalid literal for int()") into vLLM's
    # start, and 70000 an OverflowError from bind(), neither naming the variable.
    with pytest.raises(ConfigError, match=rf"REDIS_STATS_PORT='{port}' is not a port number \(0-65535\)"):
        serve(REDIS_STATS_PORT=port)


@pytest.mark.parametrize("addr", ["no-such-host.invalid", "192.0.2.1"])
def test_an_address_that_cannot_be_bound_is_refused_not_taken_for_a_busy_port(serve, addr):
    from redis_stats.config import ConfigError

    # Before: any OSError meant "another process serves the view": a typo in REDIS_STATS_ADDR (an
    # unknown name, an address of no interface of this host) turned the view off with a DEBUG line.
    with pytest.raises(ConfigError, match=rf"cannot serve the Redis view on REDIS_STATS_ADDR={addr}"):
        serve(REDIS_STATS_PORT="0", REDIS_STATS_ADDR=addr)
