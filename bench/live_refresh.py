"""What a ``/load`` refresh and a ``/watch`` read cost the exporter's CPU while a fleet flushes.

bench/load_feed.py measures a refresh over a still store; in a live fleet the lists a read plans
from (``engines``, ``writers``, ordered by heartbeat) change order with every flush, which a
still store never shows. Here ``bench/fleet.py``'s drivers send 1,024 engines x 2 writers'
realistic flushes (load entries in each, one a second per writer) to a private Redis while a
:class:`~redis_stats.server.states.load_feed.LoadFeed` refreshes and a
:class:`~redis_stats.server.states.watch_feed.WatchFeed` reads as the exporter's threads do, in a
process of its own per checkout measured (``--root NAME=PATH``, repeatable: the same fleet, one
after the other, and again, so that a baseline is measured in the same run): printed, the CPU
(``time.process_time``) per refresh and per feed read, and the events a feed read makes.

Usage: python bench/live_refresh.py [--engines 1024] [--seconds 10] [--root base=/tmp/base] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fleet import drive  # noqa: E402

from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402

# Run in a child process with PYTHONPATH at the checkout measured: its own package.
MEASURE = """
import json, sys, time
from types import SimpleNamespace
from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.server.states.load_feed import LoadFeed
from redis_stats.server.states.watch_feed import WatchFeed

url, namespace, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])


def cpu_ms_each(step, seconds, pause):
    calls, cpu, end = 0, 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.process_time()
        step()
        cpu += time.process_time() - t
        calls += 1
        time.sleep(pause)
    return 1000 * cpu / calls, calls


reader = StatsReader(StatsConfig(url=url, namespace=namespace, socket_timeout_ms=30_000), vllm_catalog())
load = LoadFeed(reader)
refresh_ms, refreshes = cpu_ms_each(load._refresh_once, seconds, 0.25)
# What a feed asks of a namespace's source (its reader; the server's budget, its kept entries: a
# checkout whose feed bounds its history by them)
options = SimpleNamespace(view_budget=256 << 20)
source = SimpleNamespace(reader=reader, options=options, kept=lambda *a, **k: None)
feed = WatchFeed(source, lambda: load)
feed._read_once()
first = feed.seq
read_ms, reads = cpu_ms_each(feed._read_once, seconds, 0.02)
print(json.dumps({"refresh_ms": refresh_ms, "refreshes": refreshes, "read_ms": read_ms, "reads": reads,
                  "events_per_read": (feed.seq - first) / reads}))
"""


def measure(root: Path, url: str, namespace: str, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, url, namespace, str(seconds)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--root", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=1)
    opts = parser.parse_args()
    roots = [(n, Path(p).resolve()) for n, _, p in (r.partition("=") for r in opts.root)]
    roots.append(("this", ROOT))
    ctx = mp.get_context("spawn")
    with EmbeddedRedis() as server:
        namespace = "live"
        writers = [(e, a) for e in range(opts.engines) for a in range(2)]
        queue = ctx.Queue()
        start_at = time.time() + 12.0
        run_for = 8.0 + opts.rounds * len(roots) * (2 * opts.seconds + 4.0)
        drivers = [
            ctx.Process(
                target=drive, args=(server.url, namespace, writers[d::2], run_for, start_at, queue, 1, 0.0)
            )
            for d in range(2)
        ]
        for p in drivers:
            p.start()
        time.sleep(max(0.0, start_at + 4.0 - time.time()))  # every writer flushed a few times
        print(f"\n{opts.engines} engines x 2 writers flushing every second; CPU ms each")
        print(f"    {'':<10}{'/load refresh':>15}{'/watch read':>13}{'events a read':>15}{'load avg':>10}")
        for _ in range(opts.rounds):
            for name, root in roots:
                r = measure(root, server.url, namespace, opts.seconds)
                print(
                    f"    {name:<10}{r['refresh_ms']:>15.1f}{r['read_ms']:>13.1f}"
                    f"{r['events_per_read']:>15.0f}{os.getloadavg()[0]:>10.1f}",
                    flush=True,
                )
        for p in drivers:  # done: a driver behind on a loaded machine would send its late flushes still
            p.terminate()
            p.join()


if __name__ == "__main__":
    main()
