"""``redis-stats simulate``: a fleet of engines x API servers in a few processes, with load that a
router can read (``/load`` has values), hot engines whose queue rises and drains, totals that grow,
a clean stop on SIGTERM, and what it says it recorded is what a reader reads."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.tools.fleet_sim import simulated_catalog, totals_in_redis
from redis_stats.tools.simulate import FleetLoad, LoadProfile, SimulatedEngine
from tests.conftest import PYTHON, ROOT

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

END = re.compile(
    r"simulate stopped: ([\d,]+) writers closed \((.*?)\); recorded ([\d,]+) generation tokens, "
    r"([\d,]+) finished requests, ([\d,]+) rejected"
)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def start(redis_url: str, namespace: str, *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    env.update(
        REDIS_STATS_URL=redis_url,
        REDIS_STATS_NAMESPACE=namespace,
        REDIS_STATS_FLUSH_INTERVAL="0.5",
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "simulate", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_a_simulated_fleet_has_load_values_queues_that_rise_and_drain_and_stops_on_sigterm(
    redis_server, namespace
):
    engines = 6
    proc, lines = start(
        redis_server.url,
        namespace,
        *("--engines", str(engines), "--api-servers", "2", "--processes", "2"),
        *("--period", "20", "--hot-every", "1", "--report-interval", "2"),
    )
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    reader = StatsReader(config, simulated_catalog())
    try:
        deadline = time.monotonic() + 60
        peak: dict[str, float] = {}  # engine -> the most it had waiting so far
        drained: set[str] = set()  # engines whose queue rose to 3 or more, then fell to 1 or less
        first_tokens = None
        doc: dict = {}
        while time.monotonic() < deadline and not (drained and first_tokens is not None):
            time.sleep(0.5)
            doc = reader.load().to_dict()
            if len(doc["engines"]) < engines or not all(e["up"] for e in doc["engines"].values()):
                continue
            if first_tokens is None:
                first_tokens = totals_in_redis(config)["generated"]
            for e, load in doc["engines"].items():
                waiting = load["requests_waiting"]
                peak[e] = max(peak.get(e, 0), waiting)
                if peak[e] >= 3 and waiting <= 1:
                    drained.add(e)
        assert first_tokens is not None, ("the fleet never came up", lines)
        assert drained, (peak, lines)
        # Every field a router reads has a value, for every engine (not null), but `in_flight`:
        # requests counted by a front end as they land (docs/routers.md), and simulate has none.
        for e, load in doc["engines"].items():
            assert {k for k, v in load.items() if v is None} <= {"in_flight"}, (e, load)
            assert load["kv_cache_capacity_tokens"] == FleetLoad(engines).kv_capacity_tokens
            assert 0 <= load["kv_cache_usage"] <= 1
        assert doc["fleet"]["generation_tokens_per_second"]["sum"] > 0
        assert totals_in_redis(config)["generated"] > first_tokens  # totals grow
        children = children_of(proc.pid)
        assert len(children) == 2, children
        assert any(line.startswith("[") and "flushes" in line for line in lines), lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.2)  # the reader thread has the last line
    assert END.search(lines[-1]), lines[-3:]
    assert "every last flush confirmed" in lines[-1]
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    # Every writer closed: every engine is down at once, not stale_after later.
    snap = reader.snapshot()
    assert len(snap.engines) == engines and not any(e.up for e in snap.engines.values())
    assert len(snap.writers) == engines * 2 and all(w.closed for w in snap.writers.values())


def test_what_a_simulated_fleet_says_it_recorded_is_what_a_reader_reads(redis_server, namespace):
    proc, lines = start(
        redis_server.url,
        namespace,
        *("--engines", "5", "--api-servers", "3", "--processes", "2", "--duration", "8"),
        *("--scale", "8"),
    )
    try:
        assert proc.wait(90) == 0, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.2)
    match = END.search(lines[-1])
    assert match, lines[-3:]
    closed, confirmed, generated, finished, rejected = match.groups()
    assert _number(closed) == 15 and confirmed == "every last flush confirmed"
    read = totals_in_redis(StatsConfig(url=redis_server.url, namespace=namespace))
    assert _number(generated) > 0 and _number(finished) > 0
    # scale 8: the engines overflow their bounded queue, so rejections are counted too.
    assert _number(rejected) > 0
    assert read == {
        "generated": _number(generated),
        "finished": _number(finished),
        "rejected": _number(rejected),
    }


def test_a_hot_engines_queue_is_bounded_and_its_latencies_respond_to_it():
    """Unit: the load model itself. A hot engine past its capacity queues (never beyond
    max_waiting: the rest is rejected), its KV usage and TTFT rise with the queue, and it drains
    once the burst is over; its ITL is slower with a full batch."""

    class Recorder:
        def __init__(self) -> None:
            self.ttfts: list[float] = []
            self.itls: list[float] = []
            self.rejected = 0

        def record(self, sched, it, engine_idx=0):
            self.sched = sched
            self.ttfts += it.time_to_first_tokens_iter
            self.itls += it.inter_token_latencies_iter

        def record_admission_rejection(self, reason):
            self.rejected += 1

    load = FleetLoad(4, period=60)
    profile = load.profile(1)
    assert load.is_hot(1) and profile.burst_peak * profile.arrivals_per_s > profile.capacity_per_s()
    rec = Recorder()
    sim = SimulatedEngine([rec], 1, profile, seed=1, kv_capacity_tokens=load.kv_capacity_tokens)  # type: ignore[list-item]
    t = sim._last
    sim._wall = -t - profile.burst_phase * profile.burst_period  # its burst starts now
    waiting, ttft_calm, ttft_busy, itl_busy = [], [], [], []
    for i in range(int(60 / 0.25)):  # one cycle: the burst, then the drain
        t += 0.25
        n_ttft, n_itl = len(rec.ttfts), len(rec.itls)
        sim.step(t)
        waiting.append(sim.waiting)
        assert sim.waiting <= profile.max_waiting
        if i < 20:
            ttft_calm += rec.ttfts[n_ttft:]
        elif sim.waiting >= 10:
            ttft_busy += rec.ttfts[n_ttft:]
            itl_busy += rec.itls[n_itl:]
            assert rec.sched.kv_cache_usage > 0.3
    assert max(waiting) >= 10
    assert waiting[-1] < max(waiting) / 3  # drained after the burst
    assert sum(ttft_busy) / len(ttft_busy) > 5 * sum(ttft_calm) / len(ttft_calm)
    assert sum(itl_busy) / len(itl_busy) > 1.2 * profile.itl_s
    assert sim.rejected == rec.rejected


def test_a_steady_profile_keeps_the_arrival_rate():
    assert LoadProfile().arrival_factor(123.0) == 1.0
    assert FleetLoad(1024).hot() == list(range(1, 1024, 64))
    assert FleetLoad(2).hot() == [1] and FleetLoad(10).hot() == [1, 9]


def _run(
    redis_url: str, namespace: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    env.update(REDIS_STATS_URL=redis_url, REDIS_STATS_NAMESPACE=namespace, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [PYTHON, "-m", "redis_stats", "simulate", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_simulate_refuses_a_namespace_holding_writers_it_did_not_start(redis_server, namespace):
    """Before: `simulate --namespace <a live deployment>` wrote into it, and its simulated
    counters stayed in the deployment's totals for good."""
    from redis_stats import StatsWriter
    from tests.conftest import sample_catalog

    real = StatsWriter(
        StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog(), engines=[0], start=False
    )
    real.counter("requests").labels(engine=0, reason="stop").inc()
    assert real.flush()
    before = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog()).snapshot()
    done = _run(redis_server.url, namespace, "--engines", "2", "--duration", "1")
    assert done.returncode == 5, done.stdout + done.stderr
    assert (
        f"namespace {namespace!r} at {redis_server.url} holds 1 writer that simulate did not start"
        in done.stderr
    )
    assert real.writer_id in done.stderr and "--share-namespace" in done.stderr
    after = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog()).snapshot()
    assert set(after.writers) == set(before.writers)  # nothing written
    # With the flag, as asked.
    shared = _run(redis_server.url, namespace, "--engines", "2", "--duration", "1", "--share-namespace")
    assert shared.returncode == 0, shared.stdout + shared.stderr
    real._closed = True


def test_simulate_runs_again_into_its_own_namespace(redis_server, namespace):
    """A namespace that holds only an earlier simulation's writers is its own to write into."""
    for _ in range(2):
        done = _run(redis_server.url, namespace, "--engines", "2", "--duration", "1", "--processes", "1")
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--engines", "100000", "--api-servers", "64"],
            "--engines 100,000 x --api-servers 64 = 6,400,000 writers, more than the 8,192 one "
            "simulation runs",
        ),
        (["--engines", "4097", "--api-servers", "2"], "= 8,194 writers, more than the 8,192"),
        (["--period", "nan"], "Invalid value for '--period': 'nan' is not a finite number"),
        (["--scale", "inf"], "Invalid value for '--scale'"),
        (["--duration", "nan"], "'nan' is not a finite number"),
    ],
)
def test_simulate_turns_a_size_past_its_bound_or_a_bad_number_into_a_usage_error(args, said):
    """Before: 100,000 x 64 grew past 3.6 GB, and --period nan ended in a traceback."""
    done = _run("redis://127.0.0.1:1/0", "simulate", *args, timeout=30)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr


def test_simulated_engines_behind_endpoints_fill_the_endpoint_views(redis_server, namespace):
    done = _run(
        redis_server.url, namespace, "--engines", "6", "--engines-per-endpoint", "2", "--duration", "2"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    from redis_stats.server.states.endpoints import endpoints_document

    reader = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), simulated_catalog())
    doc = endpoints_document(reader.load())
    assert {e: sorted(v["engines"]) for e, v in doc["endpoints"].items()} == {
        "simulate-0:8000": ["0", "1"],
        "simulate-1:8000": ["2", "3"],
        "simulate-2:8000": ["4", "5"],
    }
    assert doc["unassigned"] == []
