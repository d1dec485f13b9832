"""The CPU a busy scrape, a flush, the load lane and a ``/load`` refresh cost, at two checkouts
side by side in one run (a re-layout must cost nothing: issue 50, item 5).

Wall clock on a shared machine moves by tens of percent from one minute to the next; CPU time of
the process doing the work (``time.process_time``) much less, so each figure here is that, taken
in a worker process per checkout (``PATH`` first on ``sys.path``), the checkouts alternated run by
run against one private redis-server (never port 6379):

- **busy scrape**: bench/peer_worker.py's ``scrape_busy`` (64 engines x 40 series, every series
  changed and flushed before each scrape, each run alone in the store) with its clock set to CPU
  time: the median of 21 scrapes;
- **flush** and **lane**: a vLLM plugin's writer (the load feed on) of 32 engines, each engine
  recording a step between two flushes: the median CPU of ``flush()``, and of the load lane's
  ``flush_load()`` after a step that changed every engine's numbers;
- **/load refresh**: the checkout's own bench/live_refresh.py (1,024 engines x 2 writers
  flushing every second): CPU per refresh.

Printed: each checkout's median over the runs, and the ratio of the second to the first (the
median of the per-round ratios).

Usage: python bench/checkouts_cpu.py OLD NEW [--runs 10] [--refresh-runs 4] [--refresh-seconds 10]
       [--only scrape|flush|refresh]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig  # noqa: E402
from redis_stats.connection import make_client  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402

SCRAPE = """
import json, os, sys, time
tree, url = sys.argv[1], sys.argv[2]
sys.path[:0] = [tree, tree + "/bench"]
os.environ["PEER_BUCKETS"], os.environ["PEER_RUNS"] = "20", "21"
sys.argv = ["peer_worker.py", "redis_stats", "scrape_busy", url, "64"]
import peer_worker
time.perf_counter = time.process_time  # its clock: CPU time
print(json.dumps({"scrape": peer_worker.task_scrape_busy()["median_ms"]}))
sys.stdout.flush(); os._exit(0)
"""

FLUSH = """
import json, os, statistics, sys, time
tree, url = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from tests.vllm_shapes import iteration, scheduler
engines = list(range(32))
w = StatsWriter(StatsConfig(url=url, namespace=f"flush{os.getpid()}"), vllm_catalog(), engines=engines,
                start=False, load=VLLM_LOAD)
rec = VllmRecorder(w, "m", engines)
flushes, lanes = [], []
for k in range(80):
    for e in engines:
        rec.record(scheduler(running=k % 7 + e, waiting=k % 3, kv=k % 10 / 10),
                   iteration(prompt=100 + k, generation=50 + e, ttft=[0.1], itl=[0.02] * 5), engine_idx=e)
    t = time.process_time(); assert w.flush(); flushes.append(time.process_time() - t)
    for e in engines:
        rec.record(scheduler(running=k % 5 + e, waiting=k % 4, kv=k % 9 / 10), iteration(), engine_idx=e)
    t = time.process_time(); w.flush_load(); lanes.append(time.process_time() - t)
flush, lane = statistics.median(flushes[10:]), statistics.median(lanes[10:])
print(json.dumps({"flush": flush * 1e3, "lane": lane * 1e3}))
sys.stdout.flush(); os._exit(0)
"""


def worker(code: str, tree: Path, url: str) -> dict[str, float]:
    """A worker's figures (CPU ms) at *tree*."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tree), url],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=tree,
        env=env,
    )
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def refresh(tree: Path, seconds: float) -> dict[str, float]:
    """CPU ms per ``/load`` refresh at *tree* (its own bench/live_refresh.py)."""
    out = subprocess.run(
        [sys.executable, str(tree / "bench" / "live_refresh.py"), "--seconds", str(seconds)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=tree,
    )
    found = re.search(r"/load refresh: ([\d.]+) ms", out.stdout)
    if found is None:
        raise SystemExit(f"{tree}: {out.stdout[-1000:]}{out.stderr[-2000:]}")
    return {"refresh": float(found.group(1))}


def alternate(trees: list[Path], runs: int, measure: object) -> dict[Path, list[dict[str, float]]]:
    """*measure(tree)* at each of *trees*, *runs* times, in alternating order."""
    got: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(runs):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            got[tree].append(measure(tree))  # type: ignore[operator]
    return got


def report(got: dict[Path, list[dict[str, float]]]) -> None:
    old, new = got
    for key in got[old][0]:
        a, b = [x[key] for x in got[old]], [x[key] for x in got[new]]
        ratio = statistics.median(y / x for x, y in zip(a, b))
        mid_a, mid_b = statistics.median(a), statistics.median(b)
        print(
            f"  {key:<8} {old.name}: {mid_a:8.3f} ms   {new.name}: {mid_b:8.3f} ms"
            f"   {new.name}/{old.name} {ratio:5.3f}   ({len(a)} runs each)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--refresh-runs", type=int, default=4)
    parser.add_argument("--refresh-seconds", type=float, default=10.0)
    parser.add_argument("--only", choices=("scrape", "flush", "refresh"), help="that part alone")
    opts = parser.parse_args()
    parts = {opts.only} if opts.only else {"scrape", "flush", "refresh"}
    trees = [Path(opts.old).resolve(), Path(opts.new).resolve()]
    print("CPU ms of the process doing the work (time.process_time), checkouts alternated")
    with EmbeddedRedis() as server:
        store = make_client(StatsConfig(url=server.url))

        def scrape(tree: Path) -> dict[str, float]:
            store.flushall()  # each run alone in the store (every worker writes namespace "bench")
            return worker(SCRAPE, tree, server.url)

        if "scrape" in parts:
            report(alternate(trees, opts.runs, scrape))
        if "flush" in parts:
            report(alternate(trees, opts.runs, lambda t: worker(FLUSH, t, server.url)))
    if "refresh" in parts:
        report(alternate(trees, opts.refresh_runs, lambda t: refresh(t, opts.refresh_seconds)))


if __name__ == "__main__":
    main()
