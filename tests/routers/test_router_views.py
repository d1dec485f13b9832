"""The exporter's views for routers and the tier above (issue 40): ``/v1/loads?endpoint=`` per
rank, ``/v1/loads`` and ``/loads`` for the whole pool (smg #2418's shape, with its ``aggregate``),
and ``/pool``, the pool's averages in llm-d-router's multi-cluster families.

Each body is read as its consumer reads it: the model gateway's by serde's rules
(``tests/smg_decode.py``); ``/pool`` by the multi-cluster extractor's (Prometheus text; per
family the first series, ``Spec.getLatestMetric``, as ``picker_read`` emulates it). Writers of
two pods of two API servers x two engines; engines die and come back."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import load_map_for
from redis_stats.server import Exporter
from tests import smg_decode
from tests.probes import fetch
from tests.server.test_endpoint_views import picker_read

pytestmark = pytest.mark.redis_server

LOAD_MAP = load_map_for(SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=128)))
POOL = ["llm_d_epp_average_kv_cache_utilization", "llm_d_epp_average_queue_size"]


class Pod:
    def __init__(self, cfg: StatsConfig, index: int) -> None:
        self.endpoint = f"10.0.3.{index}:8000"
        config = cfg.replace(endpoint=self.endpoint)
        self.engines = [4 * index + i for i in range(4)]
        cat = vllm_catalog(cache_config_labels=("block_size", "num_gpu_blocks"))
        self.writers = [
            StatsWriter(
                config,
                cat,
                engines=self.engines[2 * i : 2 * i + 2],
                start=False,
                role=f"api{i}",
                load=LOAD_MAP,
            )
            for i in range(2)
        ]
        self.numbers: dict[int, tuple[int, int, float]] = {}

    def record(self, skip: int | None = None) -> None:
        for i, w in enumerate(self.writers):
            if i == skip:
                continue
            for e in self.engines[2 * i : 2 * i + 2]:
                running, waiting, kv = e + 1, e % 3, (e % 4 + 1) / 8
                self.numbers[e] = (running, waiting, kv)
                w.metric("vllm:num_requests_running").labels(e, model_name="m").set(running)
                w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(waiting)
                w.metric("vllm:kv_cache_usage_perc").labels(e, model_name="m").set(kv)
                w.metric("vllm:cache_config_info").labels(e, block_size="16", num_gpu_blocks="100").set(1)
            assert w.flush()

    def close(self, i: int | None = None) -> None:
        for j, w in enumerate(self.writers):
            if i is None or i == j:
                w.close()


@pytest.fixture
def cfg(redis_server, namespace):
    return StatsConfig(url=redis_server.url, namespace=namespace)


def test_v1_loads_per_endpoint_and_for_the_pool_as_the_gateway_reads_them(cfg):
    pods = [Pod(cfg, 1), Pod(cfg, 2)]
    for pod in pods:
        pod.record()
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05).start()
    try:
        for pod in pods:
            verdict, response = smg_decode.probe(
                *fetch(f"{exporter.url}/v1/loads?endpoint={pod.endpoint}", timeout=10)
            )
            assert verdict == "available" and response is not None
            assert [
                (s["dp_rank"], s["num_running_reqs"], s["num_waiting_reqs"]) for s in response["loads"]
            ] == [(r, pod.numbers[e][0], pod.numbers[e][1]) for r, e in enumerate(pod.engines)]
            assert [s["max_running_requests"] for s in response["loads"]] == [128] * 4
        for path in ("/v1/loads?include=core,disagg,queues,memory", "/loads"):
            status, body = fetch(exporter.url + path, timeout=10)
            verdict, response = smg_decode.probe(status, body)
            assert verdict == "available" and response is not None
            doc = json.loads(body)
            assert [(s["worker"], s["dp_rank"]) for s in doc["loads"]] == [
                (pod.endpoint, r) for pod in pods for r in range(4)
            ]
            assert doc["aggregate"]["total_running_reqs"] == sum(
                n[0] for p in pods for n in p.numbers.values()
            )
            assert doc["aggregate"]["total_waiting_reqs"] == sum(
                n[1] for p in pods for n in p.numbers.values()
            )
        # one API server of pod 1 closes: its ranks 0 and 1 leave its document and the fleet's
        pods[0].close(0)
        assert _ranks_when(exporter, pods[0].endpoint, [2, 3])
        doc = json.loads(fetch(exporter.url + "/loads", timeout=10)[1])
        assert doc["ranks_not_reported"] == {pods[0].endpoint: [0, 1]} and doc["dp_rank_count"] == 6
        # unknown endpoint, a bad id, dp_rank without an endpoint: a clear answer, never a 404
        assert fetch(f"{exporter.url}/v1/loads?endpoint=10.9.9.9:1", timeout=10)[0] == 503
        assert fetch(f"{exporter.url}/v1/loads?endpoint=a%20b", timeout=10)[0] == 400
        assert fetch(f"{exporter.url}/v1/loads?dp_rank=1", timeout=10)[0] == 400
        assert fetch(f"{exporter.url}/v1/loads?include=bogus", timeout=10)[0] == 400
    finally:
        exporter.close()
        for pod in pods:
            pod.close()


def _ranks_when(exporter: Exporter, endpoint: str, ranks: list[int]) -> bool:
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        _, response = smg_decode.probe(*fetch(f"{exporter.url}/v1/loads?endpoint={endpoint}", timeout=10))
        if response is not None and [s["dp_rank"] for s in response["loads"]] == ranks:
            return True
        time.sleep(0.05)
    return False


def test_the_pool_averages_are_the_live_engines_means(cfg):
    import time

    pods = [Pod(cfg, 3), Pod(cfg, 4)]
    for pod in pods:
        pod.record()
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05).start()

    def pool() -> dict:
        status, body = fetch(exporter.url + "/pool", timeout=10)
        assert status == 200
        return {k: v[1] for k, v in picker_read(body.decode(), POOL).items()}

    def expected(engines: list[tuple[int, int, float]]) -> dict:
        return {
            POOL[0]: pytest.approx(sum(n[2] for n in engines) / len(engines)),
            POOL[1]: pytest.approx(sum(n[1] for n in engines) / len(engines)),
        }

    try:
        every = [n for p in pods for n in p.numbers.values()]
        assert pool() == expected(every)
        pods[1].close()  # a whole pod gone: the means over the other's engines
        deadline = time.monotonic() + 5
        while pool() != expected(list(pods[0].numbers.values())):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pods[0].close()  # nothing live: no family at all (the extractor records nothing, not 0)
        deadline = time.monotonic() + 5
        while pool():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        exporter.close()
        for pod in pods:
            pod.close()


def test_a_live_engine_without_a_number_withholds_the_family(cfg):
    pod = Pod(cfg, 5)
    pod.record()
    lone = StatsWriter(
        cfg.replace(endpoint="10.0.3.9:8000"), vllm_catalog(), engines=[99], start=False, load=LOAD_MAP
    )
    lone.metric("vllm:num_requests_waiting").labels(99, model_name="m").set(1)  # no KV usage
    assert lone.flush()
    exporter = Exporter(StatsReader(cfg), port=0).start()
    try:
        text = fetch(exporter.url + "/pool", timeout=10)[1].decode()
        kept = picker_read(text, POOL)
        assert POOL[0] not in kept and POOL[1] in kept  # the mean over every live engine, or none
        assert 'redis_stats_pool_withheld{family="llm_d_epp_average_kv_cache_utilization",engine="99"' in text
    finally:
        exporter.close()
        lone.close()
        pod.close()
