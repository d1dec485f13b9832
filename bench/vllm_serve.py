"""What the plugin costs a real `vllm serve`: the same load with and without it, alternating.

Two `vllm serve` instances of the tiny model tests/vllm/tiny_model.py builds (CPU build, one engine,
one API server each) run side by side: one with the plugin recording to a private Redis
(REDIS_STATS_URL set, its Redis view served, the periodic log printed), one without it
(VLLM_PLUGINS lists every installed vLLM plugin but redis_stats, so vLLM never loads it). Each
round sends the same closed-loop load (CONCURRENCY streaming completions at a time, for SECONDS)
to one and then the other, the order swapped every round, so drift of the shared machine falls on
both alike. Printed: completed requests per second and time to first token (p50, p99) for each,
and the ratios with/without (target: throughput >= 0.99, TTFT within the round-to-round noise,
printed as the spread of the per-round throughput ratios).

Usage: .venv-vllm/bin/python bench/vllm_serve.py [--rounds 8] [--seconds 6] [--concurrency 4]
(`make bench-vllm`; the vLLM virtualenv of `make test-vllm`). Defaults: 8 rounds x 6 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis_stats.tools.embedded import EmbeddedRedis, free_port
from tests.vllm.serve import VllmServe
from tests.vllm.tiny_model import build

PROMPTS = [
    "the quick brown fox jumps over",
    "redis keeps the stats of every engine",
    "a fleet of engines serves many requests",
    "tokens flow from the prompt to",
]


def load(
    server: VllmServe, seconds: float, concurrency: int, max_tokens: int
) -> tuple[int, float, list[float]]:
    """Closed loop: *concurrency* clients, each sending its next request when the last is done.
    Returns (completed requests, elapsed seconds, TTFTs)."""
    ttfts: list[float] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(i: int) -> None:
        n = i
        while time.perf_counter() < stop_at:
            ttft = server.stream(PROMPTS[n % len(PROMPTS)], max_tokens)
            with lock:
                ttfts.append(ttft)
            n += concurrency

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(ttfts), time.perf_counter() - start, ttfts


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # Many short rounds: the load of a shared machine drifts within seconds; pairs close in time
    # see the same drift, and the median of the per-pair ratios ignores a pair that did not.
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    groups = ("vllm.general_plugins", "vllm.stat_logger_plugins")
    others = [e.name for g in groups for e in entry_points(group=g)]
    # The same log interval for both: vLLM's own periodic stats line follows it too.
    without_env = {
        "VLLM_PLUGINS": ",".join(n for n in others if n != "redis_stats") or "none",
        "VLLM_LOG_STATS_INTERVAL": "5",
    }
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp, EmbeddedRedis() as redis:
        model = build(Path(tmp) / "model")
        with_env = {
            "REDIS_STATS_URL": redis.url,
            "REDIS_STATS_NAMESPACE": "bench",
            "REDIS_STATS_PORT": str(free_port()),
            "VLLM_LOG_STATS_INTERVAL": "5",
        }
        for key in ("REDIS_STATS_URL", "VLLM_PLUGINS"):
            os.environ.pop(key, None)
        servers = {
            "with plugin": VllmServe(model, Path(tmp) / "with.log", with_env),
            "without plugin": VllmServe(model, Path(tmp) / "without.log", without_env),
        }
        try:
            t0 = time.monotonic()
            for s in servers.values():
                s.wait_ready()
            print(f"both servers ready in {time.monotonic() - t0:.0f} s; warming up", flush=True)
            warmed = 0
            for name, s in servers.items():
                n, _, _ = load(s, 3, args.concurrency, args.max_tokens)
                warmed += n if name == "with plugin" else 0
            totals = {name: [0, 0.0, []] for name in servers}
            per_round = {name: [] for name in servers}
            for r in range(args.rounds):
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    n, elapsed, ttfts = load(servers[name], args.seconds, args.concurrency, args.max_tokens)
                    totals[name][0] += n
                    totals[name][1] += elapsed
                    totals[name][2] += ttfts
                    per_round[name].append(n / elapsed)
                print(
                    f"round {r + 1}: "
                    + ", ".join(f"{name} {per_round[name][-1]:.2f} req/s" for name in servers),
                    flush=True,
                )
            time.sleep(3)  # the last flush (REDIS_STATS_FLUSH_INTERVAL)
            view_url = f"http://127.0.0.1:{with_env['REDIS_STATS_PORT']}/metrics"
            view = urllib.request.urlopen(view_url, timeout=30).read()
            recorded = sum(
                float(line.split()[-1])
                for line in view.decode().splitlines()
                if line.startswith("vllm:request_success_total{")
            )
        finally:
            for s in servers.values():
                s.stop()
            # Anything the plugin warned about (a failed part would cost time and be a bug).
            problems = [
                line.strip()
                for line in servers["with plugin"].log.read_text(errors="replace").splitlines()
                if "redis_stats" in line and ("WARNING" in line or "ERROR" in line)
            ]
    print(
        f"\nvllm serve (CPU build, tiny model), {args.rounds} alternating rounds x {args.seconds:.0f} s, "
        f"{args.concurrency} concurrent streaming completions of {args.max_tokens} tokens"
    )
    print(f"    {'':<16}{'req/s':>8}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}{'requests':>10}")
    figures = {}
    for name, (n, elapsed, ttfts) in totals.items():
        figures[name] = (n / elapsed, pct(ttfts, 0.5) * 1e3, pct(ttfts, 0.99) * 1e3)
        rate, p50, p99 = figures[name]
        print(f"    {name:<16}{rate:>8.2f}{p50:>13.1f}{p99:>13.1f}{n:>10}")
    w, wo = figures["with plugin"], figures["without plugin"]
    ratios = [a / b for a, b in zip(per_round["with plugin"], per_round["without plugin"], strict=True)]
    print(
        f"    ratio with/without: throughput {w[0] / wo[0]:.3f} overall, median of rounds "
        f"{statistics.median(ratios):.3f} (target >= 0.99; rounds {min(ratios):.3f}..{max(ratios):.3f}); "
        f"TTFT p50 {w[1] / wo[1]:.3f}, p99 {w[2] / wo[2]:.3f}"
    )
    loadavg = os.getloadavg()[0]
    print(f"    load average at the end: {loadavg:.1f} on {os.cpu_count()} CPUs (other work skews a round)")
    if problems:
        print("    the plugin logged:\n        " + "\n        ".join(problems[:10]))
    served = totals["with plugin"][0] + warmed
    print(f"    the plugin recorded {recorded:.0f} finished requests in Redis; that server served {served}")


if __name__ == "__main__":
    main()
