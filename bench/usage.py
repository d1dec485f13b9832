"""The usage ledger's figures (docs/usage.md, docs/benchmarks.md "Usage"), from one command:

(a) the budget check: :meth:`UsageReader.tenant` of a random tenant of a ledger of N tenants
    (default 100,000; each with a day and an hour bucket), p50/p99/p99.9 over --checks calls,
    beside the floor measured in the same run: one ``HGET`` round trip on the same client; and the
    same check over HTTP (``GET /usage?tenant=``, an exporter with --usage and a bearer token);
(b) memory: ``used_memory`` before and after the ledger, per tenant (every structure: all-time
    totals, the rank, an hour and a day bucket by tenant and by entity) and per tenant-bucket
    (``MEMORY USAGE`` of one hour's two bucket hashes over the fields they hold);
(c) the flush: Redis' own time per entry applied (``INFO commandstats``, ``evalsha``), and the
    Python time of ``UsageRecorder.record`` against prometheus_client's ``Counter.inc`` of one
    labelled child, in the same run.

Usage: python bench/usage.py [--tenants 100000] [--checks 20000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from prometheus_client import CollectorRegistry, Counter  # noqa: E402

from redis_stats import StatsConfig, StatsReader, StatsWriter  # noqa: E402
from redis_stats.keys import Keys  # noqa: E402
from redis_stats.server import Exporter  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402
from redis_stats.usage import Usage, UsageReader, UsageRecorder  # noqa: E402
from redis_stats.usage.layout import UsageKeys, hour_of  # noqa: E402


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def fill(url: str, namespace: str, tenants: int) -> tuple[StatsWriter, UsageRecorder, float]:
    writer = StatsWriter(StatsConfig(url=url, namespace=namespace), start=False)
    rec = UsageRecorder(writer)
    started = time.perf_counter()
    for i in range(tenants):
        rec.record(
            Usage(
                tenant=f"tenant-{i:06d}",
                adapter=None if i % 4 else "lora-sql",
                model="llama-3-8b",
                prompt_tokens=200 + i % 1000,
                cached_prompt_tokens=i % 128,
                generation_tokens=50 + i % 300,
            )
        )
    while rec.pending():
        assert writer.flush()
    return writer, rec, time.perf_counter() - started


def checks(reader: UsageReader, client: redis.Redis, key: str, tenants: int, n: int) -> dict[str, float]:
    rnd = random.Random(7)
    names = [f"tenant-{rnd.randrange(tenants):06d}" for _ in range(n)]
    floor, check = [], []
    for name in names:  # alternated: the machine's noise hits both alike
        t0 = time.perf_counter()
        client.hget(key, name)
        t1 = time.perf_counter()
        got = reader.tenant(name)
        t2 = time.perf_counter()
        assert got.total.get("requests") == 1, name
        floor.append(t1 - t0)
        check.append(t2 - t1)
    ms = 1000.0
    return {
        "floor_p50_ms": statistics.median(floor) * ms,
        "floor_p99_ms": pct(floor, 0.99) * ms,
        "check_p50_ms": statistics.median(check) * ms,
        "check_p99_ms": pct(check, 0.99) * ms,
        "check_p999_ms": pct(check, 0.999) * ms,
    }


def http_checks(url: str, namespace: str, tenants: int, n: int, tmp: Path) -> dict[str, float]:
    import http.client

    tokens = tmp / "tokens"
    tokens.write_text("bench-token-0123456789abcdef\n")
    cfg = StatsConfig(url=url, namespace=namespace)
    exporter = Exporter(StatsReader(cfg), port=0, usage=True, web_token_file=str(tokens)).start()
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=10)
    rnd = random.Random(8)
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            conn.request(
                "GET",
                f"/usage?tenant=tenant-{rnd.randrange(tenants):06d}",
                headers={"Authorization": "Bearer bench-token-0123456789abcdef"},
            )
            resp = conn.getresponse()
            body = resp.read()
            times.append(time.perf_counter() - t0)
            assert resp.status == 200 and json.loads(body)["total"]["requests"] == 1
    finally:
        conn.close()
        exporter.close()
    return {"http_p50_ms": statistics.median(times) * 1000, "http_p99_ms": pct(times, 0.99) * 1000}


def memory(client: redis.Redis, namespace: str, tenants: int, before: int) -> dict[str, float]:
    uk = UsageKeys(Keys(namespace))
    hour = hour_of(time.time())
    after = int(client.info("memory")["used_memory"])
    eh, th = uk.entity_hour(hour), uk.tenant_hour(hour)
    bucket = sum(int(client.memory_usage(k, samples=0) or 0) for k in (eh, th))
    fields = client.hlen(th)
    day = hour // 24
    named = (uk.totals, uk.tenants, uk.rank, eh, th, uk.entity_day(day), uk.tenant_day(day))
    per_key = {k.split(":u:", 1)[1]: int(client.memory_usage(k, samples=0) or 0) for k in named}
    return {
        "used_memory_per_tenant_bytes": (after - before) / tenants,
        "hour_bucket_per_tenant_bytes": bucket / fields,
        "keys_bytes": per_key,
    }


def record_cost(writer: StatsWriter, rec: UsageRecorder) -> dict[str, float]:
    reg = CollectorRegistry()
    child = Counter("tokens", "t", ["tenant"], registry=reg).labels(tenant="acme")
    usage = Usage(tenant="acme", adapter=None, model="m", prompt_tokens=10, generation_tokens=5)
    n = 200_000
    base = min(timeit.repeat(lambda: child.inc(5), number=n, repeat=5)) / n
    ours = min(timeit.repeat(lambda: rec.record(usage), number=n, repeat=5)) / n
    made = (
        min(
            timeit.repeat(
                lambda: rec.record(
                    Usage(tenant="acme", adapter=None, model="m", prompt_tokens=10, generation_tokens=5)
                ),
                number=n,
                repeat=5,
            )
        )
        / n
    )
    while rec.pending():
        writer.flush()
    return {
        "prom_inc_ns": base * 1e9,
        "record_ns": ours * 1e9,
        "record_with_usage_made_ns": made * 1e9,
        "record_over_inc": ours / base,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tenants", type=int, default=100_000)
    ap.add_argument("--checks", type=int, default=20_000)
    args = ap.parse_args()
    import tempfile

    with EmbeddedRedis() as server, tempfile.TemporaryDirectory() as tmp:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        before = int(client.info("memory")["used_memory"])
        client.config_resetstat()
        writer, rec, fill_s = fill(server.url, "bench", args.tenants)
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        out: dict[str, object] = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
            "redis": client.info("server")["redis_version"],
            "tenants": args.tenants,
            "fill_seconds": fill_s,
            "flush_calls": stats.get("calls"),
            "redis_us_per_entry": stats.get("usec", 0) / args.tenants,
        }
        out |= memory(client, "bench", args.tenants, before)
        reader = UsageReader(StatsConfig(url=server.url, namespace="bench"))
        client.config_resetstat()
        out |= checks(reader, client, UsageKeys(Keys("bench")).tenants, args.tenants, args.checks)
        # Redis' own time per HGET of the checks (and of the floor's): what the ledger costs Redis.
        out["redis_us_per_hget"] = client.info("commandstats").get("cmdstat_hget", {}).get("usec_per_call")
        out |= http_checks(server.url, "bench", args.tenants, min(args.checks, 5000), Path(tmp))
        out |= record_cost(writer, rec)
        writer.close()
    print(json.dumps(out, indent=1))
    (ROOT / "bench" / "results" / "usage.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
