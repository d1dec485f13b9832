"""One exporter for every model against one exporter per model: memory, CPU and Redis time (issue 34).

A private redis-server (never port 6379); ``--namespaces`` fleets, each written by its own
``redis-stats simulate --namespace nsI --engines N --api-servers 2 --processes 1`` (the full vLLM
catalogue, a few hot engines, one flush every ``--flush-interval`` s) for the whole run. Once every
engine is up, three arms in turn against the same store, each for ``--seconds``, the same traffic
per model: every ``--scrape-interval`` s Prometheus's scrape (gzipped, OpenMetrics) and a KEDA
poll of that model's ``/load``:

1. ``exporters``: one ``redis-stats exporter --namespace nsI`` per model (today's layout), each
   scraped for its ``/metrics`` and polled for its ``/load``;
2. ``all-namespaces``: one ``redis-stats exporter --all-namespaces``, its whole ``/metrics``
   scraped once (every model) and ``/load?namespace=nsI`` polled for every model;
3. ``one asked``: the same exporter with one model asked for (``?namespace=ns0``), the other
   models idle: what a namespace nobody asks for costs.

Per arm: the exporters' peak resident memory (``VmHWM``, summed over processes) and at the end
(``VmRSS``), their CPU seconds, and Redis' CPU and command time over the arm (``INFO cpu``,
``INFO commandstats``: the simulated writers' flushes are in every arm alike), each with its ratio
to the first arm.

Usage: python bench/all_namespaces.py [--namespaces 20] [--engines 64] [--seconds 90]
       [--scrape-interval 15] [--flush-interval 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import redis  # noqa: E402
from exporter_memory import OPENMETRICS, get, proc_status, start_exporter  # noqa: E402

from redis_stats import StatsConfig, StatsReader  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402


def env(url: str, **extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    out.update(REDIS_STATS_URL=url, PYTHONPATH=str(ROOT), **extra)
    return out


def wait_up(url: str, namespaces: list[str], engines: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    for ns in namespaces:
        reader = StatsReader(StatsConfig(url=url, namespace=ns), vllm_catalog())
        while True:
            try:
                if sum(e.up for e in reader.load().engines.values()) >= engines:
                    break
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{ns}: the simulated fleet did not come up within {timeout:.0f} s")
            time.sleep(1)


def redis_figures(client: redis.Redis) -> dict[str, float]:
    """Redis' CPU seconds and its commands' time (µs) and calls so far."""
    cpu = client.info("cpu")
    stats: dict[str, Any] = client.info("commandstats")
    return {
        "cpu": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        "usec": float(sum(v["usec"] for v in stats.values())),
        "calls": float(sum(v["calls"] for v in stats.values())),
    }


def traffic(targets: list[tuple[str, str, str | None]], interval: float, stop: threading.Event) -> list[int]:
    """Every *interval* s each (base, path, Accept) once, all at once; the failed requests."""
    errors = [0]

    def one(base: str, path: str, accept: str | None) -> None:
        if get(base, path, accept) < 0:
            errors[0] += 1

    while not stop.is_set():
        started = time.monotonic()
        threads = [threading.Thread(target=one, args=t) for t in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    return errors


def run_arm(
    name: str,
    url: str,
    commands: list[list[str]],
    paths_of: Any,
    args: argparse.Namespace,
    client: redis.Redis,
) -> dict[str, Any]:
    procs = [start_exporter(url, ROOT, extra) for extra in commands]
    targets = [t for i, (_, base) in enumerate(procs) for t in paths_of(i, base)]
    stop = threading.Event()
    errors: list[list[int]] = []
    before = redis_figures(client)
    started = time.monotonic()
    runner = threading.Thread(target=lambda: errors.append(traffic(targets, args.scrape_interval, stop)))
    runner.start()
    time.sleep(args.seconds)
    stop.set()
    runner.join()
    elapsed = time.monotonic() - started
    after = redis_figures(client)
    statuses = [proc_status(p.pid) for p, _ in procs]
    for p, _ in procs:
        p.terminate()
        p.wait(30)
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "arm": name,
        "processes": len(procs),
        "peak": sum(s["VmHWM"] for s in statuses),
        "rest": sum(s["VmRSS"] for s in statuses),
        "cpu": sum(s["cpu"] for s in statuses) / ticks,
        "redis_cpu": (after["cpu"] - before["cpu"]) / elapsed,
        "redis_ms": (after["usec"] - before["usec"]) / 1000,
        "calls": after["calls"] - before["calls"],
        "requests": len(targets),
        "errors": errors[0][0] if errors else -1,
        "seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--engines", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--flush-interval", type=float, default=5.0, help="the simulated writers'")
    args = parser.parse_args()
    names = [f"ns{i:02d}" for i in range(args.namespaces)]
    server = EmbeddedRedis().start()
    sims: list[subprocess.Popen[bytes]] = []
    try:
        for ns in names:
            sims.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "redis_stats",
                        "simulate",
                        "--namespace",
                        ns,
                        "--engines",
                        str(args.engines),
                        "--processes",
                        "1",
                        "--report-interval",
                        "3600",
                    ],
                    env=env(
                        server.url,
                        REDIS_STATS_FLUSH_INTERVAL=str(args.flush_interval),
                        REDIS_STATS_STALE_AFTER=str(max(60.0, 6 * args.flush_interval)),
                    ),
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                )
            )
        wait_up(server.url, names, args.engines)
        client = redis.Redis.from_url(server.url)
        scrape = ("/metrics", OPENMETRICS)
        arms = [
            run_arm(
                "exporters (one per model)",
                server.url,
                [["--namespace", ns] for ns in names],
                lambda i, base: [(base, *scrape), (base, "/load", None)],
                args,
                client,
            ),
            run_arm(
                "all-namespaces",
                server.url,
                [["--all-namespaces"]],
                lambda i, base: [(base, *scrape)] + [(base, f"/load?namespace={ns}", None) for ns in names],
                args,
                client,
            ),
            run_arm(
                "all-namespaces, one model asked",
                server.url,
                [["--all-namespaces"]],
                lambda i, base: [
                    (base, f"/metrics?namespace={names[0]}", OPENMETRICS),
                    (base, f"/load?namespace={names[0]}", None),
                ],
                args,
                client,
            ),
        ]
        print(
            f"{args.namespaces} models x {args.engines} engines x 2 API servers (full vLLM catalogue, a "
            f"flush every {args.flush_interval:g} s); every {args.scrape_interval:g} s each model's scrape "
            f"(gzipped OpenMetrics) and a /load poll; {args.seconds:.0f} s per arm"
        )
        first = arms[0]
        cols = ("peak RSS", "x", "RSS end", "x", "CPU s", "x", "Redis CPU", "Redis ms", "x", "errors")
        print(f"{'arm':34} {'procs':>5} " + " ".join(f"{c:>9}" for c in cols))
        for a in arms:
            cells = (
                f"{a['peak'] / 2**20:.0f} MB",
                f"{a['peak'] / first['peak']:.2f}",
                f"{a['rest'] / 2**20:.0f} MB",
                f"{a['rest'] / first['rest']:.2f}",
                f"{a['cpu']:.1f}",
                f"{a['cpu'] / max(first['cpu'], 1e-9):.2f}",
                f"{a['redis_cpu']:.1%}",
                f"{a['redis_ms']:.0f}",
                f"{a['redis_ms'] / max(first['redis_ms'], 1e-9):.2f}",
                str(a["errors"]),
            )
            print(f"{a['arm']:34} {a['processes']:>5} " + " ".join(f"{c:>9}" for c in cells))
        print("(Redis CPU and time include the simulated writers' flushes, the same in every arm)")
    finally:
        for sim in sims:
            sim.terminate()
        for sim in sims:
            try:
                sim.wait(120)
            except subprocess.TimeoutExpired:
                sim.kill()
        server.close()


if __name__ == "__main__":
    main()
