"""redis_stats side by side with what users would use instead, in one run, on one private Redis.

    make bench            # builds .venv-bench and .venv-bench-prc, then runs this

Libraries: redis_stats; prometheus_client in-process (the single-process baseline) and in
multiprocess mode (mmap files: vLLM's default with several API servers); the Redis-backed peers
pytheus (MultiProcessRedisBackend) and prometheus-redis-client (which needs redis<5, so it runs
from its own virtualenv). Each library runs in a subprocess of its own (bench/peer_worker.py).

Prints, and writes to bench/results/peers.json and docs/img/scrape_vs_engines.png:
- the cost of one vLLM-like engine step (41 updates), and Redis round trips per step and per
  second for a writer doing 50 steps/s;
- scrape time and exposition size against engines (synthetic 40 series per engine), with ratios
  against the fastest Redis-backed peer;
- redis_stats with the full vLLM catalogue from 1 to 1,024 engines: scrape time, size, Redis
  memory per engine;
- what one update does when Redis refuses connections, and when it hangs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats.connection import make_client  # noqa: E402
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog  # noqa: E402
from redis_stats.keys import Keys  # noqa: E402
from redis_stats.prometheus.collector import RedisCollector  # noqa: E402
from redis_stats.reader import StatsReader  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402
from redis_stats.tools.simulate import SimulatedApiServer  # noqa: E402

LIBS = ["redis_stats", "prometheus_client", "prometheus_client_mp", "pytheus", "prometheus_redis_client"]
REDIS_BACKED = ["redis_stats", "pytheus", "prometheus_redis_client"]
# Largest engine count each library is run at (populating pytheus costs ~1,000 round trips per
# engine of this set: 64 engines take about half a minute).
MAX_ENGINES = {
    "redis_stats": 1024,
    "prometheus_client": 1024,
    "prometheus_client_mp": 1024,
    "pytheus": 64,
    "prometheus_redis_client": 256,
}
STEPS_PER_SECOND = 50


def worker(
    python: str, lib: str, task: str, url: str, engines: int | None = None, timeout: int = 900
) -> dict:
    args = [python, str(ROOT / "bench" / "peer_worker.py"), lib, task, url]
    if engines is not None:
        args.append(str(engines))
    out = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if out.returncode != 0:
        return {
            "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        }
    return json.loads(out.stdout.strip().splitlines()[-1])


def full_catalogue(url: str, engines: int) -> dict:
    """redis_stats with every vLLM metric: engines filled by simulated API servers."""
    cfg = StatsConfig(url=url, namespace=f"full{engines}")
    cat = vllm_catalog()
    writer = StatsWriter(cfg, cat, engines=list(range(engines)), start=False)
    sims = [SimulatedApiServer(VllmRecorder(writer, "model", [e]), e, seed=e) for e in range(engines)]
    now = time.monotonic()
    for step in range(20):
        for sim in sims:
            sim.step(now + step * 0.05)
    assert writer.flush()
    writer._closed = True
    collector = RedisCollector(StatsReader(cfg, cat))
    text = collector.render_text()
    times = []
    for _ in range(5 if engines >= 256 else 9):
        t0 = time.perf_counter()
        text = collector.render_text()
        times.append(time.perf_counter() - t0)
    times.sort()
    client = make_client(cfg)
    keys = Keys(cfg.namespace)
    memory = sum(
        client.memory_usage(keys.counters(e), samples=0)  # schema 2: one hash per engine
        for e in range(engines)
    )
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {
        "engines": engines,
        "scrape_ms": times[0] * 1e3,  # the best run: noise on a shared machine only adds
        "bytes": len(text),
        "samples": samples,
        "memory_per_engine": memory / engines,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--prc-python",
        default=str(ROOT / ".venv-bench-prc" / "bin" / "python"),
        help="python of the virtualenv with prometheus-redis-client (redis<5)",
    )
    parser.add_argument("--engines", default="1,8,64,256,1024")
    parser.add_argument("--quick", action="store_true", help="engines 1,8,64 only")
    opts = parser.parse_args()
    engine_counts = [1, 8, 64] if opts.quick else [int(e) for e in opts.engines.split(",")]
    python = {lib: sys.executable for lib in LIBS}
    python["prometheus_redis_client"] = opts.prc_python
    results: dict = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()}"
    }
    with EmbeddedRedis() as server:
        results["server"] = Path(server.binary).name
        flush = make_client(StatsConfig(url=server.url)).flushall
        print(f"machine: {results['machine']}; server: {results['server']} on {server.url}\n")

        print(
            f"(1) one engine step (41 updates): cost, and Redis round trips (at {STEPS_PER_SECOND} steps/s)"
        )
        print(f"    {'library':<26}{'us/step':>12}{'round trips/step':>18}{'round trips/s':>15}")
        results["record"] = {}
        for lib in LIBS:
            flush()
            r = worker(python[lib], lib, "record", server.url)
            results["record"][lib] = r
            if "error" in r:
                print(f"    {lib:<26}  error: {r['error']}")
                continue
            per_s = 1.0 if lib == "redis_stats" else r["round_trips_per_step"] * STEPS_PER_SECOND
            r["round_trips_per_s"] = per_s
            print(f"    {lib:<26}{r['us_per_step']:>12.1f}{r['round_trips_per_step']:>18.1f}{per_s:>15.0f}")
        print("    (redis_stats: one script call per flush interval, 1 s by default, whatever the traffic)")

        print("\n(2) scrape time against engines, 40 series per engine (best of 7)")
        results["scrape"] = {lib: [] for lib in LIBS}
        for n in engine_counts:
            for lib in LIBS:
                if n > MAX_ENGINES[lib]:
                    continue
                flush()
                r = worker(python[lib], lib, "scrape", server.url, n)
                results["scrape"][lib].append(r)
                if "error" in r:
                    print(f"    {n:>5} engines  {lib:<26} error: {r['error']}")
                else:
                    print(
                        f"    {n:>5} engines  {lib:<26}{r['scrape_ms']:>10.1f} ms {r['bytes']:>10,} bytes "
                        f"{r['samples']:>7,} samples  (populated in {r['populate_s']:.1f} s)"
                    )
        ratios = {}
        for n in engine_counts:
            ours = next((r for r in results["scrape"]["redis_stats"] if r.get("engines") == n), None)
            peers = [
                r["scrape_ms"]
                for lib in REDIS_BACKED[1:]
                for r in results["scrape"][lib]
                if r.get("engines") == n and "scrape_ms" in r
            ]
            if ours and peers:
                ratios[n] = min(peers) / ours["scrape_ms"]
                print(
                    f"    {n:>5} engines: redis_stats is {ratios[n]:.1f}x faster than the fastest "
                    "Redis-backed peer"
                )
        results["ratios_vs_fastest_redis_peer"] = ratios

        print("\n(3) redis_stats, full vLLM catalogue (41 metrics), simulated load")
        print(
            f"    {'engines':>8}{'scrape ms':>11}{'ms/engine':>11}{'bytes':>12}{'samples':>9}"
            f"{'Redis B/engine':>16}"
        )
        results["full_catalogue"] = []
        for n in engine_counts:
            flush()
            r = full_catalogue(server.url, n)
            results["full_catalogue"].append(r)
            print(
                f"    {n:>8}{r['scrape_ms']:>11.1f}{r['scrape_ms'] / n:>11.3f}{r['bytes']:>12,}"
                f"{r['samples']:>9,}{r['memory_per_engine']:>16,.0f}"
            )

        print("\n(4) one update with Redis refusing connections / hung (watchdog 10 s)")
        results["down"] = {}
        for lib in REDIS_BACKED:
            r = worker(python[lib], lib, "down", server.url)
            results["down"][lib] = r
            cells = []
            for case in ("refused", "hung"):
                c = r.get(case, {})
                if "blocked_over_s" in c:
                    cells.append(f"{case}: blocked > {c['blocked_over_s']} s")
                elif "seconds" in c:
                    raised = f", raised {c['raised']}" if c.get("raised") else ", no exception"
                    cells.append(f"{case}: {c['seconds'] * 1e3:.2f} ms{raised}")
                else:
                    cells.append(f"{case}: {c}")
            print(f"    {lib:<26}" + "; ".join(cells))

    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "peers.json").write_text(json.dumps(results, indent=1))
    plot(results, ROOT / "docs" / "img" / "scrape_vs_engines.png")
    print(f"\nwrote {out_dir / 'peers.json'} and docs/img/scrape_vs_engines.png")


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for lib, runs in results["scrape"].items():
        points = [(r["engines"], r["scrape_ms"]) for r in runs if "scrape_ms" in r]
        if points:
            ax.plot(*zip(*points), marker="o", label=lib)
    full = [(r["engines"], r["scrape_ms"]) for r in results.get("full_catalogue", [])]
    if full:
        ax.plot(*zip(*full), marker="s", linestyle="--", label="redis_stats, full vLLM catalogue")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("engines")
    ax.set_ylabel("scrape time (ms)")
    ax.set_title("Scrape time against engines (40 series per engine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
