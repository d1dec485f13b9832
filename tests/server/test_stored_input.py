"""What a view reads from the store is input: a name or a declaration it cannot serve is skipped
and counted, never a 400/500 of the whole view, never hiding another namespace's series (issue
39 item 2)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import Catalog, StatsConfig, StatsReader, StatsWriter
from redis_stats.server import Exporter
from redis_stats.tools.cli import main
from tests.server.test_namespaces import get, own_redis, several, write  # noqa: F401

pytestmark = pytest.mark.redis_server


@pytest.mark.parametrize("name", ["a b", "a*", 'a"b', "a\nb", "é"])
def test_a_stored_name_no_config_accepts_is_skipped_and_counted_not_a_400_for_every_model(own_redis, name):  # noqa: F811
    import redis

    writers = [write(own_redis.url, "model-a", 2, 5), write(own_redis.url, "model-b", 1, 7)]
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    client.hset(f"rs:{{{name}}}:v2:meta", "schema", "2")  # a key of this layout, by hand
    exporter = several(own_redis.url, all_namespaces=True)
    try:
        status, text = get(exporter.url, "/metrics")
        assert status == 200, text
        found = {
            s.labels.get("redis_stats_namespace")
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }
        assert {"model-a", "model-b"} <= found and name not in found
        assert 'redis_stats_exporter_namespaces{state="unusable"} 1.0' in text
        status, doc = get(exporter.url, "/namespaces")
        assert status == 200 and '"model-a", "model-b"' in doc and repr(name)[1:-1] not in doc
        assert get(exporter.url, "/healthz")[0] == 200
    finally:
        exporter.close()
        for w in writers:
            w.close()
    # `redis-stats namespaces` lists the two namespaces, and of the prefix no command it refuses
    out = CliRunner().invoke(main, ["namespaces", "--redis-url", own_redis.url]).output
    assert "model-a: " in out and "model-b: " in out
    line = next(line for line in out.splitlines() if "no namespace name" in line)
    assert "gc --namespace" not in line and "redis-cli --scan --pattern" in line


def test_a_namespace_that_only_declares_a_family_with_another_type_never_hides_its_series(own_redis):  # noqa: F811
    # "aaa" sorts first and declares "running" as a counter, with no series of it; "zzz" has
    # gauge series of "running": the whole /metrics serves zzz's series, as a gauge.
    declares = Catalog()
    declares.counter("running", "A counter of the same name, never recorded.")
    declares.counter("tokens", "Generated tokens.")
    config = StatsConfig(url=own_redis.url, namespace="aaa")
    first = StatsWriter(config, declares, engines=[0], start=False)
    first.counter("tokens").labels(engine=0).inc(1)
    assert first.flush()
    second = write(own_redis.url, "zzz", 2, 3)
    exporter = several(own_redis.url, all_namespaces=True)
    try:
        status, text = get(exporter.url, "/metrics")
        assert status == 200
        running = {
            s.labels["engine"]: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "running"
            for s in f.samples
            if s.labels.get("redis_stats_namespace") == "zzz"
        }
        assert running == {"0": 30.0, "1": 31.0}
        assert "# TYPE running gauge" in text and "# TYPE running counter" not in text
        assert 'redis_stats_exporter_family_type_clashes_total{family="running"}' in text
    finally:
        exporter.close()
        first.close()
        second.close()


def test_an_exporter_of_one_namespace_is_not_troubled_by_the_others(own_redis):  # noqa: F811
    import redis

    writer = write(own_redis.url, "mine", 1, 2)
    redis.Redis.from_url(own_redis.url).hset("rs:{a b}:v2:meta", "schema", "2")
    reader = StatsReader(StatsConfig(url=own_redis.url, namespace="mine"))
    exporter = Exporter(reader, port=0).start()
    try:
        assert get(exporter.url, "/metrics")[0] == 200
    finally:
        exporter.close()
        writer.close()
