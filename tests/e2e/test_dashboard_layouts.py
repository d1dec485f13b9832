"""The shipped Grafana dashboard in every scrape layout the docs describe, in a real Prometheus.

Started here, on loopback, stopped by pid: a private redis-server; namespace A written by two
simulated vLLM nodes (tests/helpers/fleet_node.py: engines 0, 2, 4 and 1, 3, 5, each keeping its
own totals and serving its own engines' Redis view, ``REDIS_STATS_VIEW=local``), namespace B by a
third (engines 0 and 1: the same numbers as two of A's); ``redis-stats exporter``s; and one
Prometheus scraping every layout as its own job:

- ``one_view``: one exporter, whole (docs/kubernetes.md, the fleet layout);
- ``sliced``: that exporter as 4 targets ``?slice=i/4``, relabelled as docs/kubernetes.md's scrape
  config and its ServiceMonitor do (one address, so one ``instance``; a ``slice`` label; the
  Operator's target labels ``namespace``, ``pod``, ``service``, ``endpoint``);
- ``slice_exporters``: two exporters ``--slice 0/2`` and ``--slice 1/2``;
- ``per_pod``: every node's own view (deploy/kubernetes/per-pod-views);
- ``two_namespaces``: one exporter of both namespaces (``redis-stats exporter --namespace A
  --namespace B``): one target, one ``job``/``instance``, every series labelled
  ``redis_stats_namespace`` by the exporter itself.

Every panel query of the dashboard, its variables filled in as Grafana fills them (one namespace,
All, two namespaces; ``$__rate_interval`` from the step), must answer without error and with data
in every layout; the panels that show totals must agree with the writers' own totals (throughput,
finished requests: rates within 10 % of the nodes' truth) and with the store (gauges and engine
up, once the load is frozen: exactly the reader's snapshot); and two namespaces' engine 0 must stay
two series. On main before this test every panel failed in ``sliced`` ("found duplicate series for
the match group {instance, job}": every slice serves ``redis_stats_namespace_info``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog

from . import grafana
from .prometheus import Fleet, PromQL, free_port, get, needs_prometheus, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis_server, pytest.mark.slow]

SCRAPE = 1.0  # Prometheus's scrape interval, and the Grafana data source's
STEP = 19.0  # a panel's step: $__rate_interval = max(19 + 1, 4 x 1) = 20 s
WINDOW = grafana.rate_interval(STEP, SCRAPE)
LOAD_SECONDS = 30  # scrapes to cover the 20 s window, after every target is up
NODES_A = ("0,2,4", "1,3,5")
NODE_B = "0,1"
SLICES = 4
EVERY = {"model": grafana.ALL, "engine": grafana.ALL}  # what the model and engine variables pick
JOBS = ("one_view", "sliced", "slice_exporters", "per_pod", "two_namespaces")
# Panels whose value is a total of what the writers counted: (panel title, legend prefix) -> the
# index of the truth ([generation, prompt, finished]) and how the panel's series split it.
RATE_TOTALS = {
    ("Generation throughput (tokens/s)", "engine"): (0, "engine"),
    ("Generation throughput (tokens/s)", "fleet"): (0, None),
    ("Prompt throughput (tokens/s)", "engine"): (1, "engine"),
    ("Finished requests by reason (req/s)", ""): (2, None),
}
# Gauge panels, exact once the load is frozen: (title, legend prefix) -> the metric and how the
# store's engines combine into one series.
GAUGES = {
    ("Requests running / waiting", "running"): "vllm:num_requests_running",
    ("Requests running / waiting", "waiting"): "vllm:num_requests_waiting",
    ("KV cache usage", "engine"): "vllm:kv_cache_usage_perc",
}


def _scrape_config(ports: dict[str, object]) -> dict:
    exporter = f"127.0.0.1:{ports['exporter_a']}"
    operator_labels = {
        "namespace": "llm",
        "pod": "redis-stats-exporter-0",
        "service": "redis-stats-exporter",
        "endpoint": "metrics",
    }
    return {
        "global": {"scrape_interval": f"{SCRAPE:g}s", "scrape_timeout": f"{SCRAPE:g}s"},
        "scrape_configs": [
            {"job_name": "one_view", "static_configs": [{"targets": [exporter]}]},
            {
                # docs/kubernetes.md: one address, told apart by the slice label only
                "job_name": "sliced",
                "static_configs": [
                    {
                        "targets": [exporter],
                        "labels": {"__param_slice": f"{i}/{SLICES}", **operator_labels},
                    }
                    for i in range(SLICES)
                ],
                "relabel_configs": [{"source_labels": ["__param_slice"], "target_label": "slice"}],
            },
            {
                "job_name": "slice_exporters",
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports["slice_exporters"]]}],
            },
            {
                "job_name": "per_pod",
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports["nodes_a"]]}],
            },
            {
                # One exporter (one job, one instance) serving two namespaces: its own labels.
                "job_name": "two_namespaces",
                "static_configs": [{"targets": [f"127.0.0.1:{ports['several']}"]}],
            },
        ],
    }


def _truth_rates(truths: list[Path], at: float, index: int) -> dict[str, float]:
    """Per engine: the rate of truth *index* over [at - WINDOW, at], from the nodes' own counts."""
    out: dict[str, float] = {}
    for path in truths:
        totals = json.loads(path.read_text())["totals"]

        def counts(t: float, totals: list = totals) -> dict[str, list[int]]:
            best = totals[0][1]
            for when, c in totals:
                if when > t:
                    break
                best = c
            return best

        end, start = counts(at), counts(at - WINDOW)
        for engine in end:
            out[engine] = (end[engine][index] - start[engine][index]) / WINDOW
    return out


def _run_panels(api: PromQL, job: str, picked: dict, at: float | None = None) -> dict[tuple[str, str], list]:
    """Every panel query for *job* with *picked* (each must answer, with data): (title, the
    legend's first word, "" for a label) -> its result."""
    out: dict[tuple[str, str], list] = {}
    for q in grafana.queries(grafana.load(), {"job": job, **picked}, step=STEP, scrape_interval=SCRAPE):
        result = api.query(q.expr, at)  # a PromQL error fails here, with Prometheus's message
        assert result, f"{job}: panel {q.panel!r} ({q.legend}) has no data: {q.expr}"
        word = q.legend.split(" ")[0].rstrip(",")
        out.setdefault((q.panel, "" if word.startswith("{{") else word), []).extend(result)
    return out


def _values(result: list, ns: str, by: str | None) -> dict[str, float]:
    """A panel's series of namespace *ns*, by label *by* (None: the sum of them)."""
    mine = [r for r in result if r["metric"].get("redis_stats_namespace") == ns]
    assert mine, (ns, result)
    if by is None:
        return {"": sum(float(r["value"][1]) for r in mine)}
    found: dict[str, float] = {}
    for r in mine:
        label = r["metric"][by]
        assert label not in found, f"two series for {by}={label} of {ns}: {mine}"
        found[label] = float(r["value"][1])
    return found


@needs_prometheus
def test_every_dashboard_panel_answers_in_every_layout(redis_server, python_env, tmp_path: Path):
    pid = os.getpid()
    ns_a, ns_b = f"e2e.layouts{pid}", f"e2e-other{pid}"  # a '.', which Grafana regex-escapes
    fleet = Fleet(tmp_path)
    base = {**python_env, "REDIS_STATS_URL": redis_server.url, "REDIS_STATS_FLUSH_INTERVAL": "0.25"}
    try:
        ports: dict[str, object] = {"nodes_a": []}
        truths_a = []
        for i, (ns, engines) in enumerate([(ns_a, NODES_A[0]), (ns_a, NODES_A[1]), (ns_b, NODE_B)]):
            port = free_port()
            truth = tmp_path / f"truth{i}.json"
            env = {
                **base,
                "REDIS_STATS_NAMESPACE": ns,
                "REDIS_STATS_PORT": str(port),
                "REDIS_STATS_ADDR": "127.0.0.1",
                "REDIS_STATS_VIEW": "local",
            }
            node = fleet.start(
                [sys.executable, "-m", "tests.helpers.fleet_node", engines, "2", str(truth), str(i + 1)],
                env,
                f"node{i}",
            )
            wait_for(f"http://127.0.0.1:{port}/healthz", f"node {i}", node)
            if ns == ns_a:
                ports["nodes_a"].append(port)  # type: ignore[union-attr]
                truths_a.append(truth)

        def exporter(ns: str, *extra: str) -> int:
            port = free_port()
            command = [sys.executable, "-m", "redis_stats", "exporter", "--port", str(port), "--gc-interval"]
            proc = fleet.start(
                [*command, "0", *extra],
                {**base, "REDIS_STATS_NAMESPACE": ns},
                f"exporter{port}",
            )
            wait_for(f"http://127.0.0.1:{port}/healthz", f"exporter {ns} {extra}", proc)
            return port

        ports["exporter_a"] = exporter(ns_a)
        ports["several"] = exporter(ns_a, "--namespace", ns_a, "--namespace", ns_b)
        ports["slice_exporters"] = [exporter(ns_a, "--slice", f"{i}/2") for i in range(2)]
        api = fleet.prometheus(_scrape_config(ports))
        targets = 1 + SLICES + 2 + len(NODES_A) + 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            active = json.loads(get(f"{api.base}/api/v1/targets"))["data"]["activeTargets"]
            if len(active) == targets and all(t["health"] == "up" for t in active):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"not every target is up: {active}")
        time.sleep(LOAD_SECONDS)

        # While the load runs: every panel answers, every total agrees with the writers'.
        at = time.time() - 3  # every flush and a scrape after it are in
        truth = {i: _truth_rates(truths_a, at, i) for i in range(3)}
        engines_a = {str(e) for node in NODES_A for e in node.split(",")}
        assert set(truth[0]) == engines_a
        answers = {
            (job, "All" if ns_pick is grafana.ALL else ",".join(ns_pick)): _run_panels(
                api, job, {"namespace": ns_pick, **EVERY}, at
            )
            for job in JOBS
            for ns_pick in [[ns_a], grafana.ALL, *([[ns_a, ns_b]] if job == "two_namespaces" else [])]
        }
        report = {}
        for (job, pick), panels in answers.items():
            for (title, prefix), (index, by) in RATE_TOTALS.items():
                got = _values(panels[(title, prefix)], ns_a, by)
                want = truth[index] if by else {"": sum(truth[index].values())}
                assert got.keys() == want.keys(), (job, pick, title, got, want)
                for key, value in want.items():
                    assert got[key] == pytest.approx(value, rel=0.10), (job, pick, title, prefix, got, want)
                report[f"{job} {pick} {title} {prefix}"] = [got, want]
        for job in JOBS:  # the variables: what Grafana lists for each job
            namespaces = api.label_values(
                f'label_values(redis_stats_namespace_info{{job="{job}"}}, redis_stats_namespace)'
            )
            assert namespaces == ({ns_a, ns_b} if job == "two_namespaces" else {ns_a}), (job, namespaces)
            listed = api.label_values(f'label_values(redis_stats_engine_up{{job="{job}"}}, engine)')
            assert listed == engines_a, (job, listed)

        # Two namespaces in one target never merge: engine 0 of A and engine 0 of B are two series.
        both = _run_panels(api, "two_namespaces", {"namespace": grafana.ALL, **EVERY}, at)
        up = both[("Engine up (1 = heartbeating)", "engine")]
        keys = sorted((r["metric"]["redis_stats_namespace"], r["metric"]["engine"]) for r in up)
        assert keys == sorted([(ns_a, e) for e in engines_a] + [(ns_b, e) for e in NODE_B.split(",")]), keys
        only_b = _run_panels(api, "two_namespaces", {"namespace": [ns_b], **EVERY}, at)
        assert {r["metric"]["redis_stats_namespace"] for rs in only_b.values() for r in rs} == {ns_b}

        # Frozen: the gauge panels are exactly the store's values, in every layout.
        for i in range(len(NODES_A) + 1):
            fleet.procs[i].send_signal(signal.SIGUSR1)
        paths = [*truths_a, tmp_path / "truth2.json"]
        deadline = time.monotonic() + 20
        while not all(json.loads(p.read_text())["frozen"] for p in paths):
            assert time.monotonic() < deadline, "nodes did not freeze"
            time.sleep(0.2)
        time.sleep(3 * SCRAPE)  # a scrape of every target after the freeze's flush
        snap = StatsReader(StatsConfig(url=redis_server.url, namespace=ns_a), vllm_catalog()).snapshot()
        for job in JOBS:
            panels = _run_panels(api, job, {"namespace": [ns_a], **EVERY})
            for key, metric in GAUGES.items():
                want = {str(e): s.gauge(metric, "tiny-llama") for e, s in snap.engines.items()}
                assert None not in want.values(), want
                assert _values(panels[key], ns_a, "engine") == want, (job, key)
            up_a = _values(panels[("Engine up (1 = heartbeating)", "engine")], ns_a, "engine")
            assert up_a == dict.fromkeys(engines_a, 1.0), (job, up_a)
            views = panels[("Redis view: up", "")]
            assert {float(r["value"][1]) for r in views} == {1.0}, (job, views)
        print("dashboard layouts:", json.dumps(report)[:4000])
    finally:
        fleet.stop()
