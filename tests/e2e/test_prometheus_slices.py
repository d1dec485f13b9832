"""A real Prometheus scraping one exporter as N targets (``params: {slice: [i/N]}``): the N slices
together are the whole view, exactly.

A private redis-server holds 10 engines of simulated vLLM traffic (the real recorder, two API-server
writers per engine, then frozen: the writers keep heartbeating with the same totals). The standalone
``redis-stats exporter`` is scraped by Prometheus as two jobs: ``whole`` (one target) and ``sliced``
(four targets, ``slice`` = ``0/4`` ... ``3/4``, the layout of docs/kubernetes.md's sliced example).
Every series Prometheus stores of ``sliced`` (but each scrape's own self-metrics) must be a series
of ``whole`` with the same value and the reverse: no engine in two slices, none missing, the
writers' self-metrics once (slice 0).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.prometheus.filters import PER_SCRAPE
from redis_stats.tools.simulate import SimulatedApiServer

from .prometheus import Fleet, free_port, get, needs_prometheus, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis_server, pytest.mark.slow]

ENGINES = 10
SLICES = 4
# Labels Prometheus adds per target; the slice label comes from the sliced job's relabelling.
TARGET_LABELS = ("job", "instance", "slice")


def _fill(url: str, namespace: str) -> list[StatsWriter]:
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=0.25)
    writers = []
    for api in range(2):
        writer = StatsWriter(cfg, vllm_catalog(), engines=list(range(ENGINES)), role=f"api{api}")
        sims = [
            SimulatedApiServer(VllmRecorder(writer, "model", [e]), e, seed=api * 1000 + e)
            for e in range(ENGINES)
        ]
        now = time.monotonic()
        for step in range(30):
            for sim in sims:
                sim.step(now + step * 0.05)
        assert writer.flush()
        writers.append(writer)
    return writers


def _series(api: str, job: str) -> dict[tuple, float]:
    """Every series of *job* Prometheus holds now, by name and labels (but the target's)."""
    doc = json.loads(get(f"{api}/api/v1/query?{urllib.parse.urlencode({'query': f'{{job={job!r}}}'})}"))
    assert doc["status"] == "success", doc
    out: dict[tuple, float] = {}
    for r in doc["data"]["result"]:
        name = r["metric"]["__name__"]
        if name in ("up",) or name.startswith("scrape_") or name.startswith(PER_SCRAPE):
            continue
        labels = tuple(sorted((k, v) for k, v in r["metric"].items() if k not in TARGET_LABELS))
        assert labels not in out, f"{labels} twice in job {job}: an engine in two slices"
        out[labels] = float(r["value"][1])
    return out


@needs_prometheus
def test_the_slices_scraped_by_prometheus_are_the_whole_view(redis_server, python_env, tmp_path: Path):
    namespace = f"e2e-slices{os.getpid()}"
    writers = _fill(redis_server.url, namespace)
    fleet = Fleet(tmp_path)
    env = {**python_env, "REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    try:
        port = free_port()
        exporter = fleet.start(
            [sys.executable, "-m", "redis_stats", "exporter", "--port", str(port), "--gc-interval", "0"],
            env,
            "exporter",
        )
        wait_for(f"http://127.0.0.1:{port}/healthz", "exporter", exporter)
        target = f"127.0.0.1:{port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": "whole", "static_configs": [{"targets": [target]}]},
                {
                    "job_name": "sliced",
                    # One target per slice: the same address, told apart by their slice label.
                    "static_configs": [
                        {"targets": [target], "labels": {"__param_slice": f"{i}/{SLICES}"}}
                        for i in range(SLICES)
                    ],
                    "relabel_configs": [
                        {"source_labels": ["__param_slice"], "target_label": "slice"},
                        {
                            "source_labels": ["__address__", "__param_slice"],
                            "separator": "/",
                            "target_label": "instance",
                        },
                    ],
                },
            ],
        }
        api = fleet.prometheus(config).base
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            doc = json.loads(get(f"{api}/api/v1/query?query=up"))
            ups = [r for r in doc["data"]["result"] if r["value"][1] == "1"]
            if len(ups) == 1 + SLICES:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"not every target is up: {doc}")
        time.sleep(2)  # a full scrape of every target after all were up

        whole, sliced = _series(api, "whole"), _series(api, "sliced")
        engines = {dict(k).get("engine") for k in whole} - {None}
        assert engines == {str(e) for e in range(ENGINES)}
        assert len(whole) > 1000, len(whole)  # the full vLLM catalogue of 10 engines
        assert sliced.keys() == whole.keys(), (
            sorted(set(whole) - set(sliced))[:5],
            sorted(set(sliced) - set(whole))[:5],
        )
        # Ages, the live writers' own flush counts and the server's memory move between two
        # scrapes; every other value is frozen (no new traffic), so equal in both jobs.
        moving = {
            k
            for k in whole
            if dict(k)["__name__"].endswith("_age_seconds")
            or dict(k)["__name__"].startswith("redis_stats_writer_")
            or dict(k)["__name__"] == "redis_stats_store_used_memory_bytes"
        }
        assert {k: v for k, v in sliced.items() if k not in moving} == {
            k: v for k, v in whole.items() if k not in moving
        }
        # The writers' self-metrics come from slice 0 only; an engine from its own slice only.
        doc = json.loads(
            get(f"{api}/api/v1/query?query=" + urllib.parse.quote('redis_stats_writer_up{job="sliced"}'))
        )
        assert {r["metric"]["slice"] for r in doc["data"]["result"]} == {f"0/{SLICES}"}
        doc = json.loads(
            get(f"{api}/api/v1/query?query=" + urllib.parse.quote('redis_stats_engine_up{job="sliced"}'))
        )
        for r in doc["data"]["result"]:
            assert int(r["metric"]["engine"]) % SLICES == int(r["metric"]["slice"].split("/")[0])
    finally:
        fleet.stop()
        for writer in writers:
            writer.close()
