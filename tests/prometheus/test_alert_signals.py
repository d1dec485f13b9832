"""The self-metrics the alerts read (deploy/prometheus/redis-stats-alerts.yaml) tell what an
operator acts on: an engine killed from one stopped on purpose (``redis_stats_engine_closed``), an
endpoint with no live engine (``redis_stats_endpoint_engines_up``, also across slices), and the
store's memory (``redis_stats_store_*``, for a least-privilege reader too, left out without
``+info``)."""

from __future__ import annotations

import time

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.prometheus.collector import RedisCollector
from redis_stats.reader import EngineSlice
from tests import acl
from tests.conftest import sample_catalog

pytestmark = pytest.mark.redis_server

STALE = 0.5


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def writer(url: str, namespace: str, engines: list[int], endpoint: str | None = None) -> StatsWriter:
    config = StatsConfig(
        url=url, namespace=namespace, flush_interval=0.1, stale_after=STALE, endpoint=endpoint
    )
    made = StatsWriter(config, sample_catalog(), engines=engines, start=False)
    for e in engines:
        made.counter("requests").labels(engine=e, reason="stop").inc()
    assert made.flush()
    return made


def view(url: str, namespace: str, engines=None) -> RedisCollector:
    return RedisCollector(
        StatsReader(StatsConfig(url=url, namespace=namespace), sample_catalog()), engines=engines
    )


def test_an_engine_stopped_on_purpose_is_told_from_one_that_went_silent(redis_server, namespace):
    closed = writer(redis_server.url, namespace, [0])
    killed = writer(redis_server.url, namespace, [1])  # never flushes again: as after SIGKILL
    alive = writer(redis_server.url, namespace, [2])
    closed.close()
    time.sleep(STALE + 0.3)
    assert alive.flush()
    text = view(redis_server.url, namespace).render_text()
    up = samples(text, "redis_stats_engine_up")
    shut = samples(text, "redis_stats_engine_closed")
    assert up == {(("engine", "0"),): 0.0, (("engine", "1"),): 0.0, (("engine", "2"),): 1.0}
    assert shut == {(("engine", "0"),): 1.0, (("engine", "1"),): 0.0, (("engine", "2"),): 0.0}
    # The prometheus_client path says the same.
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(view(redis_server.url, namespace))
    assert samples(generate_latest(registry).decode(), "redis_stats_engine_closed") == shut
    # A closed engine whose process starts again is up, and not "closed" any more.
    again = writer(redis_server.url, namespace, [0])
    text = view(redis_server.url, namespace).render_text()
    assert samples(text, "redis_stats_engine_closed")[(("engine", "0"),)] == 0.0
    assert samples(text, "redis_stats_engine_up")[(("engine", "0"),)] == 1.0
    for w in (killed, alive, again):
        w.close()


def test_an_endpoint_whose_engines_all_went_silent_counts_zero_and_one_stopped_on_purpose_leaves(
    redis_server, namespace
):
    url = redis_server.url
    pod_a = writer(url, namespace, [0, 1], endpoint="10.1.0.7:8000")
    pod_b = writer(url, namespace, [2, 3], endpoint="10.1.0.8:8000")  # killed: never flushes again
    pod_c = writer(url, namespace, [4], endpoint="10.1.0.9:8000")
    pod_c.close()  # scaled in
    time.sleep(STALE + 0.3)
    assert pod_a.flush()
    text = view(url, namespace).render_text()
    assert samples(text, "redis_stats_endpoint_engines_up") == {
        (("endpoint", "10.1.0.7:8000"),): 2.0,
        (("endpoint", "10.1.0.8:8000"),): 0.0,
    }
    # Sliced, each slice counts its own engines: they add up to the endpoint's.
    per_slice = [
        samples(
            view(url, namespace, EngineSlice.parse(f"{i}/2")).render_text(), "redis_stats_endpoint_engines_up"
        )
        for i in range(2)
    ]
    assert per_slice[0][(("endpoint", "10.1.0.7:8000"),)] == 1.0
    assert per_slice[1][(("endpoint", "10.1.0.7:8000"),)] == 1.0
    assert per_slice[0][(("endpoint", "10.1.0.8:8000"),)] == 0.0
    # No endpoint stored by any writer: no family at all.
    bare = f"{namespace}-bare"
    w = writer(url, bare, [0])
    assert "redis_stats_endpoint_engines_up" not in view(url, bare).render_text()
    for made in (pod_a, pod_b, w):
        made.close()


def test_the_store_memory_is_served_to_a_least_privilege_reader_and_left_out_without_info(
    own_redis_server, namespace
):
    url = own_redis_server.url
    admin = redis.Redis.from_url(url, decode_responses=True)
    admin.config_set("maxmemory", "200mb")
    admin.config_set("maxmemory-policy", "allkeys-lru")
    w = writer(url, namespace, [0])
    admin.execute_command(
        "ACL", "SETUSER", "reader", *acl.rules(namespace, "rpw", acl.READER, read_only=True)
    )
    bare = acl.READER.replace(" +info", "")
    admin.execute_command("ACL", "SETUSER", "noinfo", *acl.rules(namespace, "npw", bare, read_only=True))
    port = own_redis_server.port
    text = view(f"redis://reader:rpw@127.0.0.1:{port}/0", namespace).render_text()
    used = samples(text, "redis_stats_store_used_memory_bytes")[()]
    assert 100_000 < used < 200 * 2**20
    assert samples(text, "redis_stats_store_maxmemory_bytes")[()] == 200 * 2**20
    assert samples(text, "redis_stats_store_maxmemory_policy") == {(("policy", "allkeys-lru"),): 1.0}
    assert samples(text, "redis_stats_store_evicted_keys_total") == {(): 0.0}
    # A user without +info: the store's figures are left out, the rest is served.
    text = view(f"redis://noinfo:npw@127.0.0.1:{port}/0", namespace).render_text()
    assert "redis_stats_store_" not in text
    assert samples(text, "redis_stats_up") == {(): 1.0}
    assert samples(text, "redis_stats_engine_up") == {(("engine", "0"),): 1.0}
    w.close()


def test_the_store_memory_is_asked_at_most_every_15_s_whatever_the_scrapes(redis_server, namespace):
    w = writer(redis_server.url, namespace, [0])
    collector = view(redis_server.url, namespace)
    client = collector.reader.client
    calls = []
    real = client.info

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    client.info = counting  # type: ignore[method-assign]
    for _ in range(20):
        assert "redis_stats_store_used_memory_bytes" in collector.render_text()
    assert calls == [("memory",), ("stats",)]
    w.close()
