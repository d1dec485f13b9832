"""What a ``/load`` refresh and a ``/watch`` read cost the exporter's CPU while a fleet flushes.

bench/load_feed.py measures a refresh over a still store; in a live fleet the lists a read plans
from (``engines``, ``writers``, ordered by heartbeat) change order with every flush, which a
still store never shows. Here ``bench/fleet.py``'s drivers send 1,024 engines x 2 writers'
realistic flushes (load entries in each, one a second per writer) to a private Redis while, in
this process, a :class:`~redis_stats.server.states.load_feed.LoadFeed` refreshes and a
:class:`~redis_stats.server.states.watch_feed.WatchFeed` reads as the exporter's threads do: printed,
the CPU (``time.process_time``) per refresh and per feed read, and the events a feed read makes.

Usage: python bench/live_refresh.py [--engines 1024] [--seconds 10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fleet import drive  # noqa: E402

from redis_stats import StatsConfig, StatsReader  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.server.states.load_feed import LoadFeed  # noqa: E402
from redis_stats.server.states.watch_feed import WatchFeed  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402


def cpu_ms_each(step: object, seconds: float, pause: float) -> tuple[float, int]:
    """CPU ms per call of *step* (a callable) called for *seconds*, *pause* s apart; the calls."""
    calls, cpu, end = 0, 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.process_time()
        step()  # type: ignore[operator]
        cpu += time.process_time() - t
        calls += 1
        time.sleep(pause)
    return 1000 * cpu / calls, calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=10.0)
    opts = parser.parse_args()
    ctx = mp.get_context("spawn")
    with EmbeddedRedis() as server:
        namespace = "live"
        writers = [(e, a) for e in range(opts.engines) for a in range(2)]
        queue = ctx.Queue()
        start_at = time.time() + 12.0
        run_for = 8.0 + 2 * opts.seconds
        drivers = [
            ctx.Process(
                target=drive, args=(server.url, namespace, writers[d::2], run_for, start_at, queue, 1, 0.0)
            )
            for d in range(2)
        ]
        for p in drivers:
            p.start()
        time.sleep(max(0.0, start_at + 4.0 - time.time()))  # every writer flushed a few times
        reader = StatsReader(StatsConfig(url=server.url, namespace=namespace), vllm_catalog())
        load = LoadFeed(reader)
        refresh_ms, refreshes = cpu_ms_each(load._refresh_once, opts.seconds, 0.25)
        feed = WatchFeed(SimpleNamespace(reader=reader), lambda: load)  # type: ignore[arg-type]
        feed._read_once()
        first = feed.seq
        read_ms, reads = cpu_ms_each(feed._read_once, opts.seconds, 0.02)
        for _ in drivers:
            queue.get()
        for p in drivers:
            p.join()
    print(f"\n{opts.engines} engines x 2 writers flushing every second")
    print(f"    /load refresh: {refresh_ms:.1f} ms of CPU each ({refreshes} refreshes, 0.25 s apart)")
    print(
        f"    /watch read:   {read_ms:.1f} ms of CPU each ({reads} reads, 20 ms apart; "
        f"{(feed.seq - first) / reads:.0f} events a read)"
    )


if __name__ == "__main__":
    main()
