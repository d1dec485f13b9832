"""The endpoint view's cost (issue 34): ``/metrics?endpoint=<id>`` against ``/metrics`` of one
pod's engines (the in-pod ``local`` view, an exporter of those 4 engines), and ``/endpoints``.

A fleet of *engines* engines in endpoints of 4 (one writer of 4 engines each, vLLM's catalogue,
every family recorded once per engine: ~1 series each), in a private redis-server. Each body is
fetched over HTTP from a running exporter, best and median of *rounds* rounds, and its size.

    python bench/endpoints.py [--engines 1024] [--per-endpoint 4] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig, StatsReader, StatsWriter  # noqa: E402
from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.roles import VLLM_ROLES  # noqa: E402
from redis_stats.server import Exporter  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402


def catalog():  # type: ignore[no-untyped-def]
    return vllm_catalog(cache_config_labels=("block_size", "num_gpu_blocks"))


def fill(writer: StatsWriter, engine: int) -> None:
    """Every family of the catalogue once for *engine* (label values ``x``; the protocol ones real)."""
    for spec in catalog():
        labels = {name: "x" for name in spec.labels}
        if "model_name" in labels:
            labels["model_name"] = "m"
        if spec.name == "vllm:cache_config_info":
            labels = {"block_size": "16", "num_gpu_blocks": str(1000 + engine)}
        handle = writer.metric(spec.name).labels(engine, **labels)
        if spec.kind == COUNTER:
            handle.inc(engine + 1)
        elif spec.kind == GAUGE:
            handle.set(engine % 7 + 1)
        elif spec.kind == HISTOGRAM:
            handle.observe(0.1 * (engine % 5 + 1))


def _sent(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def timed(url: str, rounds: int, client: redis.Redis) -> tuple[float, float, int, float]:
    """Best and median seconds, the body's bytes, and the bytes Redis sent per request."""
    times, size = [], 0
    before = _sent(client)
    for _ in range(rounds):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as r:
            size = len(r.read())
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times), size, (_sent(client) - before) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=1024)
    parser.add_argument("--per-endpoint", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    opts = parser.parse_args()
    server = EmbeddedRedis().start()
    cfg = StatsConfig(url=server.url, namespace="bench-endpoints")
    writers = []
    for first in range(0, opts.engines, opts.per_endpoint):
        engines = list(range(first, first + opts.per_endpoint))
        w = StatsWriter(
            cfg.replace(endpoint=f"10.0.{first // 256}.{first % 256}:8000"),
            catalog(),
            engines=engines,
            start=False,
        )
        for e in engines:
            fill(w, e)
        assert w.flush()
        writers.append(w)
    pod = [0, 1, 2, 3][: opts.per_endpoint]
    fleet = Exporter(StatsReader(cfg, catalog()), port=0, roles=VLLM_ROLES).start()
    local = Exporter(StatsReader(cfg, catalog()), port=0, engines=pod, roles=VLLM_ROLES).start()
    endpoint = "10.0.0.0:8000"
    rows = [
        ("/metrics of the pod's engines (in-pod local view)", local.url + "/metrics"),
        (f"/metrics?endpoint={endpoint} (fleet exporter)", fleet.url + "/metrics?endpoint=" + endpoint),
        (
            f"/metrics?endpoint=self-equivalent (in-pod view, {endpoint})",
            local.url + "/metrics?endpoint=" + endpoint,
        ),
        ("/endpoints (fleet exporter)", fleet.url + "/endpoints"),
        ("/metrics whole (fleet exporter)", fleet.url + "/metrics"),
    ]
    print(
        f"{opts.engines} engines in {len(writers)} endpoints of {opts.per_endpoint}; "
        f"{opts.rounds} rounds each"
    )
    base = None
    client = redis.Redis.from_url(server.url)
    for name, url in rows:
        timed(url, 2, client)  # warm: plans, layouts, the endpoint map
        rounds = opts.rounds if "whole" not in name else max(3, opts.rounds // 5)
        best, median, size, sent = timed(url, rounds, client)
        if base is None:
            base = (best, median, size, sent)
        print(
            f"{name:62s} {size / 1024:9.1f} KB ({size / base[2]:5.2f}x)  best {best * 1000:7.1f} ms "
            f"({best / base[0]:5.2f}x)  median {median * 1000:7.1f} ms ({median / base[1]:5.2f}x)  "
            f"Redis sent {sent / 1024:8.1f} KB/request ({sent / base[3]:5.2f}x)"
        )
    fleet.close()
    local.close()
    for w in writers:
        w.close()
    server.close()


if __name__ == "__main__":
    main()
