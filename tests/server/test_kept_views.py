"""What a request's parameter makes the exporter keep is bounded, whatever a client asks (issue 39
item 2: 1,100 distinct ``?endpoint=`` values took an exporter from 52 MB to 817 MB, still 824 MB
a minute later): an endpoint view keeps nothing (one reader serves them all, reading each
endpoint's engines and their writers only); a slice's reader and renderer are kept within the
view budget and dropped when idle, by an estimate checked against tracemalloc's measure."""

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


def test_an_endpoint_view_keeps_nothing_and_reads_its_engines_writers_only(pods, redis_server):
    import redis

    exporter = Exporter(StatsReader(pods, vllm_catalog()), port=0, roles=VLLM_ROLES)
    client = redis.Redis.from_url(redis_server.url)

    def hgets() -> int:
        return int(client.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))

    try:
        for p in range(12):  # every endpoint once: its plan made
            assert exporter.app(Request("GET", "/metrics", f"endpoint=10.0.{p}.1:8000")).status == 200
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            for p in range(12):
                response = exporter.app(Request("GET", "/metrics", f"endpoint=10.0.{p}.1:8000"))
                assert response.status == 200 and b"vllm:num_requests_waiting{" in response.body
        del response
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert grown < 256 * 1024, grown  # nothing kept per endpoint: each request's memory went
        assert [key for key, _ in exporter.app.kept] == []
        calls = hgets()
        exporter.app(Request("GET", "/metrics", "endpoint=10.0.3.1:8000"))
        # its 2 writers' liveness fields (3 each) and the catalogue's version and shards, not the
        # 24 writers' of the fleet
        assert hgets() - calls <= 2 * 3 + 2
    finally:
        exporter.close()


def test_slices_stay_within_the_budget_and_go_when_idle(pods):
    budget = 3 * 2**20
    exporter = Exporter(StatsReader(pods, vllm_catalog()), port=0, view_budget=budget, view_idle=0.5)
    try:
        for n in (2, 3, 4, 5):
            for i in range(n):
                assert exporter.app(Request("GET", "/metrics", f"slice={i}/{n}")).status == 200
                held = sum(e.kept_bytes() for e in kept(exporter, "slice"))
                assert 0 < held <= budget
        assert 1 < len(kept(exporter, "slice")) < 14  # some kept, never all of them
        time.sleep(0.6)
        exporter.app.kept.sweep()  # (the exporter's upkeep sweeps every few seconds)
        assert kept(exporter, "slice") == []
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


def test_the_budget_counts_what_a_slice_really_keeps(pods):
    exporter = Exporter(StatsReader(pods, vllm_catalog()), port=0, roles=VLLM_ROLES)
    try:
        used, estimate = _measured(exporter, [f"slice={i}/4" for i in range(4)], "slice")
        assert 0.75 * used <= estimate <= 1.5 * used, (used, estimate)
    finally:
        exporter.close()
