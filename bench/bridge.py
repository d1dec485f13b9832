"""What one bridged source costs per scrape (issue 26), for a full vLLM-shaped body.

The source is tests/helpers/metrics_source.py in its own process (every family of the vLLM
catalogue, vLLM's ``engine`` label, traffic between scrapes so every counter and histogram
changes), served by prometheus_client on loopback; Redis is a private redis-server (never 6379).
Measured in the same run, interleaved, so the machine's noise hits both alike:

- **bridge CPU per scrape** (this process's CPU time: fetch, parse, record, flush), against the
  **baseline** of a plain scrape: the same fetch and prometheus_client's parse of the body, what
  any Prometheus-style scraper pays. The ratio is what storing the body adds.
- **Redis server time per flush** (``INFO commandstats``, ``usec_per_call`` of EVALSHA; the
  flushes of rounding-tie corrections included), against the floor of one HSET of the same chunk
  fields and values (the bytes a flush must store), plain and from a one-line script, and an
  ordinary writer's flush of as many changed series (counters bumped by its record calls).

Usage: python bench/bridge.py [--scrapes 40] [--engines 1]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from redis_stats import StatsConfig  # noqa: E402
from redis_stats.integrations.bridge import BridgedSource  # noqa: E402
from redis_stats.integrations.bridge.fetch import ACCEPT, SourceURL, fetch  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis, free_port  # noqa: E402


def commandstats(client: redis.Redis, name: str) -> tuple[int, int]:
    """(calls, usec) of command *name* so far."""
    stats = client.info("commandstats").get(f"cmdstat_{name}", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=40)
    parser.add_argument("--engines", type=int, default=1)
    args = parser.parse_args()
    port = free_port()
    helper_args = ["--port", str(port), "--catalog", "vllm", "--engines", str(args.engines)]
    helper = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.metrics_source", *helper_args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    assert helper.stdout is not None and helper.stdout.readline() == b"ready\n"
    url = f"http://127.0.0.1:{port}/metrics"
    step = f"http://127.0.0.1:{port}/step?n=1"
    try:
        with EmbeddedRedis() as server:
            client = redis.Redis.from_url(server.url)
            config = StatsConfig(url=server.url, namespace="bench-bridge")
            source = BridgedSource(url, config, engine_label="engine", known=vllm_catalog(), accept="text")
            plain = SourceURL.parse(url)
            body = fetch(plain, accept=ACCEPT["text"], timeout=10, max_bytes=1 << 26).data
            families = list(text_string_to_metric_families(body.decode()))
            series = sum(len(f.samples) for f in families)
            assert source.scrape(), source.stats  # warm-up: the specs and every chunk's names
            bridge_cpu, plain_cpu = [], []
            before = commandstats(client, "evalsha")
            for _ in range(args.scrapes):
                urlopen(step)
                t = time.process_time()
                assert source.scrape(), source.stats
                bridge_cpu.append(time.process_time() - t)
                t = time.process_time()
                resp = fetch(plain, accept=ACCEPT["text"], timeout=10, max_bytes=1 << 26)
                list(text_string_to_metric_families(resp.data.decode()))
                plain_cpu.append(time.process_time() - t)
            after = commandstats(client, "evalsha")
            flushes = after[0] - before[0]
            flush_us = (after[1] - before[1]) / max(1, flushes)
            # The floor: one HSET of the fields a flush stores (every chunk of the engine hashes).
            chunk_fields: dict[bytes, bytes] = {}
            for key in client.scan_iter(match="rs:{bench-bridge}:v2:e:*:c"):
                chunk_fields.update({k: v for k, v in client.hgetall(key).items() if k.startswith(b"@")})
            hb = commandstats(client, "hset")
            for _ in range(args.scrapes):
                client.hset("bench:floor", mapping=chunk_fields)
            ha = commandstats(client, "hset")
            floor_us = (ha[1] - hb[1]) / max(1, ha[0] - hb[0])
            # ... and the same HSET from a script (what any one-script flush pays on top).
            script = client.register_script("return redis.call('HSET', KEYS[1], unpack(ARGV))")
            flat = [x for pair in chunk_fields.items() for x in pair]
            script(keys=["bench:floor2"], args=flat)
            lb = commandstats(client, "evalsha")
            for _ in range(args.scrapes):
                script(keys=["bench:floor2"], args=flat)
            la = commandstats(client, "evalsha")
            lua_us = (la[1] - lb[1]) / max(1, la[0] - lb[0])
            # ... and an ordinary writer flushing as many changed series (counters) as a scrape.
            from redis_stats import Catalog, StatsWriter

            cat = Catalog()
            cat.counter("bench_series", "One series per sample of the body.", labels=["i"])
            plain_writer = StatsWriter(config.replace(namespace="bench-plain"), cat, engines=[0], start=False)
            children = [plain_writer.counter("bench_series").labels(0, i=str(i)) for i in range(series)]
            for child in children:
                child.inc()
            plain_writer.flush()
            wb = commandstats(client, "evalsha")
            for _ in range(args.scrapes):
                for child in children:
                    child.inc()
                plain_writer.flush()
            wa = commandstats(client, "evalsha")
            writer_us = (wa[1] - wb[1]) / max(1, wa[0] - wb[0])
            plain_writer.close()
            source.close()
    finally:
        helper.kill()
        helper.wait()
    b, p = statistics.median(bridge_cpu) * 1e3, statistics.median(plain_cpu) * 1e3
    shape = f"{len(body):,} bytes, {len(families)} families, {series} samples, {args.engines} engine(s)"
    print(f"vLLM-shaped body: {shape}")
    print(f"bridge CPU per scrape (fetch+parse+record+flush): {b:.2f} ms (median of {args.scrapes})")
    print(f"baseline, fetch+parse only:                      {p:.2f} ms  -> ratio {b / p:.2f}x")
    print(f"Redis server time per flush (EVALSHA):           {flush_us:.0f} us over {flushes} flushes")
    print(
        f"an ordinary writer, {series} counters changed:".ljust(49)
        + f"{writer_us:.0f} us  -> ratio {flush_us / writer_us:.2f}x"
    )
    ratio = flush_us / floor_us
    print(f"floor, one HSET of the same chunk fields:        {floor_us:.0f} us  -> ratio {ratio:.2f}x")
    print(
        f"floor, that HSET from a one-line script:         {lua_us:.0f} us  -> ratio {flush_us / lua_us:.2f}x"
    )


def urlopen(url: str) -> None:
    import urllib.request

    urllib.request.urlopen(url, timeout=30).read()


if __name__ == "__main__":
    main()
