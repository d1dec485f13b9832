"""A writer in a host with a large heap: does the flusher stall the host through its garbage collector?

Issue 28. A host such as a vLLM API server keeps millions of live objects; CPython's cyclic
collector runs a *full* (generation 2) collection over all of them once enough objects have
survived the young generations since the last one, in whichever thread allocates next: a pause of
the whole heap's size, in the host's request path. What a flush allocates and keeps (until Redis
confirms it) counts towards that, so a writer can push its host into extra full collections.

This bench builds a host-like heap (``--heap`` live GC-tracked objects, default 3,000,000; the
collector never freezes them unless ``--freeze``), then runs the same record loop twice on the
same heap: one thread calls ``inc()`` on every series in turn (``--metrics`` counters x
``--values`` label values, default 5 x 20,000 = 100,000 pending series every flush, flush interval
``--interval`` 1 s, ``--seconds`` 10 s), first without a flusher (the baseline), then with the
writer's flusher running. It prints per run the worst record call, calls over 5 ms and 50 ms, and
every collection by generation (``gc.callbacks``: count and durations), full collections per
minute; then what one flush of those series allocates (``--per-flush``): the GC-tracked objects it
holds until Redis confirms it, those that lived long enough to be seen by a young collection
(candidates for promotion into the old generation: what brings the next full collection closer),
and the peak of memory it allocates (``tracemalloc``).

Targets: worst call with the flusher within 5 ms of the baseline; full collections per minute at
most one more than the baseline's.

``--first`` (issue 32): the series are new when each loop starts (bound and counted, never
flushed), so the flusher's first flush of all of them, which makes each series' place in the
writer's totals, runs inside the measured loop.

Usage: python bench/host_gc.py [--heap 3000000] [--seconds 10] [--values 20000] [--freeze] [--first]
"""

from __future__ import annotations

import argparse
import array
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis_stats import Catalog, StatsConfig, StatsWriter
from redis_stats.tools.embedded import EmbeddedRedis


class _Node:
    """A host object: tracked by the collector, pointing at another (as a host's graph does)."""

    __slots__ = ("link", "payload")

    def __init__(self, link: object) -> None:
        self.link = link
        self.payload = [link]


def host_heap(n: int) -> list[Any]:
    """About *n* live GC-tracked objects (half instances, half lists), all in the old generation."""
    heap: list[Any] = []
    prev: object = None
    for _ in range(n // 2):
        prev = _Node(prev if len(heap) % 64 else None)
        heap.append(prev)
    gc.collect()
    return heap


class Collections:
    """Every collection between start() and stop(): (generation, seconds), via gc.callbacks."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []
        self._t0 = 0.0
        self._on = False

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self._on:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seen.append((info["generation"], time.perf_counter() - self._t0))

    def start(self) -> None:
        self.seen = []
        self._on = True
        gc.callbacks.append(self)

    def stop(self) -> None:
        self._on = False
        gc.callbacks.remove(self)

    def of(self, generation: int) -> list[float]:
        return [s for g, s in self.seen if g == generation]


def catalog(metrics: int) -> Catalog:
    cat = Catalog()
    for m in range(metrics):
        cat.counter(f"requests_{m}", "requests", labels=["route"])
    return cat


def make_writer(
    url: str, namespace: str, metrics: int, values: int, interval: float
) -> tuple[StatsWriter, list[Any]]:
    cfg = StatsConfig(url=url, namespace=namespace, max_series_per_metric=values + 1, flush_interval=interval)
    writer = StatsWriter(cfg, catalog(metrics), engines=[0], start=False)
    incs = [
        writer.counter(f"requests_{m}").labels(engine=0, route=f"/v1/route/{v}").inc
        for m in range(metrics)
        for v in range(values)
    ]
    return writer, incs


def record_loop(
    url: str,
    namespace: str,
    metrics: int,
    values: int,
    interval: float,
    seconds: float,
    *,
    flusher: bool,
    first: bool = False,
) -> dict[str, Any]:
    """The record loop; with *first*, the series are new (bound, counted, never flushed) when
    it starts, so the flusher's first flush of all of them runs inside it (issue 32)."""
    writer, incs = make_writer(url, namespace, metrics, values, interval)
    for inc in incs:
        inc(1)
    if not first:
        assert writer.flush(), "the first flush (catalogue, every chunk's names) must succeed"
    gc.collect()  # both runs start from the same collector state: what follows is the steady state
    if flusher:
        writer.start()
    seen = Collections()
    seen.start()
    clock = time.perf_counter_ns
    samples = array.array("q")
    flushes0 = writer.stats.flushes
    t_start = clock()
    stop = t_start + int(seconds * 1e9)
    while clock() < stop:
        for inc in incs:
            t0 = clock()
            inc(1)
            samples.append(clock() - t0)
    wall = (clock() - t_start) / 1e9
    seen.stop()
    flushes = writer.stats.flushes - flushes0
    errors = sum(writer.stats.errors.values())
    writer.close()
    ordered = sorted(samples)
    n = len(ordered)
    return {
        "calls": n,
        "flushes": flushes,
        "errors": errors,
        "wall": wall,
        "p50_us": ordered[n // 2] / 1e3,
        "p999_us": ordered[min(n - 1, int(n * 0.999))] / 1e3,
        "worst_ms": ordered[-1] / 1e6,
        "over_5": sum(1 for x in ordered[-100_000:] if x > 5e6),
        "over_50": sum(1 for x in ordered[-100_000:] if x > 50e6),
        "gens": [seen.of(g) for g in range(3)],
    }


def young_survivors(fn: Any) -> int:
    """GC-tracked objects that *fn* keeps alive across at least one young collection.

    Young collections are made frequent (every 100 net new objects) and the older ones never run,
    so every object that survives one stays in generation 1: the growth of generation 1 over each
    young collection is what that collection promoted. Objects that die between two collections
    are never seen, as in a real run.
    """
    promoted = 0
    before = 0

    def cb(phase: str, info: dict[str, int]) -> None:
        nonlocal promoted, before
        if info["generation"] != 0:
            return
        if phase == "start":
            before = len(gc.get_objects(generation=1))
        else:
            promoted += len(gc.get_objects(generation=1)) - before

    old = gc.get_threshold()
    gc.collect()
    gc.set_threshold(100, 1_000_000_000, 1_000_000_000)
    gc.callbacks.append(cb)
    try:
        fn()
    finally:
        gc.callbacks.remove(cb)
        gc.set_threshold(*old)
        gc.collect()
    return promoted


def per_flush(url: str, metrics: int, values: int) -> dict[str, float]:
    """What one flush of metrics x values changed series allocates (steady state: names stored)."""
    writer, incs = make_writer(url, "bench-gc-per-flush", metrics, values, 1.0)
    for inc in incs:
        inc(1)
    assert writer.flush()

    def dirty_all() -> None:
        for inc in incs:
            inc(1)

    dirty_all()
    # Held until Redis confirms: net tracked objects after the batch is built, the collector off.
    gc.collect()
    gc.disable()
    try:
        base = gc.get_count()[0]
        calls = writer.prepare_flushes()
        held = gc.get_count()[0] - base
        keys, args = calls[0][1], calls[0][2]
        reply = writer._script(keys=keys, args=args)
        writer.flush_succeeded(reply, 0.0)
        del calls, keys, args, reply
        left = gc.get_count()[0] - base
    finally:
        gc.enable()
    dirty_all()
    survivors = young_survivors(lambda: writer.flush())
    dirty_all()
    tracemalloc.start()
    t0 = time.perf_counter()
    writer.flush()
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    dirty_all()
    t0 = time.perf_counter()
    assert writer.flush()
    plain = time.perf_counter() - t0
    writer.close()
    return {
        "held": held,
        "left": left,
        "survivors": survivors,
        "peak_mb": peak / 1e6,
        "traced_ms": elapsed * 1e3,
        "flush_ms": plain * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heap", type=int, default=3_000_000, help="live GC-tracked objects of the host")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--metrics", type=int, default=5)
    parser.add_argument("--values", type=int, default=20_000, help="label values per metric")
    parser.add_argument("--interval", type=float, default=1.0, help="flush interval (s)")
    parser.add_argument("--freeze", action="store_true", help="the host calls gc.freeze() after start-up")
    parser.add_argument("--no-loops", action="store_true", help="only the per-flush allocation figures")
    parser.add_argument("--no-per-flush", action="store_true", help="only the record loops")
    parser.add_argument(
        "--first",
        action="store_true",
        help="the series are new when the loops start: the flusher's first flush of all of them "
        "runs inside its loop (the baseline loop records the same new series, no flusher)",
    )
    opts = parser.parse_args()
    series = opts.metrics * opts.values
    with EmbeddedRedis() as server:
        if not opts.no_loops:
            t0 = time.perf_counter()
            heap = host_heap(opts.heap)
            if opts.freeze:
                gc.freeze()
            t_full = min(_timed(gc.collect) for _ in range(3))
            tracked = len(gc.get_objects()) + gc.get_freeze_count()
            print(
                f"host heap: {tracked:,} GC-tracked objects (built in {time.perf_counter() - t0:.1f} s); "
                f"one full collection {t_full * 1e3:.0f} ms"
                + (" (frozen: gc.freeze())" if opts.freeze else "")
            )
            if opts.first:
                print(f"the {series:,} series are new: the flusher's first flush of them runs in its loop")
            print(
                f"record loop: one thread calls inc() on {series:,} series in turn "
                f"({opts.metrics} counters x "
                f"{opts.values:,} label values), {opts.seconds:.0f} s; flush interval {opts.interval} s\n"
            )
            rows = []
            for flusher in (False, True):
                ns = f"bench-gc-{int(flusher)}-{time.time_ns()}"
                rows.append(
                    (
                        flusher,
                        record_loop(
                            server.url,
                            ns,
                            opts.metrics,
                            opts.values,
                            opts.interval,
                            opts.seconds,
                            flusher=flusher,
                            first=opts.first,
                        ),
                    )
                )
            print(
                f"    {'flusher':<9}{'calls':>10}{'flushes':>9}{'p50 us':>8}{'p99.9 us':>9}{'worst ms':>10}"
                f"{'>5 ms':>7}{'>50 ms':>8}  {'collections: gen0 / gen1 / gen2 (max ms)':<42}{'gen2/min':>9}"
            )
            for flusher, r in rows:
                g = r["gens"]
                worst2 = f"{max(g[2]) * 1e3:.0f}" if g[2] else "-"
                cols = f"{len(g[0])} / {len(g[1])} / {len(g[2])} ({worst2})"
                print(
                    f"    {'yes' if flusher else 'no':<9}{r['calls']:>10,}{r['flushes']:>9}"
                    f"{r['p50_us']:>8.2f}"
                    f"{r['p999_us']:>9.2f}{r['worst_ms']:>10.2f}{r['over_5']:>7}{r['over_50']:>8}  {cols:<42}"
                    f"{len(g[2]) * 60 / r['wall']:>9.1f}"
                )
                for gen in range(3):
                    if g[gen]:
                        print(
                            f"        gen{gen}: {len(g[gen])} collections, "
                            f"mean {statistics.mean(g[gen]) * 1e3:.2f} ms, "
                            f"max {max(g[gen]) * 1e3:.2f} ms, total {sum(g[gen]) * 1e3:.0f} ms"
                        )
                if r["errors"]:
                    print(f"        ({r['errors']} failed flushes)")
            base, loaded = rows[0][1], rows[1][1]
            extra = (len(loaded["gens"][2]) / loaded["wall"] - len(base["gens"][2]) / base["wall"]) * 60
            print(
                f"\n    worst call: {loaded['worst_ms']:.2f} ms with the flusher, "
                f"{base['worst_ms']:.2f} ms without "
                f"(+{loaded['worst_ms'] - base['worst_ms']:.2f} ms; target <= +5 ms); "
                "full collections the writer "
                f"adds: {extra:+.1f} per minute (target <= +1)"
            )
            del heap
            gc.collect()
        if opts.no_per_flush:
            return
        f = per_flush(server.url, opts.metrics, opts.values)
        print(f"\none flush of {series:,} changed series (empty heap; steady state, names already stored):")
        print(
            f"    GC-tracked objects held until Redis confirms it: {f['held']:,} "
            f"(after the answer: {f['left']:,})"
        )
        print(f"    GC-tracked objects that lived through a young collection: {f['survivors']:,}")
        print(
            f"    peak memory allocated (tracemalloc): {f['peak_mb']:.1f} MB; flush {f['flush_ms']:.0f} ms "
            f"({f['traced_ms']:.0f} ms traced)"
        )


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
