"""The load feed (``GET /load``) at N engines x 2 API-server writers with the full vLLM catalogue.

Fills one private redis-server as ``bench/scrape_full.py`` does (every engine gets simulated
vLLM traffic through ``VllmRecorder`` from 2 writers, with ``load=VLLM_LOAD``: each flush also
stores the writers' load entries, ``load.lua``), then measures, against the snapshot read of the
same store in the same run (what ``/snapshot`` and ``/metrics`` read, the baseline):

- what one refresh of the feed reads from Redis: the bytes of the reply, and Redis' own time per
  read (``INFO commandstats``: the sum of every command's usec over the reads, divided by them);
- the refresh's CPU in the exporter (``StatsReader.load`` + the body and its ETag);
- the server's own work for a request (``LoadFeed.answer``: the kept body and its ETag), p99 over
  20,000 calls while the refresher runs;
- ``/load`` over HTTP on loopback, as a router polls it (a new connection per request, as
  http.server's HTTP/1.0 answers): latency p50/p99 of a ``200`` (gzip) and of a ``304``
  (``If-None-Match``), seen by the client (an upper bound of the server's time), with the
  refresher reading every 0.25 s and, as the baseline, with no refresh during the requests;
- the body, plain and gzipped.

Usage: python bench/load_feed.py [--engines 64,1024] [--requests 500]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from scrape_full import reply_bytes  # noqa: E402  (bench/: the script's own folder)

from redis_stats import StatsConfig, StatsReader, StatsWriter  # noqa: E402
from redis_stats._core.steps import run  # noqa: E402
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.reader import LOAD  # noqa: E402
from redis_stats.server import Exporter  # noqa: E402
from redis_stats.server.states.load_feed import LoadFeed  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402
from redis_stats.tools.simulate import SimulatedApiServer  # noqa: E402
from tests.prometheus import views  # noqa: E402

CACHE = {"block_size": "16", "num_gpu_blocks": "4096", "gpu_memory_utilization": "0.9"}


def fill(url: str, namespace: str, engines: int) -> list[StatsWriter]:
    """2 writers of every engine, 20 engine steps each, one flush each (with the load entries)."""
    cfg = StatsConfig(url=url, namespace=namespace, socket_timeout_ms=30_000, stale_after=3600)
    made = []
    for w in range(2):
        catalog = vllm_catalog(cache_config_labels=tuple(sorted(CACHE)))
        writer = StatsWriter(
            cfg, catalog, engines=list(range(engines)), start=False, role=f"api{w}", load=VLLM_LOAD
        )
        recorders = [VllmRecorder(writer, "model", [e]) for e in range(engines)]
        for recorder in recorders:  # vLLM's cache configuration: the KV capacity
            recorder.record_cache_config(CACHE)
        sims = [SimulatedApiServer(r, e, seed=w * 100_000 + e) for e, r in enumerate(recorders)]
        now = time.monotonic()
        for step in range(20):
            for sim in sims:
                sim.step(now + step * 0.05)
        assert writer.flush()
        made.append(writer)
    return made


def server_usec(client: redis.Redis) -> float:
    """Every command's usec so far (INFO commandstats), the INFO calls themselves left out."""
    stats = client.info("commandstats")
    return sum(float(v["usec"]) for k, v in stats.items() if k != "cmdstat_info")


def redis_cost(client: redis.Redis, fn: Any, reads: int) -> float:
    """Redis' own µs per call of *fn* (a read), over *reads* calls."""
    fn()
    before = server_usec(client)
    for _ in range(reads):
        fn()
    return (server_usec(client) - before) / reads


def best_ms(fn: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def http_latencies(port: int, requests: int, headers: dict[str, str]) -> tuple[list[float], int, int]:
    """Client-side latency (s) of *requests* GET /load, the last status and body size."""
    out, status, size = [], 0, 0
    for _ in range(requests):
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/load", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        out.append(time.perf_counter() - t0)
        status, size = resp.status, len(body)
    return sorted(out), status, size


def p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] * 1e3


def measure(url: str, engines: int, requests: int) -> dict[str, Any]:
    namespace = f"load{engines}-{int(time.time())}"
    writers = fill(url, namespace, engines)
    cfg = StatsConfig(url=url, namespace=namespace, socket_timeout_ms=30_000, stale_after=3600)
    reader = StatsReader(cfg, vllm_catalog(cache_config_labels=tuple(sorted(CACHE))))  # as the writers
    client = redis.Redis.from_url(url, decode_responses=True)
    view = reader.load()
    assert len(view.engines) == engines and all(e.up and e.writers == 2 for e in view.engines.values())
    assert all(e.kv_cache_capacity_tokens == 16 * 4096 for e in view.engines.values())
    load_reply = run(reader.checked_steps(LOAD, None, False), reader._step)  # what load() reads
    snap_reply = reader.read()
    row: dict[str, Any] = {
        "engines": engines,
        "load_reply_kb": reply_bytes(load_reply) / 1e3,
        "snapshot_reply_kb": reply_bytes(snap_reply) / 1e3,
        "load_redis_us": redis_cost(client, reader.load, 20),
        "snapshot_redis_us": redis_cost(client, reader.read, 5),
        "load_refresh_ms": best_ms(lambda: LoadFeed(reader)._refresh_once(), 5),
        "snapshot_ms": best_ms(reader.snapshot, 3),
    }
    quiet = Exporter(reader, port=0, load_refresh=3600).start()  # the baseline: no refresh meanwhile
    try:
        views.load_feed(quiet).answer()
        base, _, _ = http_latencies(quiet.port, requests, {"Accept-Encoding": "gzip"})
        base_etag = views.load_feed(quiet).answer().etag
        base304, _, _ = http_latencies(quiet.port, requests, {"If-None-Match": base_etag})
    finally:
        quiet.close()
    exporter = Exporter(reader, port=0, load_refresh=0.25).start()
    try:
        views.load_feed(exporter).answer()
        answers = []
        for _ in range(20_000):
            t0 = time.perf_counter()
            views.load_feed(exporter).answer()
            answers.append(time.perf_counter() - t0)
        answers.sort()
        lat, status, size = http_latencies(exporter.port, requests, {"Accept-Encoding": "gzip"})
        assert status == 200
        etag = views.load_feed(exporter).answer().etag
        body = views.load_feed(exporter).answer().body
        lat304, status304, _ = http_latencies(
            exporter.port, requests, {"Accept-Encoding": "gzip", "If-None-Match": etag}
        )
        assert status304 == 304, status304
        row.update(
            answer_p99_us=p(answers, 0.99) * 1e3,
            base_p99_ms=p(base, 0.99),
            base304_p99_ms=p(base304, 0.99),
            body_kb=len(body) / 1e3,
            gzip_kb=size / 1e3,
            http_p50_ms=p(lat, 0.5),
            http_p99_ms=p(lat, 0.99),
            not_modified_p50_ms=p(lat304, 0.5),
            not_modified_p99_ms=p(lat304, 0.99),
            doc_engines=len(json.loads(body)["engines"]),
        )
    finally:
        exporter.close()
        for w in writers:
            w.close()
        reader.close()
        client.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="64,1024")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "load_feed.json"))
    opts = parser.parse_args()
    rows = []
    with EmbeddedRedis() as server:
        for n in (int(x) for x in opts.engines.split(",")):
            rows.append(measure(server.url, n, opts.requests))
    print(
        f"{'engines':>8}{'reads KB':>10}{'(snapshot)':>11}{'Redis us':>10}{'(snapshot)':>11}"
        f"{'refresh ms':>11}{'(snapshot)':>11}{'body KB':>9}{'gzip KB':>9}"
        f"{'200 p50/p99 ms':>16}{'304 p50/p99 ms':>16}"
    )
    for r in rows:
        print(
            f"{r['engines']:>8}{r['load_reply_kb']:>10.1f}{r['snapshot_reply_kb']:>11.0f}"
            f"{r['load_redis_us']:>10.0f}{r['snapshot_redis_us']:>11.0f}"
            f"{r['load_refresh_ms']:>11.1f}{r['snapshot_ms']:>11.0f}{r['body_kb']:>9.1f}{r['gzip_kb']:>9.1f}"
            f"{r['http_p50_ms']:>8.2f}/{r['http_p99_ms']:<7.2f}{r['not_modified_p50_ms']:>8.2f}/"
            f"{r['not_modified_p99_ms']:<7.2f}"
        )
        print(
            f"{'':>8}server's work per request (LoadFeed.answer) p99 {r['answer_p99_us']:.1f} µs; without a "
            f"refresh meanwhile: 200 p99 {r['base_p99_ms']:.2f} ms, 304 p99 {r['base304_p99_ms']:.2f} ms"
        )
        print(
            f"{'':>8}ratios to the snapshot read: bytes {r['load_reply_kb'] / r['snapshot_reply_kb']:.4f}, "
            f"Redis time {r['load_redis_us'] / r['snapshot_redis_us']:.4f}, "
            f"exporter CPU {r['load_refresh_ms'] / r['snapshot_ms']:.4f}"
        )
    Path(opts.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
