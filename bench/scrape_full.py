"""Scrape time with the full vLLM catalogue, by engines and API-server writers per engine.

Fills one private redis-server the way a busy fleet does (every engine gets simulated vLLM
traffic through ``VllmRecorder`` from *writers* API servers, 20 engine steps each, then one flush
per writer), then times what the exporter serves for ``/metrics`` (``RedisCollector.render_text``,
the fast text path) and the decoded snapshot (``StatsReader.snapshot``, what ``/snapshot`` and
the prometheus_client path use). Best of several runs: noise on a shared machine only adds.

Imports ``redis_stats`` from the first entry of PYTHONPATH when set, so the same script times two
versions of the package on one machine (issue 15: read figures before and after a format change):

    PYTHONPATH=/path/to/old/checkout python bench/scrape_full.py
    python bench/scrape_full.py

Usage: python bench/scrape_full.py [--engines 64,1024] [--writers 1,2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.keys import SCHEMA_VERSION
from redis_stats.tools.embedded import EmbeddedRedis
from redis_stats.tools.simulate import SimulatedApiServer


def fill(url: str, namespace: str, engines: int, writers: int) -> None:
    """*writers* simulated API servers per engine, 20 steps each, one flush per writer."""
    cfg = StatsConfig(url=url, namespace=namespace)
    cat = vllm_catalog()
    for w in range(writers):
        writer = StatsWriter(cfg, cat, engines=list(range(engines)), start=False, role=f"api{w}")
        sims = [
            SimulatedApiServer(VllmRecorder(writer, "model", [e]), e, seed=w * 100_000 + e)
            for e in range(engines)
        ]
        now = time.monotonic()
        for step in range(20):
            for sim in sims:
                sim.step(now + step * 0.05)
        assert writer.flush()
        writer._closed = True


def best_ms(fn, runs: int) -> float:
    """The fastest of *runs* calls of *fn*, in ms."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="64,1024")
    parser.add_argument("--writers", default="1,2", help="API-server writers per engine")
    opts = parser.parse_args()
    import redis_stats

    print(f"redis_stats from {Path(redis_stats.__file__).parent} (schema {SCHEMA_VERSION})")
    print(f"    {'engines':>8}{'writers/engine':>16}{'samples':>10}{'scrape ms':>11}{'snapshot ms':>13}")
    with EmbeddedRedis() as server:
        for engines in (int(x) for x in opts.engines.split(",")):
            for writers in (int(x) for x in opts.writers.split(",")):
                ns = f"scrape-{engines}-{writers}"
                fill(server.url, ns, engines, writers)
                cfg = StatsConfig(url=server.url, namespace=ns)
                reader = StatsReader(cfg, vllm_catalog())
                collector = RedisCollector(reader)
                text = collector.render_text()  # warm: field caches, engine list
                reader.snapshot()
                runs = 5 if engines >= 256 else 9
                scrape = best_ms(collector.render_text, runs)
                snap = best_ms(reader.snapshot, runs)
                samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
                print(f"    {engines:>8}{writers:>16}{samples:>10}{scrape:>11.1f}{snap:>13.1f}")
                reader.close()


if __name__ == "__main__":
    main()
