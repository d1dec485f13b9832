"""KEDA's ``prometheus`` trigger of deploy/kubernetes/keda/prometheus, against a real Prometheus.

Started here, on loopback and stopped by pid: a private redis-server (the session's), writers of a
simulated vLLM fleet (the vLLM catalogue, flushing every 0.25 s), one exporter of it and one of two
models, and Prometheus scraping them every second under the job name the ServiceMonitor gives
(``jobLabel``: ``redis-stats-exporter``). The ScaledObject's own ``query`` and ``threshold`` run as
KEDA's scaler runs them (``GET /api/v1/query?query=...&time=now``; exactly one element, else an
error; no element is 0 unless ``ignoreNullValues: "false"``, then an error; NaN or an infinity an
error): the value is the live engines' waiting requests, exactly, while an engine dies; with the
exporter of two models and ``redis_stats_namespace`` added to the selector, each model's own.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.server import Exporter

from ..conftest import ROOT
from .prometheus import Fleet, get, needs_prometheus

pytestmark = [pytest.mark.e2e, pytest.mark.redis_server, pytest.mark.slow]

SCALED_OBJECT = ROOT / "deploy" / "kubernetes" / "keda" / "prometheus" / "scaledobject.yaml"
JOB = "redis-stats-exporter"


class KedaError(AssertionError):
    """What KEDA's prometheus scaler returns as an error (the fallback then counts a failure)."""


def trigger() -> dict[str, str]:
    (trig,) = yaml.safe_load(SCALED_OBJECT.read_text())["spec"]["triggers"]
    assert trig["type"] == "prometheus"
    return trig["metadata"]


def keda_query(base: str, meta: dict[str, str], query: str | None = None) -> float:
    """One poll of KEDA's prometheus scaler (prometheus_scaler.go, ExecutePromQuery)."""
    params = {"query": query or meta["query"], "time": f"{time.time():.3f}"}
    doc = json.loads(get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}"))
    result = doc["data"]["result"]
    if not result:
        if meta.get("ignoreNullValues", "true") == "true":
            return 0.0
        raise KedaError("prometheus metrics 'prometheus' target may be lost, the result is empty")
    if len(result) > 1:
        raise KedaError(f"prometheus query {params['query']} returned multiple elements")
    value = float(result[0]["value"][1])
    if math.isnan(value) or math.isinf(value):
        raise KedaError(f"prometheus query returns {value}")
    return value


def writer(url: str, namespace: str, waiting: dict[int, float]) -> StatsWriter:
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=0.25)
    w = StatsWriter(cfg, vllm_catalog(), engines=list(waiting), load=VLLM_LOAD)
    for engine, n in waiting.items():
        w.metric("vllm:num_requests_waiting").labels(engine, model_name="m").set(n)
    return w


def until(what: str, check, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except KedaError as exc:  # before the first scrapes: no series yet
            got = str(exc)
        if got is True:
            return
        assert time.monotonic() < deadline, f"{what}: {got}"
        time.sleep(0.5)


@needs_prometheus
def test_the_manifests_query_reads_the_fleets_waiting_requests_from_a_real_prometheus(
    redis_server, namespace, tmp_path: Path
):
    meta = trigger()
    a, b = f"{namespace}-a", f"{namespace}-b"
    steady, dying = writer(redis_server.url, a, {0: 3, 1: 5}), writer(redis_server.url, a, {2: 7})
    other = writer(redis_server.url, b, {0: 20})
    catalog = vllm_catalog()
    one = Exporter(StatsReader(StatsConfig(url=redis_server.url, namespace=a), catalog), port=0).start()
    both = Exporter(
        StatsReader(StatsConfig(url=redis_server.url, namespace=a), catalog), port=0, namespaces=[a, b]
    ).start()
    fleet = Fleet(tmp_path)
    try:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": JOB, "static_configs": [{"targets": [one.url.removeprefix("http://")]}]},
                {"job_name": "several", "static_configs": [{"targets": [both.url.removeprefix("http://")]}]},
            ],
        }
        base = fleet.prometheus(config).base
        until("the fleet's 15 waiting", lambda: keda_query(base, meta) == 15 or keda_query(base, meta))
        assert math.ceil(15 / float(meta["threshold"])) == 4
        dying.close()  # an engine shut down: the next scrape has it out
        until("the live engines' 8 waiting", lambda: keda_query(base, meta) == 8 or keda_query(base, meta))
        # The exporter of two models: the selector names the model, one element each.
        several = meta["query"].replace(f'job="{JOB}"', 'job="several", redis_stats_namespace="NS"')
        assert several != meta["query"]
        until("model a", lambda: keda_query(base, meta, several.replace("NS", a)) == 8 or "not yet")
        until("model b", lambda: keda_query(base, meta, several.replace("NS", b)) == 20 or "not yet")
        # Without the model in the selector, one exporter of two: the sum of both (a wrong scale
        # signal, which is why the manifest says to add it), still one element.
        assert keda_query(base, meta, meta["query"].replace(JOB, "several")) == 28
        # No series (an exporter not scraped): ignoreNullValues "false" makes it an error, not a 0.
        with pytest.raises(KedaError, match="result is empty"):
            keda_query(base, meta, meta["query"].replace(JOB, "nothing-here"))
    finally:
        fleet.stop()
        one.close()
        both.close()
        for w in (steady, other):
            w.close()
