"""What a scrape of the exporter costs over HTTP: body size and time by format and encoding.

The vLLM catalogue, N engines filled by the simulated API servers (every label set vLLM writes),
one private redis-server. For each N it fetches ``/metrics`` over loopback HTTP as:

- Prometheus text (the fast renderer) — the baseline of the row,
- the same with ``Accept-Encoding: gzip`` (levels 6, what the exporter uses, and 9, what
  prometheus_client uses, compressed here over the same body for comparison),
- OpenMetrics (what Prometheus asks for by default; generated over ``collect()``), plain and gzip.

    python bench/http_exporter.py [--engines 64,256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import statistics
import time

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.server import Exporter
from redis_stats.tools.embedded import EmbeddedRedis
from redis_stats.tools.simulate import LoadProfile, SimulatedApiServer

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def fill(url: str, namespace: str, engines: int) -> None:
    cfg = StatsConfig(url=url, namespace=namespace)
    writer = StatsWriter(cfg, vllm_catalog(), engines=list(range(engines)), start=False)
    recorder = VllmRecorder(writer, "demo-model", list(range(engines)))
    for e in range(engines):
        sim = SimulatedApiServer(recorder, e, LoadProfile(arrivals_per_s=20.0), seed=e)
        t = time.monotonic()
        for step in range(400):  # 20 simulated seconds: every histogram bucket range gets hits
            sim.step(t + step * 0.05)
    assert writer.flush()
    writer.close()


def fetch(port: int, headers: dict[str, str]) -> tuple[float, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("GET", "/metrics", headers=headers)
    body = conn.getresponse().read()
    took = time.perf_counter() - t0
    conn.close()
    return took, body


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="64,256")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with EmbeddedRedis() as server:
        print(f"{'engines':>8} {'variant':<22}{'bytes':>12}{'ms':>10}{'x text ms':>11}{'x text bytes':>14}")
        for n in (int(x) for x in args.engines.split(",")):
            ns = f"bench-http-{n}"
            fill(server.url, ns, n)
            reader = StatsReader(StatsConfig(url=server.url, namespace=ns), vllm_catalog())
            exporter = Exporter(reader, port=0).start()
            try:
                variants = {
                    "text": {},
                    "text gzip(6)": {"Accept-Encoding": "gzip"},
                    "openmetrics": {"Accept": OPENMETRICS},
                    "openmetrics gzip(6)": {"Accept": OPENMETRICS, "Accept-Encoding": "gzip"},
                }
                rows = {}
                for name, headers in variants.items():
                    fetch(exporter.port, headers)  # warm
                    times, size = [], 0
                    for _ in range(args.repeats):
                        took, body = fetch(exporter.port, headers)
                        times.append(took)
                        size = len(body)
                    rows[name] = (size, statistics.median(times) * 1e3)
                _, plain = fetch(exporter.port, {})
                for level in (6, 9):
                    times = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        packed = gzip.compress(plain, compresslevel=level)
                        times.append(time.perf_counter() - t0)
                    rows[f"  gzip({level}) alone"] = (len(packed), statistics.median(times) * 1e3)
                base_bytes, base_ms = rows["text"]
                for name, (size, ms) in rows.items():
                    ratios = f"{ms / base_ms:>11.2f}{size / base_bytes:>14.3f}"
                    print(f"{n:>8} {name:<22}{size:>12,}{ms:>10.1f}{ratios}")
            finally:
                exporter.close()


if __name__ == "__main__":
    main()
