"""A slice's or an endpoint's reader and renderer are kept within the view budget and dropped
when idle, whatever a client asks (issue 39 item 2: 1,100 distinct ``?endpoint=`` values took an
exporter from 52 MB to 817 MB, still 824 MB a minute later). The estimates the budget counts
are checked against tracemalloc's measure of the real thing."""

from __future__ import annotations

import gc
import time
import tracemalloc

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter
from redis_stats.server.http import Request
from redis_stats.tools.simulate import SimulatedApiServer

pytestmark = pytest.mark.redis_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def fleet(url: str, namespace: str, endpoints: int, per: int = 4) -> list[StatsWriter]:
    """*endpoints* pods of *per* engines, two API servers each, the full vLLM catalogue."""
    writers = []
    for p in range(endpoints):
        cfg = StatsConfig(url=url, namespace=namespace, endpoint=f"10.0.{p}.1:8000")
        engines = list(range(p * per, p * per + per))
        for w in range(2):
            writer = StatsWriter(
                cfg, vllm_catalog(), engines=engines, start=False, role=f"api{w}", load=VLLM_LOAD
            )
            sims = [SimulatedApiServer(VllmRecorder(writer, MODEL, [e]), e, seed=7 * e + w) for e in engines]
            now = time.monotonic()
            for step in range(10):
                for sim in sims:
                    sim.step(now + step * 0.05)
            assert writer.flush()
            writers.append(writer)
    return writers


def kept(exporter: Exporter, kind: str) -> list:
    return [entry for key, entry in exporter.app.kept if key[0] == kind]


@pytest.fixture
def pods(redis_server, namespace):
    writers = fleet(redis_server.url, namespace, 12)
    yield StatsConfig(url=redis_server.url, namespace=namespace)
    for w in writers:
        w._closed = True


def test_endpoint_views_stay_within_the_budget_and_go_when_idle(pods):
    budget = 2 * 2**20
    exporter = Exporter(
        StatsReader(pods, vllm_catalog()), port=0, roles=VLLM_ROLES, view_budget=budget, view_idle=0.5
    )
    try:
        for _ in range(2):  # every endpoint, twice: each one evicts the oldest kept
            for p in range(12):
                response = exporter.app(Request("GET", "/metrics", f"endpoint=10.0.{p}.1:8000"))
                assert response.status == 200 and b"vllm:num_requests_waiting{" in response.body
                held = sum(e.kept_bytes() for e in kept(exporter, "endpoint_view"))
                assert 0 < held <= budget
        assert 1 < len(kept(exporter, "endpoint_view")) < 12  # some kept, never all of them
        time.sleep(0.6)
        exporter.app.kept.sweep()  # (the exporter's upkeep sweeps every few seconds)
        assert kept(exporter, "endpoint_view") == []
    finally:
        exporter.close()


def _measured(exporter: Exporter, queries: list[str], kind: str) -> tuple[int, int]:
    """(bytes the answers to *queries* left allocated, the kept entries' estimate of them)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for query in queries:
            assert exporter.app(Request("GET", "/metrics", query)).status == 200
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return used, sum(e.kept_bytes() for e in kept(exporter, kind))


def test_the_budget_counts_what_a_view_really_keeps(pods):
    exporter = Exporter(StatsReader(pods, vllm_catalog()), port=0, roles=VLLM_ROLES)
    try:
        exporter.app(Request("GET", "/metrics", "endpoint=10.0.11.1:8000"))  # the process's own caches
        exporter.app.kept.drop()
        used, estimate = _measured(exporter, [f"endpoint=10.0.{p}.1:8000" for p in range(8)], "endpoint_view")
        assert 0.75 * used <= estimate <= 1.5 * used, (used, estimate)
        used, estimate = _measured(exporter, [f"slice={i}/4" for i in range(4)], "slice")
        assert 0.75 * used <= estimate <= 1.5 * used, (used, estimate)
    finally:
        exporter.close()
