"""sglang-router 0.3.2 (the real wheel, from the package index) in front of two stub "vLLM" workers
wrapped in ``SGLangGetLoadMiddleware`` (issue 40).

What that router reads of a worker, in its source (lightseekorg/smg at its 0.3.2 release,
c7f9bf9f5: ``src/core/worker_manager.rs``, ``WorkerManager::parse_load_response``, polled every
``--worker-startup-check-interval`` by its ``LoadMonitor`` for ``power_of_two``): ``GET <worker
URL>/get_load``, a JSON list whose entries' ``num_tokens`` it sums, anything else as -1 (which its
power-of-two reads as the LIGHTEST load). It is older than the model gateway's ``/v1/loads`` (smg
#2152). So the most it can route by is the pod's used KV tokens summed over its ranks: the test
puts 4,000 used tokens behind one pod and 40,000 behind the other in Redis, and its traffic goes
to the light one, and follows when they swap."""

from __future__ import annotations

import time

import pytest

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.get_load import TTL, SGLangGetLoadMiddleware
from redis_stats.integrations.vllm.load import VLLM_LOAD
from tests.routers.procs import Router, StubWorker, router_binary, sent_to

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]


class Pod:
    """Two data-parallel engines behind one stub worker's endpoint, one API-server writer each."""

    def __init__(self, cfg: StatsConfig, worker: StubWorker, first: int) -> None:
        config = cfg.replace(endpoint=f"127.0.0.1:{worker.port}")
        self.engines = [first, first + 1]
        self.writers = [
            StatsWriter(
                config,
                vllm_catalog(cache_config_labels=("block_size", "num_gpu_blocks")),
                engines=[e],
                start=False,
                role=f"api{i}",
                load=VLLM_LOAD,
            )
            for i, e in enumerate(self.engines)
        ]

    def used_tokens(self, total: int) -> None:
        """*total* used KV tokens over the two ranks (each 10,000 blocks of 16 tokens)."""
        for writer, e, share in zip(self.writers, self.engines, (total // 4, total - total // 4)):
            writer.metric("vllm:num_requests_running").labels(e, model_name="m").set(1)
            writer.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(0)
            writer.metric("vllm:kv_cache_usage_perc").labels(e, model_name="m").set(share / 160_000)
            writer.metric("vllm:cache_config_info").labels(e, block_size="16", num_gpu_blocks="10000").set(1)
            assert writer.flush()

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def test_sglang_router_power_of_two_routes_by_each_pods_used_tokens(redis_server, namespace, tmp_path):
    binary = router_binary("sglang-router")
    if binary is None:
        pytest.skip("sglang-router is not installed (the test extra installs 0.3.2 on Linux x86_64/aarch64)")
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    light = StubWorker("light", cfg, SGLangGetLoadMiddleware).start()
    heavy = StubWorker("heavy", cfg, SGLangGetLoadMiddleware).start()
    pods = {"light": Pod(cfg, light, 0), "heavy": Pod(cfg, heavy, 2)}
    pods["light"].used_tokens(4_000)
    pods["heavy"].used_tokens(40_000)
    router = Router([binary, "launch"], [light.url, heavy.url], tmp_path / "router.log", "warn")
    url = router.url

    def polled_after(before: tuple[int, int]) -> None:
        router.wait_polled(lambda: (light.polls, heavy.polls), before, timeout=30, settle=0.3)

    try:
        polled_after((0, 0))
        deadline = time.monotonic() + 30
        while True:  # the router registers its workers in the background, then polls them
            try:
                got = sent_to(url, 40)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "router.log").read_text()
                time.sleep(0.5)
        assert got == {"light": 40}
        assert light.paths["/v1/loads"] == 0  # 0.3.2 never asks for it
        pods["light"].used_tokens(40_000)
        pods["heavy"].used_tokens(4_000)
        time.sleep(TTL)  # the middleware's kept answers have aged out
        polled_after((light.polls, heavy.polls))
        assert sent_to(url, 40) == {"heavy": 40}
    finally:
        router.close()
        light.close()
        heavy.close()
        for pod in pods.values():
            pod.close()
