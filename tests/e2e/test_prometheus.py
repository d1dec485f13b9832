"""A real Prometheus (Debian's package, `make test-e2e` installs it) scraping a simulated fleet.

Started here, all on loopback and stopped by pid: a private redis-server; two simulated vLLM nodes
(tests/helpers/fleet_node.py: API-server writers through the real vLLM recorder, each keeping its
own totals, each serving its node's Redis view as the plugin does, ``REDIS_STATS_VIEW=local``);
the standalone ``redis-stats exporter`` (every engine); and Prometheus scraping every second with
the two layouts of docs/vllm.md as two jobs:

- ``redis_stats``: ONE all-engine view (the exporter);
- ``vllm_nodes``: EVERY node's view (each serving its own engines: ``local``).

PromQL answers of each job are checked against the writers' own totals: per-engine and fleet
rates, exact totals and TTFT quantiles once the load is frozen, ``redis_stats_engine_up``, and
every query of the shipped Grafana dashboard. ``promtool check metrics`` lints a scrape.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.snapshot import HistogramValue

from . import grafana
from .prometheus import PROMETHEUS, PROMTOOL, Fleet, free_port, get, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis_server, pytest.mark.slow]

LOAD_SECONDS = 36  # > the exporter's 30 s /snapshot window, and the 20 s PromQL window after 13 s
# PromQL rate window: well inside the scrapes (Prometheus starts a few seconds after the load, and
# rate() extrapolates only half an interval past the first sample of a window that starts earlier).
WINDOW = 20
SNAPSHOT_WINDOW = 30  # the exporter's default /snapshot window
JOBS = ("redis_stats", "vllm_nodes")

# promtool's lint on the Redis view: only these, all from vLLM's own names (docs/vllm-metrics.md lists them):
# the ':' every vllm:* name has (recording-rule style, vLLM's choice), and a histogram whose name
# ends in _total (vllm:iteration_tokens_total, named so by vLLM).
VLLM_LINT = re.compile(
    r"^vllm:\w+ (metric names should not contain ':'"
    r'|non-counter metrics should not have "_total" suffix)$'
)
# promtool's exit codes: 0 clean, 3 lint problems only; anything else is an error (a bad body).
LINT_ONLY = (0, 3)


def truth_at(history: list, t: float) -> dict[str, int]:
    """Cumulative tokens per engine at time *t* (the last history point not after it)."""
    best = history[0][1]
    for when, counts in history:
        if when > t:
            break
        best = counts
    return best


@pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None, reason="no prometheus (make test-e2e installs it)"
)
def test_real_prometheus_answers_match_the_writers_totals(redis_server, python_env, tmp_path):
    namespace = f"e2e{os.getpid()}"
    fleet = Fleet(tmp_path)
    base_env = {
        **python_env,
        "REDIS_STATS_URL": redis_server.url,
        "REDIS_STATS_NAMESPACE": namespace,
        "REDIS_STATS_FLUSH_INTERVAL": "0.25",
    }
    try:
        node_ports, truths = [], []
        for engine in (0, 1):
            port = free_port()
            node_ports.append(port)
            truths.append(tmp_path / f"truth{engine}.json")
            env = {
                **base_env,
                "REDIS_STATS_PORT": str(port),
                "REDIS_STATS_ADDR": "127.0.0.1",
                "REDIS_STATS_VIEW": "local",
            }
            node = fleet.start(
                [
                    sys.executable,
                    "-m",
                    "tests.helpers.fleet_node",
                    str(engine),
                    "2",
                    str(truths[-1]),
                    str(engine),
                ],
                env,
                f"node{engine}",
            )
            wait_for(f"http://127.0.0.1:{port}/healthz", f"node {engine}", node)
        exporter_port = free_port()
        exporter = fleet.start(
            [
                sys.executable,
                "-m",
                "redis_stats",
                "exporter",
                "--port",
                str(exporter_port),
                "--gc-interval",
                "0",
            ],
            base_env,
            "exporter",
        )
        wait_for(f"http://127.0.0.1:{exporter_port}/healthz", "exporter", exporter)
        snapshot_url = f"http://127.0.0.1:{exporter_port}/snapshot"
        first = json.loads(get(snapshot_url))  # starts the exporter's window sampler
        assert first["window"]["seconds"] is None

        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "redis_stats", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]},
                {
                    "job_name": "vllm_nodes",
                    "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in node_ports]}],
                },
            ],
        }
        api = fleet.prometheus(config, "--storage.tsdb.retention.time=1h")

        # promtool on a scrape of each view (while the load runs, so every family has samples).
        time.sleep(3)
        for url in (f"http://127.0.0.1:{exporter_port}/metrics", f"http://127.0.0.1:{node_ports[0]}/metrics"):
            lint = subprocess.run(
                [PROMTOOL, "check", "metrics"], input=get(url), capture_output=True, timeout=30
            )
            problems = [
                line
                for line in lint.stdout.decode().splitlines() + lint.stderr.decode().splitlines()
                if line.strip()
            ]
            assert lint.returncode in LINT_ONLY, (url, lint.returncode, problems)
            errors = [p for p in problems if not VLLM_LINT.match(p)]
            assert not errors, f"promtool on {url}: {errors}"
            assert problems, "promtool printed nothing: is this still the vllm:* view?"
            (tmp_path / "promtool.txt").write_text("\n".join(problems))

        time.sleep(max(0.0, LOAD_SECONDS - 3))
        # /snapshot for routers: the fleet's generation rate over the exporter's last 30 s.
        snap = json.loads(get(snapshot_url))
        seconds = snap["window"]["seconds"]
        assert seconds is not None and seconds > 0.8 * SNAPSHOT_WINDOW, seconds
        now_truth = [json.loads(p.read_text()) for p in truths]
        snap_at = now_truth[0]["time"]  # the node's clock; the window ends about now
        snap_truth = sum(
            (truth_at(t["history"], snap_at)[str(e)] - truth_at(t["history"], snap_at - seconds)[str(e)])
            / seconds
            for e, t in enumerate(now_truth)
        )
        snap_rate = snap["fleet"]["summary"]["generation_tokens_per_second"]
        assert snap_rate == pytest.approx(snap_truth, rel=0.05), (snap_rate, snap_truth)
        assert snap["fleet"]["engines_up"] == 2
        # The exporter's own process and scrapes, through Prometheus (job redis_stats only).
        assert api.scalar('process_resident_memory_bytes{job="redis_stats"}') > 10e6
        scrapes = api.scalar('redis_stats_exporter_scrape_duration_seconds_count{job="redis_stats"}')
        assert scrapes >= 20
        assert api.scalar('redis_stats_exporter_last_scrape_size_bytes{job="redis_stats"}') > 10_000
        assert not api.query('process_resident_memory_bytes{job="vllm_nodes"}')  # vLLM serves its own

        # Targets healthy: every view up, no scrape error.
        targets = json.loads(get(f"{api.base}/api/v1/targets"))["data"]["activeTargets"]
        assert len(targets) == 3 and all(t["health"] == "up" for t in targets), targets

        # Rates while the load runs: evaluated a little in the past, so every writer's flush and a
        # scrape after it are in (flush 0.25 s + scrape 1 s). A rate over 20 one-second scrapes is
        # within a few percent of the writers' (Prometheus extrapolates to the window's edges);
        # 10 % still fails a doubled total by far.
        at = time.time() - 3
        history = [json.loads(p.read_text())["history"] for p in truths]
        truth_rate = {}
        for engine, hist in enumerate(history):
            end, start = truth_at(hist, at)[str(engine)], truth_at(hist, at - WINDOW)[str(engine)]
            truth_rate[str(engine)] = (end - start) / WINDOW
        truth_total = sum(truth_rate.values())
        rates = {}
        for job in JOBS:
            rates[job] = api.by(
                f'sum by (engine) (rate(vllm:generation_tokens_total{{job="{job}"}}[{WINDOW}s]))',
                "engine",
                at,
            )
            fleet_rate = api.scalar(f'sum(rate(vllm:generation_tokens_total{{job="{job}"}}[{WINDOW}s]))', at)
            assert set(rates[job]) == {"0", "1"}
            for engine, want in truth_rate.items():
                assert rates[job][engine] == pytest.approx(want, rel=0.10), (
                    job,
                    engine,
                    rates[job],
                    truth_rate,
                )
            # One true total: every node scraped (vllm_nodes) gives the fleet once, not twice.
            assert fleet_rate == pytest.approx(truth_total, rel=0.10), (job, fleet_rate, truth_total)
        # Each engine appears once per job (no copies to sum).
        for job in JOBS:
            counts = api.by(f'count by (engine) (redis_stats_engine_up{{job="{job}"}})', "engine")
            assert counts == {"0": 1.0, "1": 1.0}, (job, counts)
        # Every query of the dashboard returns data, for each job (variables filled in as Grafana
        # does; every layout: test_dashboard_layouts.py).
        dash = grafana.load()
        for job in JOBS:
            picked = {"job": job, "namespace": [namespace], "model": grafana.ALL, "engine": grafana.ALL}
            for q in grafana.queries(dash, picked, step=WINDOW - 1, scrape_interval=1):
                assert api.query(q.expr), f"dashboard panel {q.panel!r} ({job}): no data for {q.expr}"
        # Its variables resolve as Grafana resolves label_values(selector, label): through the series API.
        variables = {v["name"]: v for v in dash["templating"]["list"] if v["type"] == "query"}
        for job in JOBS:
            values = {
                name: api.label_values(v["query"]["query"].replace("$job", job))
                for name, v in variables.items()
            }
            assert set(JOBS) <= values["job"] and values["engine"] == {"0", "1"}, values
            assert values["namespace"] == {namespace}, values  # the redis_stats one, as served
            assert values["model"] == {"tiny-llama"}, values

        # Freeze the load: totals become exact, and PromQL must give them exactly.
        for node in fleet.procs[:2]:
            node.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 20
        final = None
        while time.monotonic() < deadline:
            docs = [json.loads(p.read_text()) for p in truths]
            if all(d["frozen"] for d in docs):
                final = docs
                break
            time.sleep(0.2)
        assert final is not None, "nodes did not freeze"
        time.sleep(0.5)
        final = [json.loads(p.read_text()) for p in truths]  # after a flush that followed the freeze
        want_tokens = {str(e): float(final[e]["engines"][str(e)]["generation_tokens"]) for e in (0, 1)}
        ttft = [x for e in (0, 1) for x in final[e]["engines"][str(e)]["ttft"]]
        spec = vllm_catalog().get("vllm:time_to_first_token_seconds")
        bounds = (*spec.buckets, math.inf)
        cumulative = tuple(float(sum(1 for x in ttft if x <= b)) for b in bounds)
        want_hist = HistogramValue(bounds, cumulative, sum(ttft))
        for job in JOBS:
            deadline = time.monotonic() + 15
            while True:
                got = api.by(f'sum by (engine) (vllm:generation_tokens_total{{job="{job}"}})', "engine")
                if got == want_tokens or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert got == want_tokens, (job, got, want_tokens)
            for q in (0.5, 0.9, 0.99):
                buckets = f'vllm:time_to_first_token_seconds_bucket{{job="{job}"}}'
                got_q = api.scalar(f"histogram_quantile({q}, sum by (le) ({buckets}))")
                assert got_q == pytest.approx(want_hist.quantile(q), rel=1e-9), (job, q)
            count = api.scalar(f'sum(vllm:time_to_first_token_seconds_count{{job="{job}"}})')
            assert count == len(ttft)
            up = api.by(f'redis_stats_engine_up{{job="{job}"}}', "engine")
            assert up == {"0": 1.0, "1": 1.0}, (job, up)
        report = {
            "snapshot_rate": snap_rate,
            "snapshot_truth": snap_truth,
            "truth_rate": truth_rate,
            "promql_rate": rates,
            "truth_tokens": want_tokens,
            "ttft_p90_truth": want_hist.quantile(0.9),
        }
        print("e2e:", json.dumps(report))
        (tmp_path / "report.json").write_text(json.dumps(report))
    finally:
        fleet.stop()
