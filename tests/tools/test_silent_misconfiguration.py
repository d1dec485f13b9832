"""Nothing misconfigured stays silent (issue 50, item 2), against a real server: an exporter of a
namespace that holds nothing says so in its log (what the Redis holds, the closest live namespace)
and in a self-metric; a wrong namespace's hint names the closest live namespace, not the
alphabetically first."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.server import Exporter
from redis_stats.server.emptiness import EmptyWatch
from redis_stats.tools.cli import main

pytestmark = pytest.mark.redis_server


def write(url: str, namespace: str, engines: list[int], *, close: bool = False) -> StatsWriter:
    """One flush of *engines* in *namespace*; *close*: its writer closes (its engines down)."""
    writer = StatsWriter(
        StatsConfig(url=url, namespace=namespace), vllm_catalog(), engines=engines, start=False
    )
    for e in engines:
        writer.metric("vllm:num_requests_running").labels(e, model_name="m").set(1)
    assert writer.flush()
    if close:
        writer.close()
    else:
        writer._closed = True  # left live: its heartbeat stays fresh for stale_after
    return writer


@pytest.fixture
def fleet(own_redis_server):
    """A Redis holding 'aaa' (first in order, its engine down), 'llama' (2 engines up), 'zeta'."""
    url = own_redis_server.url
    write(url, "aaa", [0], close=True)
    write(url, "llama", [0, 1])
    write(url, "zeta", [0])
    return url


def test_the_hint_for_a_wrong_namespace_names_the_closest_live_one(fleet):
    result = CliRunner().invoke(main, ["inspect", "--redis-url", fleet, "--namespace", "lama"])
    assert result.exit_code == 3, result.output
    assert "  aaa: 1 engine (0 up)" in result.output and "  llama: 2 engines (2 up)" in result.output
    assert "pass --namespace llama " in result.output, result.output  # was: aaa, alphabetically first


def test_an_exporter_of_an_empty_namespace_says_so_in_its_log_and_its_metrics(fleet, caplog):
    reader = StatsReader(StatsConfig(url=fleet, namespace="lama"), vllm_catalog())
    watch = EmptyWatch(reader, ["lama"], grace=0)
    with caplog.at_level(logging.INFO, logger="redis_stats.exporter"):
        watch.check()
        watch.check()  # once, not at every look
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"namespace 'lama' holds nothing at {fleet}: this exporter serves no engine")
    assert "aaa: 1 engine (0 up)" in said and "llama: 2 engines (2 up)" in said and "zeta: 1 engine" in said
    assert said.endswith(
        "the closest live namespace is 'llama': serve it with --namespace llama (or REDIS_STATS_NAMESPACE)"
    )
    exporter = Exporter(reader, port=0).start()
    try:
        body = urllib.request.urlopen(exporter.url + "/metrics", timeout=10).read().decode()
        assert "\nredis_stats_namespace_empty 1.0\n" in body and "\nredis_stats_up 1.0\n" in body
        caplog.clear()
        write(fleet, "lama", [3])  # the fleet comes: said once, and the metric follows
        with caplog.at_level(logging.INFO, logger="redis_stats.exporter"):
            watch.check()
        assert [r.getMessage() for r in caplog.records] == [
            "namespace 'lama' holds data again: its engines are served"
        ]
        body = urllib.request.urlopen(exporter.url + "/metrics", timeout=10).read().decode()
        assert "\nredis_stats_namespace_empty 0.0\n" in body
    finally:
        exporter.close()


def test_a_namespace_whose_fleet_flushes_within_the_grace_is_never_said_empty(own_redis_server, caplog):
    reader = StatsReader(StatsConfig(url=own_redis_server.url, namespace="starting"), vllm_catalog())
    watch = EmptyWatch(reader, ["starting"], grace=60)
    with caplog.at_level(logging.INFO, logger="redis_stats.exporter"):
        watch.check()  # the exporter started first: empty, but within the grace
        write(own_redis_server.url, "starting", [0])
        watch.check()
    assert not caplog.records


def test_an_empty_redis_is_said_to_hold_no_namespace(own_redis_server, caplog):
    reader = StatsReader(StatsConfig(url=own_redis_server.url, namespace="lama"), vllm_catalog())
    with caplog.at_level(logging.WARNING, logger="redis_stats.exporter"):
        EmptyWatch(reader, ["lama"], grace=0).check()
    (said,) = [r.getMessage() for r in caplog.records]
    assert (
        "and no namespace does: nothing has written to this Redis (check the URL's database number)" in said
    )


def test_an_exporter_of_several_names_the_closest_namespace_it_serves(fleet):
    reader = StatsReader(StatsConfig(url=fleet, namespace="llama"), vllm_catalog())
    for settings in ({"all_namespaces": True}, {"namespaces": ["llama", "zeta"]}):
        exporter = Exporter(reader, port=0, **settings).start()
        try:
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(exporter.url + "/load?namespace=lama", timeout=10)
            body = err.value.read().decode()
            assert err.value.code == 404 and "did you mean 'llama'?" in body, body
        finally:
            exporter.close()
