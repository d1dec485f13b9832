"""The writer's host cost with arrivals counted (issue 47): GC collections and the record path.

A vLLM plugin's writer (2 engines, 200 engine steps a second each, numbers moving every step: the
load lane's worst case, ``load_interval`` 0.08 s) in a worker process, at two checkouts side by
side in one run, alternated run by run, against one private redis-server:

- **before**: ``OLD`` (the checkout before arrivals, e.g. main);
- **after**: ``NEW`` (this one), the same loop;
- **after, counting**: ``NEW`` with a front end counting arrivals (``redis_stats.writer.Arrivals``):
  a request begins every step and the one 8 steps older ends (400 arrivals a second, each with an
  id: every lane call also ends bookings).

Printed per variant, the medians over the runs: the process's CPU (1.0 = a core), garbage
collections per minute by generation (``gc.callbacks``), and a ``record()`` call's p50 and p99 (µs).

Usage: python bench/arrivals_host.py OLD NEW [--runs 3] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402

HOST = """
import gc, json, os, statistics, sys, time
tree, url, seconds, counting = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"
sys.path[:0] = [tree, tree + "/bench"]
from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from vllm_record import batches
cfg = StatsConfig(url=url, namespace=f"host-{os.getpid()}", load_interval=0.08)
w = StatsWriter(cfg, vllm_catalog(), engines=[0, 1], load=VLLM_LOAD)
rec = VllmRecorder(w, "m", [0, 1])
arrivals = None
if counting:
    from redis_stats.writer import Arrivals
    arrivals = Arrivals(w)
steps = batches(8)
collections = [0, 0, 0]
def count(phase, info):
    if phase == "start":
        collections[info["generation"]] += 1
for k in range(400):
    sched, it = steps[k % len(steps)]
    rec.record(sched, it, None, k % 2)
time.sleep(1.5)
held = []
gc.callbacks.append(count)
cpu0, t0 = time.process_time(), time.monotonic()
times = []
k = 0
next_at = time.monotonic()
while time.monotonic() - t0 < seconds:
    sched, it = steps[k % len(steps)]
    sched.kv_cache_usage = (k % 97) / 100
    if arrivals is not None:
        held.append(arrivals.begin(rank=k % 2, request_id=f"req-{k}"))
        if len(held) > 8:
            held.pop(0).end()
    a = time.perf_counter()
    rec.record(sched, it, None, k % 2)
    times.append(time.perf_counter() - a)
    k += 1
    next_at += 1 / 400
    pause = next_at - time.monotonic()
    if pause > 0:
        time.sleep(pause)
cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
gc.callbacks.remove(count)
w.close()
times.sort()
print(json.dumps({"cpu": cpu / wall, "gc0": 60 * collections[0] / wall, "gc1": 60 * collections[1] / wall,
                  "gc2": 60 * collections[2] / wall, "record_p50_us": times[len(times) // 2] * 1e6,
                  "record_p99_us": times[int(0.99 * len(times))] * 1e6}))
sys.stdout.flush(); os._exit(0)
"""


def run(tree: Path, url: str, seconds: float, counting: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    args = [sys.executable, "-c", HOST, str(tree), url, str(seconds), "1" if counting else "0"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tree, env=env)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    opts = parser.parse_args()
    variants = {"before": (opts.old, False), "after": (opts.new, False), "after, counting": (opts.new, True)}
    got: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with EmbeddedRedis() as server:
        for r in range(opts.runs):
            names = list(variants) if r % 2 == 0 else list(variants)[::-1]
            for name in names:
                tree, counting = variants[name]
                got[name].append(run(tree, server.url, opts.seconds, counting))
    print(
        f"the writer's host: 2 engines x 200 steps/s, {opts.seconds:.0f} s, {opts.runs} runs each (medians)"
    )
    print(f"{'':<18}{'CPU':>8}{'GC gen0/1/2 per min':>22}{'record p50 µs':>15}{'p99 µs':>9}")
    for name, rows in got.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        gcs = f"{med['gc0']:.0f}/{med['gc1']:.0f}/{med['gc2']:.0f}"
        print(
            f"{name:<18}{med['cpu']:>8.4f}{gcs:>22}{med['record_p50_us']:>15.1f}{med['record_p99_us']:>9.1f}"
        )


if __name__ == "__main__":
    main()
