"""The bridge against a body in vLLM's Rust front end's shape (vllm-rs 0.34: OpenMetrics only,
whatever is asked; tests/helpers/vllm_rs.py says where the shape comes from), issue 40.

vllm-rs runs no Python plugin (it ignores ``--middleware``), so the bridge is how its engines reach
the store: every family exactly, the four families 0.34 adds included, with the vLLM catalogue's
definitions where the shapes match; and, with the load feed's map, its engines' load entries, so
``/load``, ``/get_load`` and ``/v1/loads`` serve a vllm-rs pod as they serve a Python one."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsReader
from redis_stats.integrations.bridge import BridgedSource
from redis_stats.integrations.bridge.fetch import ACCEPT
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.get_load import GetLoadMiddleware
from redis_stats.integrations.vllm.load import VLLM_LOAD
from tests import smg_decode
from tests.asgi import asgi_get
from tests.helpers.vllm_rs import CONTENT_TYPE, Engine, VllmRs

from .compare import get, source_samples, store_samples, store_text

pytestmark = pytest.mark.redis_server

NEW_IN_034 = (
    "vllm:cache_config_info",
    "vllm:engine_sleep_state",
    "vllm:num_requests_kv_fetch_by_stage",
    "vllm:watermark_requests",
)


@pytest.fixture
def front_end():
    server = VllmRs(
        "rs",
        {
            0: Engine(
                running=3, waiting=1, kv_usage=0.25, prompt_tokens=100, prefix_queries=400, prefix_hits=100
            ),
            1: Engine(
                running=7, waiting=0, kv_usage=0.5, num_gpu_blocks=1024, prefix_queries=200, prefix_hits=150
            ),
        },
    ).start()
    yield server
    server.close()


@pytest.mark.parametrize("accept", ["any", "text"])
def test_its_openmetrics_body_is_stored_exactly_with_the_catalogues_definitions(cfg, front_end, accept):
    url = f"http://{front_end.address}/metrics"
    body, content_type = get(url, ACCEPT["text"])
    assert content_type == CONTENT_TYPE and body.endswith(
        b"# EOF\n"
    )  # asked for text: OpenMetrics all the same
    source = BridgedSource(
        url, cfg, engine_label="engine", known=vllm_catalog(), load=VLLM_LOAD, accept=accept
    )
    try:
        for step in range(3):
            front_end.engines[0].generation_tokens += 50 * (step + 1)
            front_end.engines[1].watermarked += step
            assert source.scrape(), source.stats
            want = source_samples(*get(url, ACCEPT["openmetrics"]), engine_label="engine")
            assert store_samples(cfg, engines={"0", "1"}) == want
        stored = {f.name: f for f in text_string_to_metric_families(store_text(cfg))}
        catalog = vllm_catalog()
        for name in NEW_IN_034:
            assert name in stored, name
            if name in catalog:  # shapes match: the catalogue's help text (and gauge mode) kept
                assert stored[name].documentation == catalog[name].help, name
        # the cache configuration's labels are the engine core's: no catalogue can know them
        info = [s for s in stored["vllm:cache_config_info"].samples if s.labels["engine"] == "1"]
        assert info[0].labels["num_gpu_blocks"] == "1024" and info[0].value == 1.0
    finally:
        source.close()


def test_its_engines_have_the_load_feed_and_v1_loads_per_rank(cfg, front_end):
    """The load feed from a bridged vllm-rs: the numbers a router reads, per engine."""
    endpoint = "10.0.2.1:8001"
    config = cfg.replace(endpoint=endpoint)
    url = f"http://{front_end.address}/metrics"
    source = BridgedSource(url, config, engine_label="engine", known=vllm_catalog(), load=VLLM_LOAD)
    try:
        assert source.scrape()
        front_end.engines[0].prefix_queries += 400
        front_end.engines[0].prefix_hits += 100
        assert source.scrape()  # a second scrape: counters moved, rates exist
        view = StatsReader(cfg).load()
        e0, e1 = view.engines[0], view.engines[1]
        assert (e0.requests_running, e0.requests_waiting, e0.kv_cache_usage) == (3, 1, 0.25)
        assert (e1.requests_running, e1.requests_waiting, e1.kv_cache_usage) == (7, 0, 0.5)
        assert e0.kv_cache_capacity_tokens == 2048 * 16 and e1.kv_cache_capacity_tokens == 1024 * 16
        assert e0.prefix_cache_hits_per_second == pytest.approx(e0.prefix_cache_queries_per_second / 4)
        assert e0.endpoint == e1.endpoint == endpoint

        async def inner(scope, receive, send):
            raise AssertionError("answered by the middleware")

        app = GetLoadMiddleware(inner, config, ttl=0)
        status, _, body = asgi_get(app, "/v1/loads", "include=core")
        verdict, response = smg_decode.probe(status, body)
        assert verdict == "available" and response is not None
        assert [(s["dp_rank"], s["num_running_reqs"], s["num_used_tokens"]) for s in response["loads"]] == [
            (0, 3, 2048 * 16 // 4),
            (1, 7, 1024 * 16 // 2),
        ]
        assert json.loads(body)["loads"][0]["cache_hit_rate"] == pytest.approx(0.25)
    finally:
        source.close()
