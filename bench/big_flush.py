"""A writer's first flush of many series (issue 33): its time, its calls and their largest size.

Starts one private redis-server (a free loopback port, never 6379). For each shape, a new writer
records one value into each of its series (counters of one metric, ``PER_ENGINE`` an engine, over
``engines`` engines), then one ``flush()`` sends them all: the time of that flush (wall clock,
best of ``--rounds``, a new namespace each), how many ``flush.lua`` calls it made and the most
words one call sent (``EVALSHA``, SHA, key count, keys, arguments: ElastiCache Serverless refuses
more than 3,999).

Run it on a checkout before the split and on one after, one after the other, to compare.

Usage: python bench/big_flush.py [--rounds 5] [--shapes 50000x1,50000x100,50000x2000,200000x1]
       (each shape: series x engines)
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

import redis

from redis_stats import Catalog, StatsConfig, StatsWriter
from redis_stats._scripts import load_script
from redis_stats.tools.embedded import EmbeddedRedis

FLUSH_SHA = hashlib.sha1(load_script("flush").encode()).hexdigest()


class Counting(redis.Redis):
    """A client that counts the words of every flush call it sends."""

    calls: list[int]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args and args[0] == "EVALSHA" and args[1] == FLUSH_SHA:
            self.calls.append(len(args))
        return super().execute_command(*args, **options)


def first_flush(url: str, namespace: str, series: int, engines: int) -> tuple[float, list[int]]:
    """Seconds of one writer's first flush of *series* counters over *engines*, and its calls."""
    cat = Catalog()
    cat.counter("requests", "Finished requests.", labels=["reason"])
    cfg = StatsConfig(url=url, namespace=namespace, max_series_per_metric=series)
    client = Counting.from_url(url)
    client.calls = []
    w = StatsWriter(cfg, cat, client=client, start=False)
    per = series // engines
    counter = w.counter("requests")
    for e in range(engines):
        for i in range(per):
            counter.labels(engine=e, reason=f"r{i}").inc(i + 1)
    started = time.perf_counter()
    assert w.flush() and not w.pending()
    took = time.perf_counter() - started
    calls = list(client.calls)
    w.close()
    client.execute_command("FLUSHALL")
    return took, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", default="50000x1,50000x100,50000x2000,200000x1")
    opts = parser.parse_args()
    with EmbeddedRedis() as server:
        for shape in opts.shapes.split(","):
            series, engines = (int(x) for x in shape.split("x"))
            best, calls = min(
                first_flush(server.url, f"big{shape}-{r}", series, engines) for r in range(opts.rounds)
            )
            print(
                f"{series:>7} series over {engines:>5} engines: first flush {best * 1000:7.1f} ms, "
                f"{len(calls)} call(s), largest {max(calls)} words"
            )


if __name__ == "__main__":
    main()
