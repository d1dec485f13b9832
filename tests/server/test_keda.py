"""KEDA's ``metrics-api`` trigger of deploy/kubernetes/keda/load, evaluated against a live ``/load``.

The ScaledObject's own ``url`` path, ``valueLocation`` and ``targetValue`` (read from the manifest,
as KEDA reads them) against a running exporter over a simulated vLLM fleet: writers through the
vLLM catalogue and its load map (``VLLM_LOAD``) on a private loopback redis-server. The path is
evaluated with ``gjson`` (gjson-py, from the package index), by the rules of KEDA's
``metrics_api_scaler.go``: an answer other than 200 is an error; the value at the path must be a
JSON number (a string must parse as a Kubernetes quantity; ``null`` is an error); the HPA then
wants ``ceil(value / targetValue)`` replicas (``metricType: AverageValue``). While engines die
(one closed, one whose writer stops heartbeating), the value is the waiting requests of the live
engines, exactly; with an exporter of several models, ``/load?namespace=`` gives each model's own.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import gjson
import pytest
import yaml

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.server import Exporter
from tests.conftest import ROOT

pytestmark = pytest.mark.redis_server

SCALED_OBJECT = ROOT / "deploy" / "kubernetes" / "keda" / "load" / "scaledobject.yaml"
WAITING = "vllm:num_requests_waiting"


def trigger(path: Path = SCALED_OBJECT) -> dict[str, str]:
    (trig,) = yaml.safe_load(path.read_text())["spec"]["triggers"]
    assert trig["type"] == "metrics-api" and trig["metadata"].get("format", "json") == "json"
    return trig["metadata"]


class KedaError(AssertionError):
    """What KEDA's scaler returns as an error (the ScaledObject's fallback then counts a failure)."""


def keda_value(exporter_url: str, metadata: dict[str, str], query: str = "") -> float:
    """One poll of KEDA's metrics-api scaler: GET the trigger's URL (its path on *exporter_url*),
    then the number at ``valueLocation`` by GJSON, under the scaler's rules."""
    path = urllib.parse.urlsplit(metadata["url"]).path
    try:
        with urllib.request.urlopen(
            exporter_url + path + query, timeout=float(metadata["timeout"]) / 1000
        ) as r:
            body = r.read()
    except urllib.error.HTTPError as exc:  # KEDA: "api returned <status>"
        raise KedaError(f"{path}: api returned {exc.code}") from None
    try:
        value = gjson.get(json.loads(body), metadata["valueLocation"])
    except gjson.GJSONError as exc:
        raise KedaError(f"valueLocation {metadata['valueLocation']!r}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KedaError(f"valueLocation {metadata['valueLocation']!r} points to {value!r}, not a number")
    return float(value)


def replicas(value: float, metadata: dict[str, str]) -> int:
    """What the HPA wants for an AverageValue target: ceil(value / targetValue)."""
    return math.ceil(value / float(metadata["targetValue"]))


def fleet(url: str, namespace: str, waiting: dict[int, float], **config: float) -> StatsWriter:
    """One writer (an API server) of the engines in *waiting*, each with that many queued."""
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=0.05, **config)
    writer = StatsWriter(cfg, vllm_catalog(), engines=list(waiting), start=False, load=VLLM_LOAD)
    for engine, n in waiting.items():
        writer.metric(WAITING).labels(engine, model_name="m").set(n)
        writer.metric("vllm:num_requests_running").labels(engine, model_name="m").set(8)
    assert writer.flush()
    return writer


def test_the_manifests_value_location_reads_the_live_engines_waiting_requests(redis_server, namespace):
    meta = trigger()
    steady = fleet(redis_server.url, namespace, {0: 3, 1: 5, 2: 0})
    closing = fleet(redis_server.url, namespace, {3: 7})
    crashing = fleet(redis_server.url, namespace, {4: 11}, stale_after=0.3)
    reader = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), vllm_catalog())
    exporter = Exporter(reader, port=0, load_refresh=0.05).start()
    try:
        value = keda_value(exporter.url, meta)
        assert value == 3 + 5 + 0 + 7 + 11
        assert replicas(value, meta) == math.ceil(26 / float(meta["targetValue"]))
        closing.close()  # an engine shut down: out at once
        crashing._closed = True  # an engine whose process died: out once its heartbeat is stale
        deadline = time.monotonic() + 10
        while (value := keda_value(exporter.url, meta)) != 8:
            assert time.monotonic() < deadline, value
            steady.flush()
            time.sleep(0.1)
        assert replicas(value, meta) == math.ceil(8 / float(meta["targetValue"]))
        # Every engine down: no engine reports, the sum is null and KEDA's poll is an error (the
        # ScaledObject's fallback keeps the replicas), never a 0 that would scale the fleet in.
        steady.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                keda_value(exporter.url, meta)
            except KedaError as exc:
                assert "points to None" in str(exc)
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        exporter.close()
        for w in (steady, closing):
            w.close()


def test_redis_down_is_an_error_for_keda_not_a_number(redis_server, namespace):
    meta = trigger()
    reader = StatsReader(StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace), vllm_catalog())
    exporter = Exporter(reader, port=0).start()
    try:
        with pytest.raises(KedaError, match="api returned 503"):
            keda_value(exporter.url, meta)
    finally:
        exporter.close()


def test_an_exporter_of_several_models_gives_each_its_own_value(redis_server, namespace):
    meta = trigger()
    a, b = f"{namespace}-a", f"{namespace}-b"
    writers = [fleet(redis_server.url, a, {0: 2, 1: 4}), fleet(redis_server.url, b, {0: 9})]
    reader = StatsReader(StatsConfig(url=redis_server.url, namespace=a), vllm_catalog())
    exporter = Exporter(reader, port=0, namespaces=[a, b]).start()
    try:
        assert keda_value(exporter.url, meta, f"?namespace={a}") == 6
        assert keda_value(exporter.url, meta, f"?namespace={b}") == 9
        with pytest.raises(KedaError, match="api returned 400"):  # no ?namespace=: which model?
            keda_value(exporter.url, meta)
    finally:
        exporter.close()
        for w in writers:
            w.close()
