"""The timings the test suite used to bound by the wall clock, measured here instead.

A unit test asserts an outcome with a margin a loaded 2-core machine cannot miss (tests/aio's loop
lag under 150 ms, tests/connection/test_faults.py's record calls under 0.25 s, a Cluster read
failing within 4 socket timeouts, a writer's close within close_timeout + 3 s); what the code
really takes is printed here, run after run, on a quiet machine:

(a) the asyncio writer's loop lag while Redis is stopped for 3 s (tests/helpers/loop_lag.py, in a
    process of its own): p50, p99, max over --runs runs;
(b) close() of a writer whose Redis is SIGSTOPped, close_timeout 1 s: how long it took;
(c) a read of a SIGSTOPped single server with a 1 s socket timeout: how long until it fails.

Usage: python bench/timing.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import Catalog, StatsConfig, StatsReader, StatsWriter  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402


def _catalog() -> Catalog:
    cat = Catalog()
    cat.counter("tokens", "Generated tokens.")
    return cat


def loop_lag(runs: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    rows = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-m", "tests.helpers.loop_lag"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for key in ("p50_ms", "p99_ms", "max_ms"):
        values = [r[key] for r in rows]
        med, worst = statistics.median(values), max(values)
        print(f"(a) loop lag {key[:-3]:>4}: median {med:6.2f} ms, worst {worst:6.2f} ms")


def close_stopped(runs: int) -> None:
    took = []
    with EmbeddedRedis() as server:
        for i in range(runs):
            cfg = StatsConfig(
                url=server.url, namespace=f"close{i}", flush_interval=0.05, socket_timeout_ms=10_000
            )
            writer = StatsWriter(cfg, _catalog(), engines=[0])
            tokens = writer.counter("tokens").labels(engine=0)
            tokens.inc()
            while writer.pending():
                time.sleep(0.01)
            assert server.pid is not None
            os.kill(server.pid, signal.SIGSTOP)
            try:
                tokens.inc()
                time.sleep(0.2)
                started = time.monotonic()
                writer.close()
                took.append(time.monotonic() - started)
            finally:
                os.kill(server.pid, signal.SIGCONT)
    med, worst = statistics.median(took), max(took)
    print(f"(b) close(), Redis stopped, close_timeout 1 s: median {med:.3f} s, worst {worst:.3f} s")


def read_stopped(runs: int) -> None:
    took = []
    with EmbeddedRedis() as server:
        cfg = StatsConfig(url=server.url, namespace="read", socket_timeout_ms=1000, connect_timeout_ms=1000)
        reader = StatsReader(cfg, _catalog())
        reader.snapshot()
        assert server.pid is not None
        for _ in range(runs):
            os.kill(server.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                try:
                    reader.snapshot()
                except Exception:
                    pass
                took.append(time.monotonic() - started)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            reader.snapshot()  # connected again
        reader.close()
    med, worst = statistics.median(took), max(took)
    print(f"(c) a read of a stopped server, 1 s timeout: median {med:.3f} s, worst {worst:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    loop_lag(runs)
    close_stopped(runs)
    read_stopped(runs)


if __name__ == "__main__":
    main()
