"""``GET /v1/loads`` on vLLM's API port (issue 40): SGLang's model gateway's load document, one
entry per data-parallel rank, read exactly as the gateway reads it.

Every body is decoded by ``tests/smg_decode.py``: the struct's field names and types as serde
decodes them (a wrong type fails the whole body, and the gateway then never asks that worker
again), and the gateway's own rules on top (which answers it keeps, which rank its DP-rank cache
picks). Writers of two pods, two API servers of two engines each, through the public API; engines
die (closed, or silent past stale_after) and come back."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.get_load import GetLoadMiddleware
from redis_stats.integrations.vllm.load import load_map_for
from tests import smg_decode
from tests.asgi import asgi_get

pytestmark = pytest.mark.redis_server

LOAD_MAP = load_map_for(SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=64)))
QUERY = "include=core,disagg,queues,memory"  # what the gateway sends (probe_native_loads)


class Pod:
    """One vLLM pod of 4 data-parallel engines: two API-server writers of two engines each."""

    def __init__(self, cfg: StatsConfig, index: int, *, quick: bool = False) -> None:
        self.endpoint = f"10.0.1.{index}:8000"
        config = cfg.replace(endpoint=self.endpoint)
        if quick:
            config = config.replace(flush_interval=0.2, stale_after=1.0)
        self.config = config
        self.engines = [4 * index + i for i in range(4)]
        self.writers = [
            StatsWriter(
                config,
                vllm_catalog(cache_config_labels=("block_size", "num_gpu_blocks")),
                engines=self.engines[2 * i : 2 * i + 2],
                start=False,
                role=f"api{i}",
                load=LOAD_MAP,
            )
            for i in range(2)
        ]
        self.closed: set[int] = set()
        self.truth: dict[int, dict[str, float]] = {}

    def record(self, step: int = 0) -> None:
        """Every live writer's engines: running, waiting, KV usage, the cache config, tokens."""
        for i, writer in enumerate(self.writers):
            if i in self.closed:
                continue
            for e in self.engines[2 * i : 2 * i + 2]:
                running, waiting, kv, blocks = 3 * e + step + 1, (e + step) % 4, (e % 5 + 1) / 8, 1000 + e
                writer.metric("vllm:num_requests_running").labels(e, model_name="m").set(running)
                writer.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(waiting)
                writer.metric("vllm:kv_cache_usage_perc").labels(e, model_name="m").set(kv)
                writer.metric("vllm:cache_config_info").labels(
                    e, block_size="16", num_gpu_blocks=str(blocks)
                ).set(1)
                writer.metric("vllm:prefix_cache_queries").labels(e, model_name="m").inc(400)
                writer.metric("vllm:prefix_cache_hits").labels(e, model_name="m").inc(100 + 10 * (e % 3))
                writer.metric("vllm:generation_tokens").labels(e, model_name="m").inc(50)
                self.truth[e] = {
                    "running": running,
                    "waiting": waiting,
                    "kv": kv,
                    "capacity": 16.0 * blocks,
                    "hit_rate": (100 + 10 * (e % 3)) / 400,
                }
            assert writer.flush()

    def close_writer(self, i: int) -> None:
        self.writers[i].close()
        self.closed.add(i)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


async def inner_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"not here"})


def ask(pod: Pod, query: str = QUERY) -> tuple[int, bytes]:
    """``/v1/loads?<query>`` of the middleware of *pod*'s API server (no answer kept)."""
    app = GetLoadMiddleware(inner_app, config=pod.config, ttl=0)
    status, _, body = asgi_get(app, "/v1/loads", query)
    return status, body


def gateway_reads(pod: Pod) -> dict[str, Any]:
    """What the gateway keeps of *pod*'s answer: it must be "available"."""
    status, body = ask(pod)
    verdict, response = smg_decode.probe(status, body)
    assert verdict == "available", (status, body)
    assert response is not None
    return response


def check_ranks(pod: Pod, response: dict[str, Any], live: list[int]) -> None:
    """Exactly the *live* engines (by their rank in the pod), each field the engine's truth."""
    assert [s["dp_rank"] for s in response["loads"]] == [pod.engines.index(e) for e in live]
    assert response["dp_rank_count"] == len(live)
    for snap, e in zip(response["loads"], live):
        t = pod.truth[e]
        assert snap["num_running_reqs"] == t["running"] and snap["num_waiting_reqs"] == t["waiting"]
        assert snap["num_total_reqs"] == t["running"] + t["waiting"]
        assert snap["token_usage"] == t["kv"]
        assert snap["max_total_num_tokens"] == t["capacity"]
        assert snap["num_used_tokens"] == round(t["kv"] * t["capacity"])
        assert snap["max_running_requests"] == 64
        assert snap["cache_hit_rate"] == pytest.approx(t["hit_rate"], rel=1e-9)
        assert snap["gen_throughput"] > 0
        assert snap["num_waiting_uncached_tokens"] == 0 and snap["utilization"] == 0.0
        assert snap["disagg_mode"] is None  # no disaggregation section: the gateway reads None


@pytest.fixture
def cfg(redis_server, namespace):
    return StatsConfig(url=redis_server.url, namespace=namespace)


def test_each_rank_as_the_gateway_decodes_it_while_engines_die_and_return(cfg):
    pods = [Pod(cfg, 1), Pod(cfg, 2)]
    try:
        for pod in pods:
            pod.record()
        for pod in pods:
            response = gateway_reads(pod)
            check_ranks(pod, response, pod.engines)
            loads = smg_decode.dp_rank_loads(response)
            assert loads == {
                r: round(pod.truth[e]["kv"] * pod.truth[e]["capacity"]) for r, e in enumerate(pod.engines)
            }
            # its DP-rank cache picks the rank with the fewest used tokens
            least = min(pod.engines, key=lambda e: (round(pod.truth[e]["kv"] * pod.truth[e]["capacity"]), e))
            assert smg_decode.lowest_rank(loads) == pod.engines.index(least)
            assert smg_decode.effective_token_usage(response) == pytest.approx(
                sum(pod.truth[e]["kv"] for e in pod.engines) / 4
            )
        # pod 1's first API server closes: its ranks 0 and 1 are not listed (never picked), the
        # others still exact; the mean is over the live ranks only
        pods[0].close_writer(0)
        pods[0].record(step=1)
        response = gateway_reads(pods[0])
        check_ranks(pods[0], response, pods[0].engines[2:])
        assert set(smg_decode.dp_rank_loads(response) or {}) == {2, 3}
        assert json.loads(ask(pods[0])[1])["ranks_down"] == [0, 1]
        # the whole pod down: a 503, which the gateway takes as "ask again", never as "no /v1/loads"
        pods[0].close_writer(1)
        status, body = ask(pods[0])
        assert status == 503 and json.loads(body)["error"] == "endpoint_down"
        assert smg_decode.probe(status, body) == ("inconclusive", None)
        # it comes back (new processes, the same endpoint): every rank again
        back = Pod(cfg, 1)
        pods.append(back)
        back.record(step=2)
        check_ranks(back, gateway_reads(back), back.engines)
        # the other pod never moved
        check_ranks(pods[1], gateway_reads(pods[1]), pods[1].engines)
    finally:
        for pod in pods:
            pod.close()


def test_a_rank_whose_writer_went_silent_leaves_once_past_stale_after(cfg):
    pod = Pod(cfg, 3, quick=True)
    try:
        pod.record()
        deadline = time.monotonic() + 1.6
        while time.monotonic() < deadline:  # writer 1 keeps flushing, writer 0 (ranks 0, 1) is silent
            assert pod.writers[1].flush()
            time.sleep(0.1)
        check_ranks(pod, gateway_reads(pod), pod.engines[2:])
    finally:
        pod.close()


def test_the_query_as_sglang_reads_it_and_never_a_404(cfg):
    pod = Pod(cfg, 4)
    try:
        pod.record()
        for query in ("", "include=core", "include=all", QUERY, "include=core&include=memory"):
            assert smg_decode.probe(*ask(pod, query))[0] == "available", query
        status, body = ask(pod, "include=core,bogus")
        assert status == 400 and "Invalid include sections" in json.loads(body)["detail"]
        status, body = ask(pod, "dp_rank=2")
        assert [s["dp_rank"] for s in smg_decode.decode_response(json.loads(body))["loads"]] == [2]
        status, body = ask(pod, "dp_rank=9")  # SGLang: a rank out of range is an empty list
        assert status == 200 and json.loads(body)["loads"] == []
        status, body = ask(pod, "dp_rank=x")
        assert status == 400 and "not an integer" in json.loads(body)["detail"]
        # an endpoint Redis does not know (yet): 503, never the 404 the gateway remembers for good
        stranger = GetLoadMiddleware(inner_app, config=cfg.replace(endpoint="10.9.9.9:8000"), ttl=0)
        status, _, body = asgi_get(stranger, "/v1/loads", QUERY)
        assert status == 503 and smg_decode.probe(status, body)[0] == "inconclusive"
    finally:
        pod.close()


def test_bodies_stay_decodable_at_the_limits(cfg):
    """Counts past i32 are clamped to it, floats past the range to the largest float: a body the
    gateway cannot decode is one it never asks for again. A count no engine can have (waiting -5)
    is withheld with its reason, never served to a least-loaded policy."""
    config = cfg.replace(endpoint="10.0.1.9:8000")
    writer = StatsWriter(config, vllm_catalog(), engines=[40, 41], start=False, load=LOAD_MAP)
    try:
        writer.metric("vllm:num_requests_running").labels(40, model_name="m").set(1e12)
        writer.metric("vllm:num_requests_waiting").labels(40, model_name="m").set(0)
        writer.metric("vllm:kv_cache_usage_perc").labels(40, model_name="m").set(1.7e308)
        writer.metric("vllm:generation_tokens").labels(40, model_name="m").inc(1e300)
        writer.metric("vllm:num_requests_running").labels(41, model_name="m").set(2)
        writer.metric("vllm:num_requests_waiting").labels(41, model_name="m").set(-5)
        assert writer.flush()
        app = GetLoadMiddleware(inner_app, config=config, ttl=0)
        status, _, body = asgi_get(app, "/v1/loads", QUERY)
        verdict, response = smg_decode.probe(status, body)
        assert verdict == "available" and response is not None
        (snap,) = response["loads"]
        assert (
            snap["dp_rank"] == 0 and snap["num_running_reqs"] == 2**31 - 1 and snap["num_waiting_reqs"] == 0
        )
        assert snap["num_total_reqs"] == 2**31 - 1
        assert snap["max_total_num_tokens"] == 0 and snap["num_used_tokens"] == 0  # capacity unknown
        doc = json.loads(body)
        assert doc["ranks_without_load"] == [1]
        assert doc["withheld"] == {"1": {"requests_waiting": "negative"}}
    finally:
        writer.close()
