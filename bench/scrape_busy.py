"""The scrape of a busy fleet, side by side in one run (issue 33): this tree's redis_stats, the
same at other checkouts (round three's d1012e9, say), and the Redis-backed peer pytheus.

64 engines of the synthetic set of bench/peers.py (20 counters, 16 gauges, 4 histograms of 20
buckets: 40 series per engine), every series changed before each timed scrape (written, and for
redis_stats flushed, outside the timing), as a live fleet's are between two scrapes; each
library in a worker process of its own (bench/peer_worker.py), the versions alternated round by
round; wall clock (pytheus' scrape is mostly round trips to Redis), best and median of each.

    python bench/scrape_busy.py [--engines 64] [--rounds 3] [--no-pytheus] [PATH ...]

PATH: checkouts of redis_stats to time beside this tree (the directory holding redis_stats/).
pytheus needs the bench virtualenv (make bench builds .venv-bench).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig  # noqa: E402
from redis_stats.connection import make_client  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402


def run(python: str, lib: str, url: str, engines: int, path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(path), "PEER_BUCKETS": "20"}
    out = subprocess.run(
        [python, str(ROOT / "bench" / "peer_worker.py"), lib, "scrape_busy", url, str(engines)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=path,
        env=env,
    )
    if out.returncode:
        raise SystemExit(f"{lib} at {path}: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-pytheus", action="store_true")
    parser.add_argument("--bench-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    parser.add_argument("paths", nargs="*")
    opts = parser.parse_args()
    runs: list[tuple[str, str, str, Path]] = [
        ("redis_stats (this tree)", sys.executable, "redis_stats", ROOT)
    ]
    runs += [(f"redis_stats at {p}", sys.executable, "redis_stats", Path(p).resolve()) for p in opts.paths]
    if not opts.no_pytheus:
        runs.append(("pytheus", opts.bench_python, "pytheus", ROOT))
    best: dict[str, dict] = {}
    with EmbeddedRedis() as server:
        flush = make_client(StatsConfig(url=server.url)).flushall
        for r in range(opts.rounds):
            order = runs if r % 2 == 0 else runs[::-1]
            for name, python, lib, path in order:
                flush()  # each run alone in the store (every worker writes namespace "bench")
                got = run(python, lib, server.url, opts.engines, path)
                kept = best.setdefault(name, got)
                for k in ("scrape_ms", "median_ms"):
                    kept[k] = min(kept[k], got[k])
    base = best[runs[0][0]]["scrape_ms"]
    print(f"{opts.engines} engines x 40 series, every series changed before each scrape (wall clock)")
    print(f"{'':<44}{'best ms':>10}{'median ms':>11}{'bytes':>10}{'x this tree':>13}")
    for name, *_ in runs:
        b = best[name]
        ratio = b["scrape_ms"] / base
        print(f"{name:<44}{b['scrape_ms']:>10.2f}{b['median_ms']:>11.2f}{b['bytes']:>10,}{ratio:>13.2f}")


if __name__ == "__main__":
    main()
