"""Redis memory per engine and per series (MEMORY USAGE), with the full vLLM catalogue.

Engines are filled by simulated API servers (every counter and histogram of the catalogue gets
data, as in a busy deployment); then every key of the namespace is measured.

Usage: python bench/memory.py [--engines 8] [--api-servers 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.connection import make_client
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.keys import Keys
from redis_stats.tools.embedded import EmbeddedRedis
from redis_stats.tools.simulate import SimulatedApiServer


def fill(url: str, namespace: str, engines: int, api_servers: int, steps: int = 200) -> None:
    """Simulate *api_servers* writers per engine for *steps* steps and flush."""
    cfg = StatsConfig(url=url, namespace=namespace)
    cat = vllm_catalog()
    for api in range(api_servers):
        writer = StatsWriter(cfg, cat, engines=list(range(engines)), start=False)
        sims = [
            SimulatedApiServer(VllmRecorder(writer, "model", [e]), e, seed=api * 1000 + e)
            for e in range(engines)
        ]
        now = time.monotonic()
        for step in range(steps):
            for sim in sims:
                sim.step(now + step * 0.05)
        assert writer.flush()
        writer._closed = True


def measure(url: str, namespace: str) -> dict[str, int]:
    """MEMORY USAGE of every key of the namespace, by kind of key."""
    client = make_client(StatsConfig(url=url, namespace=namespace))
    keys = Keys(namespace)
    out: dict[str, int] = {}
    for key in client.scan_iter(match=keys.prefix + "*", count=1000):
        kind = key[len(keys.prefix) :]
        kind = "e:*:c" if kind.endswith(":c") else "e:*:g" if kind.endswith(":g") else kind.split(":")[0]
        out[kind] = out.get(kind, 0) + int(client.memory_usage(key, samples=0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--api-servers", type=int, default=2)
    opts = parser.parse_args()
    with EmbeddedRedis() as server:
        fill(server.url, "mem", opts.engines, opts.api_servers)
        usage = measure(server.url, "mem")
        snap = StatsReader(StatsConfig(url=server.url, namespace="mem"), vllm_catalog()).snapshot()
        client = make_client(StatsConfig(url=server.url))
        fields = sum(client.hlen(Keys("mem").counters(e)) for e in snap.engines)
    series = sum(len(e.counters) + len(e.gauges) + len(e.histograms) for e in snap.engines.values())
    per_engine = (usage.get("e:*:c", 0) + usage.get("e:*:g", 0)) / opts.engines
    total = sum(usage.values())
    print(
        f"Redis memory, full vLLM catalogue, {opts.engines} engines x {opts.api_servers} API-server writers"
    )
    for kind, n in sorted(usage.items(), key=lambda kv: -kv[1]):
        print(f"    {kind:<14}{n:>12,} bytes")
    print(f"    {'total':<14}{total:>12,} bytes")
    print(
        f"    per engine (its two hashes): {per_engine:,.0f} bytes; {series / opts.engines:.0f} series, "
        f"{fields / opts.engines:.0f} fields per engine"
    )
    print(
        f"    per series: {per_engine / (series / opts.engines):,.0f} bytes; per field: "
        f"{per_engine / (fields / opts.engines):,.0f} bytes"
    )


if __name__ == "__main__":
    main()
