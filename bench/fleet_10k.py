"""Sized for 10,240 engines (issue 47, item 5): a fleet over a 3-master Redis Cluster on loopback.

A real Cluster (three ``redis-server --cluster-enabled yes``, slots spread by ``redis-cli
--cluster create``: tests/servers.py's) holds ``--engines`` x 2 API-server writers in K = 3 shards
(engine e in shard e % 3, one shard per master: docs/key-schema.md, "Shards"). The writers are
emulated as bench/fleet.py does: its drivers send realistic vLLM flushes (the load entries in
each) with each writer's own id, engine and sequence, one every ``--period`` seconds per writer
(this 2-core machine cannot send 20,480 flushes a second beside the Cluster: the per-flush cost
measured is scaled to 1 s in the report, and said so). Two probe writers of their own (the vLLM
catalogue and load map, the load lane on) change ``requests_waiting`` at random moments.

One ``redis-stats exporter`` of the namespace in its own process, measured over one window:

- ``/load``: a router polling it every 50 ms: the answer's time, p50 / p99, and its size;
- change -> subscriber: ``--subscribers`` threads following ``/watch`` (bench/watch_feed.py's
  subscribers: the first the example router's ``WatchClient``), from a probe's ``set()`` to the
  event, p50 / p99;
- each master's CPU (``INFO cpu``, all of the server's time, over the window) and memory;
- the exporter's CPU over the window and its memory (``VmRSS``, peak ``VmHWM``);
- the slices a scrape needs: ``/metrics?slice=0/N`` for N in ``--slices`` (uncompressed body and
  its build time, through the exporter: one slice of N, the others alike), and the smallest N
  whose slice is under 16 MiB (VictoriaMetrics' default scrape limit) and built within the
  scrape timeout (``--scrape-timeout``).

Usage: python bench/fleet_10k.py [--engines 10240] [--period 10] [--window 20] [--subscribers 10]
       python bench/fleet_10k.py --engines 1024 --period 2      # a quick run
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "docs" / "examples"))

import redis  # noqa: E402

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.tools.embedded import free_port  # noqa: E402

SHARDS = 3
MIB = 1 << 20
SCRAPE_LIMIT = 16 * MIB  # VictoriaMetrics' default -promscrape.maxScrapeSize


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of *pid*, MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) / 1024
    return out


def master_cpu(nodes: list[redis.Redis]) -> list[float]:
    from fleet import cpu_seconds

    return [cpu_seconds(n) for n in nodes]


def flush_calls(nodes: list[redis.Redis]) -> list[int]:
    """Each master's script calls so far (``INFO commandstats``): the flushes it applied."""
    return [int(n.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)) for n in nodes]


def get(url: str, timeout: float = 120.0) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def poll_load(url: str, stop: threading.Event, out: list[tuple[float, int, int]]) -> None:
    """A router polling ``/load`` every 50 ms (whole bodies: no ETag sent): (time, bytes, status)."""
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            took, body = get(url + "/load", 30)
            out.append((took, len(body), 200))
        except urllib.error.HTTPError as exc:  # a 503: the refresh older than its max age
            out.append((time.perf_counter() - t0, len(exc.read()), exc.code))
        except OSError:
            out.append((math.inf, 0, 0))
        time.sleep(0.05)


def start_exporter(cluster_url: str, namespace: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_STATS_SOCKET_TIMEOUT_MS": "30000"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redis_stats",
            "exporter",
            "--redis-url",
            cluster_url,
            "--namespace",
            namespace,
            "--port",
            str(port),
            "--max-connections",
            "256",
            "--request-timeout",
            "120",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=10240)
    parser.add_argument("--period", type=float, default=10.0, help="seconds between a writer's flushes")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--drivers", type=int, default=2)
    parser.add_argument("--slices", default="8,16,32")
    parser.add_argument("--scrape-timeout", type=float, default=10.0)
    parser.add_argument("--first-load-timeout", type=float, default=300.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fleet_10k.json"))
    opts = parser.parse_args()
    from fleet import drive
    from servers import Cluster
    from watch_feed import PROBE_LANE, subscribers

    n = opts.engines
    namespace = f"fleet{n}"
    cluster = Cluster().start()
    procs: list[Any] = []
    exporter = None
    result: dict[str, Any] = {
        "engines": n,
        "writers": 2 * n,
        "period_s": opts.period,
        "drivers": opts.drivers,
    }
    try:
        nodes = [redis.Redis(host="127.0.0.1", port=node.port) for node in cluster.nodes]
        ctx = mp.get_context("spawn")
        queue: Any = ctx.Queue()
        writers = [(e, a) for e in range(n) for a in range(2)]
        start_at = time.time() + 25.0  # the drivers build their templates first
        warm = 2 * opts.period + 5.0  # every writer's first two flushes (the catalogue, every name)
        seconds = warm + opts.window + 120.0 + 20 * opts.period
        procs = [
            ctx.Process(
                target=drive,
                args=(cluster.url, namespace, writers[d :: opts.drivers], seconds, start_at, queue),
                kwargs={"shards": SHARDS, "load": 0.0, "period": opts.period},
            )
            for d in range(opts.drivers)
        ]
        for p in procs:
            p.start()
        cfg = StatsConfig(
            url=cluster.url, namespace=namespace, flush_interval=1.0, shards=SHARDS, socket_timeout_ms=30_000
        )
        probe = StatsWriter(
            cfg.replace(endpoint="probe:1"), vllm_catalog(), engines=[PROBE_LANE], load=VLLM_LOAD
        )
        gauge = probe.metric("vllm:num_requests_waiting").labels(PROBE_LANE, model_name="m")
        gauge.set(0)
        time.sleep(max(0.0, start_at + warm - time.time()))
        port = free_port()
        exporter = start_exporter(cluster.url, namespace, port)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + opts.first_load_timeout
        while True:
            try:
                took, body = get(url + "/load")
                if len(json.loads(body)["engines"]) >= n:
                    break
            except (OSError, ValueError, KeyError):
                pass
            assert time.monotonic() < deadline, (
                f"the exporter's /load did not show the fleet within {opts.first_load_timeout:g} s "
                "(its first refresh of every engine: a machine too loaded for this size?)"
            )
            time.sleep(1.0)
        result["first_load_s"] = took
        out: Any = ctx.Queue()
        subs = ctx.Process(target=subscribers, args=(url, opts.subscribers, 8.0 + opts.window + 4.0, out))
        subs.start()
        time.sleep(8.0)  # every subscriber has its state
        stop = threading.Event()
        polled: list[tuple[float, int, int]] = []
        poller = threading.Thread(target=poll_load, args=(url, stop, polled), daemon=True)
        cpu0, ex0, t0 = master_cpu(nodes), proc_cpu(exporter.pid), time.monotonic()
        calls0 = flush_calls(nodes)
        load0 = os.getloadavg()[0]
        poller.start()
        set_at: dict[int, float] = {}
        value = 0
        while time.monotonic() - t0 < opts.window:
            time.sleep(random.uniform(0.2, max(0.3, opts.window / opts.changes)))
            value += 1
            set_at[value] = time.time()
            gauge.set(value)
        stop.set()
        poller.join()
        cpu1, ex1, t1 = master_cpu(nodes), proc_cpu(exporter.pid), time.monotonic()
        calls1 = flush_calls(nodes)
        result["drivers_alive"] = sum(p.is_alive() for p in procs)  # a dead one: its writers stopped
        load1 = os.getloadavg()[0]
        seen = out.get()
        subs.join()
        wall = t1 - t0
        lat = [
            when - set_at[v]
            for path, e, v, when in seen
            if path != "load" and e == PROBE_LANE and v in set_at
        ]
        times = [t for t, _, _ in polled]
        result.update(
            {
                "load_average": [load0, load1],
                "load_ms": {"p50": 1e3 * pct(times, 0.5), "p99": 1e3 * pct(times, 0.99), "n": len(times)},
                "load_status": {
                    str(c): sum(1 for _, _, x in polled if x == c) for c in {x for _, _, x in polled}
                },
                "load_body_kb": max((b for _, b, c in polled if c == 200), default=0) / 1024,
                "watch_ms": {"p50": 1e3 * pct(lat, 0.5), "p99": 1e3 * pct(lat, 0.99), "n": len(lat)},
                "master_cpu": [(b - a) / wall for a, b in zip(cpu0, cpu1)],
                "master_memory_mb": [node.info("memory")["used_memory"] / MIB for node in nodes],
                "exporter_cpu": (ex1 - ex0) / wall,
                "exporter_memory_mb": proc_memory(exporter.pid),
            }
        )
        # The flushes each master applied in the window (a driver behind sends fewer than asked),
        # and its CPU per flush: what 2 flushes a second per engine would cost it.
        applied = [(b - a) / wall for a, b in zip(calls0, calls1)]
        result["flushes_per_s"] = sum(applied)
        result["flushes_asked_per_s"] = 2 * n / opts.period
        result["master_flushes_per_s"] = applied
        result["master_us_per_flush"] = [1e6 * c / max(f, 1.0) for c, f in zip(result["master_cpu"], applied)]
        result["master_cpu_at_1s"] = [
            us * 1e-6 * 2 * n / SHARDS for us in result["master_us_per_flush"]
        ]  # each master: a third of the engines, 2 writers each, a flush a second
        slices = []
        for parts in (int(x) for x in opts.slices.split(",")):
            try:
                took, body = get(f"{url}/metrics?slice=0/{parts}", 300)
                slices.append({"n": parts, "body_mib": len(body) / MIB, "build_s": took})
            except OSError as exc:
                slices.append({"n": parts, "error": str(exc)})
        result["slices"] = slices
        # What one refresh and one feed read cost in CPU at this size (bench/live_refresh.py's
        # measure, in a process of its own): robust to the machine's load, unlike the times above.
        from live_refresh import measure

        try:
            result["cpu_ms"] = measure(ROOT, cluster.url, namespace, 6.0)
        except Exception as exc:  # reported, the rest stands
            result["cpu_ms"] = {"error": str(exc)[-300:]}
        result["exporter_memory_mb_after_slices"] = proc_memory(exporter.pid)
        ok = [s for s in slices if "body_mib" in s]
        if ok:
            per_engine = statistics_mean([s["body_mib"] * s["n"] / n for s in ok])  # MiB per engine
            fits = [
                s["n"]
                for s in ok
                if s["body_mib"] < SCRAPE_LIMIT / MIB and s["build_s"] < opts.scrape_timeout
            ]
            result["whole_body_mib_est"] = per_engine * n
            result["slices_needed"] = min(fits) if fits else None
        probe.close()
    finally:
        for p in procs:  # the drivers first: nothing else is measured now
            p.terminate()
        if exporter is not None:
            exporter.terminate()
            try:
                exporter.wait(10)
            except subprocess.TimeoutExpired:  # busy past its grace: ended
                exporter.kill()
                exporter.wait(10)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)
        cluster.close()
    report(result)
    Path(opts.out).write_text(json.dumps(result, indent=1))


def statistics_mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def report(r: dict[str, Any]) -> None:
    print(
        f"\n{r['engines']:,} engines x 2 writers over a 3-master Cluster (K = 3), a flush every "
        f"{r['period_s']:g} s per writer ({r['flushes_asked_per_s']:,.0f} flushes/s asked, "
        f"{r['flushes_per_s']:,.0f} applied); load average "
        f"{r['load_average'][0]:.1f} -> {r['load_average'][1]:.1f}"
    )
    print(
        f"    /load (polled every 50 ms, {r['load_ms']['n']} answers, {r['load_body_kb']:,.0f} KB): "
        f"p50 {r['load_ms']['p50']:.0f} ms, p99 {r['load_ms']['p99']:.0f} ms; the first "
        f"{1e3 * r['first_load_s']:.0f} ms"
    )
    print(f"    /load answers by status: {r['load_status']}")
    cpu = r.get("cpu_ms", {})
    if "refresh_ms" in cpu:
        print(
            f"    CPU: a /load refresh {cpu['refresh_ms']:.0f} ms, a /watch read {cpu['read_ms']:.0f} ms "
            f"({cpu['events_per_read']:.0f} events a read)"
        )
    print(
        f"    change -> /watch subscriber ({r['watch_ms']['n']} samples): p50 {r['watch_ms']['p50']:.0f} ms, "
        f"p99 {r['watch_ms']['p99']:.0f} ms"
    )
    if r["drivers_alive"] < r["drivers"]:
        print(f"    ONLY {r['drivers_alive']} of {r['drivers']} drivers ran to the end: the figures are low")
    cpus = ", ".join(f"{c:.3f}" for c in r["master_cpu"])
    scaled = ", ".join(f"{c:.2f}" for c in r["master_cpu_at_1s"])
    mem = ", ".join(f"{m:.0f}" for m in r["master_memory_mb"])
    per = ", ".join(f"{u:.0f}" for u in r["master_us_per_flush"])
    print(
        f"    masters' CPU (1.0 = a core): {cpus}; µs per flush: {per}; at a flush a second per "
        f"writer: {scaled}"
    )
    print(f"    masters' used_memory MiB: {mem}")
    m = r["exporter_memory_mb"]
    print(
        f"    exporter: CPU {r['exporter_cpu']:.2f} of a core; RSS {m.get('VmRSS', 0):.0f} MB, "
        f"peak {m.get('VmHWM', 0):.0f} MB (after the slices: peak "
        f"{r['exporter_memory_mb_after_slices'].get('VmHWM', 0):.0f} MB)"
    )
    for s in r["slices"]:
        if "error" in s:
            print(f"    /metrics?slice=0/{s['n']}: {s['error']}")
        else:
            print(f"    /metrics?slice=0/{s['n']}: {s['body_mib']:.1f} MiB in {s['build_s']:.1f} s")
    if "whole_body_mib_est" in r:
        print(
            f"    the whole body ~{r['whole_body_mib_est']:,.0f} MiB; slices a scrape needs (< 16 MiB, "
            f"built within the timeout): {r['slices_needed']}"
        )


if __name__ == "__main__":
    main()
