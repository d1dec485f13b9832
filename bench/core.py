"""Core benchmarks: record cost, flush cost by size, scrape cost by engine count.

Prints, in one run and against a private redis-server on a free loopback port:

(a) the cost of a record call next to prometheus_client's in-process Counter.inc and
    Histogram.observe for the same updates (ratio; target <= 2x);
(b) flush time against the number of fields (10 .. 10,000): round trips (target: 1) and ms;
(c) scrape time (read + exposition) against the number of engines (1 .. 256) with ~40 series
    each: round trips (target: 1) and ms, and ms per engine (target: roughly flat = linear);
(d) record-call latency while the flusher collects 10,000 and 100,000 pending series (p50,
    p99.9, worst; target: worst under 5 ms), next to the same loop with no flusher (baseline).

Usage: python bench/core.py [--quick]
"""

from __future__ import annotations

import argparse
import array
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from redis_stats import Catalog, RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.tools.embedded import EmbeddedRedis

BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


def per_call_ns(stmt, number: int, repeat: int = 5) -> float:
    """Best-of-*repeat* nanoseconds per call of *stmt*."""
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e9


class RoundTrips:
    """Counts writes to Redis sockets (each one round trip: every request here waits for its reply)."""

    count = 0
    _installed = False

    def __init__(self, client=None) -> None:
        if not RoundTrips._installed:
            from redis.connection import AbstractConnection

            original = AbstractConnection.send_packed_command

            def counted(conn, *args, **kw):
                RoundTrips.count += 1
                return original(conn, *args, **kw)

            AbstractConnection.send_packed_command = counted
            RoundTrips._installed = True

    @property
    def trips(self) -> int:
        return RoundTrips.count

    def reset(self) -> None:
        RoundTrips.count = 0


def bench_record(n: int) -> list[tuple[str, float, float]]:
    cat = Catalog()
    cat.counter("tokens", "t")
    cat.histogram("lat", "l", buckets=BUCKETS)
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace="bench")
    writer = StatsWriter(cfg, cat, start=False)  # no flusher: measures the record call alone
    ours_inc = writer.counter("tokens").labels(engine=0).inc
    ours_obs = writer.histogram("lat").labels(engine=0).observe
    reg = CollectorRegistry()
    theirs_inc = Counter("tokens", "t", ["engine"], registry=reg).labels("0").inc
    theirs_obs = Histogram("lat", "l", ["engine"], buckets=BUCKETS, registry=reg).labels("0").observe
    rows = []
    for name, ours, theirs in (
        ("counter inc", lambda: ours_inc(1), lambda: theirs_inc(1)),
        ("histogram observe", lambda: ours_obs(0.07), lambda: theirs_obs(0.07)),
    ):
        a, b = per_call_ns(ours, n), per_call_ns(theirs, n)
        rows.append((name, a, b))
    writer._closed = True
    return rows


def bench_flush(url: str, sizes: list[int], repeats: int) -> list[tuple[int, int, float]]:
    rows = []
    for size in sizes:
        cat = Catalog()
        cat.counter("c", "c", labels=["i"])
        cfg = StatsConfig(url=url, namespace=f"bench-flush-{size}", max_series_per_metric=size + 1)
        writer = StatsWriter(cfg, cat, engines=[0], start=False)
        trips = RoundTrips(writer._client)
        children = [writer.counter("c").labels(engine=0, i=str(i)) for i in range(size)]
        for c in children:
            c.inc()
        writer.flush()  # first flush loads the script and stores the catalogue
        times = []
        trips.reset()
        for _ in range(repeats):
            for c in children:
                c.inc()
            t0 = time.perf_counter()
            assert writer.flush()
            times.append(time.perf_counter() - t0)
        rows.append((size, trips.trips // repeats, statistics.median(times) * 1e3))
        writer.close()
    return rows


def bench_scrape(
    url: str, engine_counts: list[int], repeats: int
) -> list[tuple[int, int, int, float, float]]:
    cat = Catalog()
    for i in range(20):
        cat.counter(f"counter_{i}", "c")
    for i in range(16):
        cat.gauge(f"gauge_{i}", "g")
    for i in range(4):
        cat.histogram(f"hist_{i}", "h", buckets=BUCKETS)
    rows = []
    for n in engine_counts:
        cfg = StatsConfig(url=url, namespace=f"bench-scrape-{n}")
        writer = StatsWriter(cfg, cat, engines=list(range(n)), start=False)
        for e in range(n):
            for i in range(20):
                writer.counter(f"counter_{i}").labels(engine=e).inc(e + i)
            for i in range(16):
                writer.gauge(f"gauge_{i}").labels(engine=e).set(i)
            for i in range(4):
                h = writer.histogram(f"hist_{i}").labels(engine=e)
                for v in BUCKETS:
                    h.observe(v)
        assert writer.flush()
        reader = StatsReader(cfg, cat)
        trips = RoundTrips(reader._client)
        collector = RedisCollector(reader)
        reg = CollectorRegistry()
        reg.register(RedisCollector(reader))
        text = collector.render_text()  # warm: field caches, engine list
        generate_latest(reg)
        samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        trips.reset()
        fast, slow = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            collector.render_text()
            fast.append(time.perf_counter() - t0)
        rt = trips.trips // repeats
        for _ in range(repeats):
            t0 = time.perf_counter()
            generate_latest(reg)
            slow.append(time.perf_counter() - t0)
        rows.append((n, samples, rt, statistics.median(fast) * 1e3, statistics.median(slow) * 1e3))
        writer.close()
        reader.close()
    return rows


def bench_record_latency(url: str, series: int, seconds: float, *, flusher: bool) -> dict[str, float]:
    """Time every ``inc`` of one thread that keeps *series* series dirty, with or without a flusher.

    The thread cycles through all the series, so every flush finds *series* pending ones: the
    flusher's collecting and encoding of them is what a record call may wait for.
    """
    cat = Catalog()
    cat.counter("c", "c", labels=["i"])
    cfg = StatsConfig(
        url=url,
        namespace=f"bench-lat-{series}-{int(flusher)}",
        max_series_per_metric=series + 1,
        flush_interval=0.5,
    )
    writer = StatsWriter(cfg, cat, engines=[0], start=False)
    incs = [writer.counter("c").labels(engine=0, i=str(i)).inc for i in range(series)]
    if flusher:
        writer.flush()  # loads the script; the steady state is what is measured
        writer.start()
    clock = time.perf_counter_ns
    samples = array.array("q")
    stop = clock() + int(seconds * 1e9)
    flushes_before = writer.stats.flushes
    while clock() < stop:
        for inc in incs:
            t0 = clock()
            inc(1)
            samples.append(clock() - t0)
    flushes = writer.stats.flushes - flushes_before
    writer.close()
    ordered = sorted(samples)
    n = len(ordered)
    return {
        "calls": n,
        "p50_us": ordered[n // 2] / 1e3,
        "p999_us": ordered[min(n - 1, int(n * 0.999))] / 1e3,
        "worst_ms": ordered[-1] / 1e6,
        "over_5ms": sum(1 for x in ordered[-1000:] if x > 5e6),
        "flushes": flushes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--only", choices="abcd", help="run only this section")
    opts = parser.parse_args()
    n = 20_000 if opts.quick else 200_000
    repeats = 3 if opts.quick else 10

    def wanted(section: str) -> bool:
        return opts.only in (None, section)

    if wanted("a"):
        print("(a) record cost, ns per call (best of 5)")
        print(f"    {'update':<20}{'redis_stats':>14}{'prometheus_client':>20}{'ratio':>8}")
        for name, ours, theirs in bench_record(n):
            print(f"    {name:<20}{ours:>14.0f}{theirs:>20.0f}{ours / theirs:>8.2f}")

    with EmbeddedRedis() as server:
        if wanted("b"):
            print(f"\n(b) flush cost by fields (median of {repeats}; server {Path(server.binary).name})")
            print(f"    {'fields':>8}{'round trips':>14}{'ms':>10}{'us/field':>10}")
            for size, trips, ms in bench_flush(server.url, [10, 100, 1000, 10_000], repeats):
                print(f"    {size:>8}{trips:>14}{ms:>10.2f}{ms * 1000 / size:>10.2f}")

        if wanted("c"):
            print(f"\n(c) scrape cost by engines, ~40 series each (median of {repeats})")
            print(
                f"    {'engines':>8}{'samples':>10}{'round trips':>13}{'exporter ms':>13}{'ms/engine':>11}"
                f"{'generate_latest ms':>20}"
            )
            scrapes = bench_scrape(server.url, [1, 8, 64, 256], repeats)
            for engines, samples, trips, fast_ms, slow_ms in scrapes:
                print(
                    f"    {engines:>8}{samples:>10}{trips:>13}{fast_ms:>13.2f}{fast_ms / engines:>11.3f}"
                    f"{slow_ms:>20.2f}"
                )
            print("    (exporter: RedisCollector.render_text, what /metrics serves; generate_latest: the")
            print("     same collector registered in a prometheus_client registry)")

        seconds = 3.0 if opts.quick else 10.0
        if not wanted("d"):
            return
        print(f"\n(d) record latency while the flusher collects N pending series ({seconds:.0f} s each)")
        print(
            f"    {'series':>8}{'flusher':>9}{'calls':>11}{'flushes':>9}{'p50 us':>9}{'p99.9 us':>10}"
            f"{'worst ms':>10}{'>5 ms':>7}{'worst/baseline':>16}"
        )
        for series in (10_000, 100_000):
            base = bench_record_latency(server.url, series, seconds, flusher=False)
            loaded = bench_record_latency(server.url, series, seconds, flusher=True)
            for label, row in (("no", base), ("yes", loaded)):
                print(
                    f"    {series:>8}{label:>9}{row['calls']:>11}{row['flushes']:>9}{row['p50_us']:>9.2f}"
                    f"{row['p999_us']:>10.2f}{row['worst_ms']:>10.2f}{row['over_5ms']:>7}"
                    f"{row['worst_ms'] / base['worst_ms']:>16.1f}"
                )
        print("    (one thread times each inc; the flusher flushes every 0.5 s; target: worst under 5 ms)")


if __name__ == "__main__":
    main()
