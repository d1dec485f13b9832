"""The exporter's peak memory and CPU at fleet size, under the sliced layout's traffic (issue 35).

A private redis-server (never port 6379); ``redis-stats simulate --engines N --api-servers 2`` (the
full vLLM catalogue, a few hot engines) writes to it for the whole run. Once every engine is up, one
exporter per checkout given starts (``PYTHONPATH=<path> python -m redis_stats exporter``), all of
them at once against the same Redis, and each gets the same traffic for ``--seconds``:

- every ``--scrape-interval`` seconds, what Prometheus sends in the sliced layout
  (docs/kubernetes.md): four gzipped ``/metrics?slice=i/4`` scrapes at once (OpenMetrics first, as
  Prometheus asks), beside them one whole gzipped ``/metrics`` and one ``/snapshot``;
- every 2 s the live page's poll (``/snapshot?buckets=0&name[]=...``, its seven metrics);
- every 0.25 s a router's ``/load``.

Then, per exporter: its peak resident memory (``VmHWM`` of ``/proc/<pid>/status``), its resident
memory at the end (``VmRSS``) and its CPU seconds (user + system), with the ratio of each to the
first checkout's. Redis' own memory (``used_memory``) and CPU over the run are printed once.

To compare with main, give main's tree first (a ``git worktree`` of it beside this one)::

    git worktree add /tmp/rs-main main
    python bench/exporter_memory.py /tmp/rs-main .

Usage: python bench/exporter_memory.py [--engines 1024] [--seconds 120] [--scrape-interval 15]
       [--flush-interval 5] [--extra-args "--window-budget 64"] [PATH ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from redis_stats import StatsConfig, StatsReader  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402

NAMESPACE = "bench-memory"
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
PAGE_METRICS = [
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
]
PAGE = "/snapshot?buckets=0&" + "&".join("name[]=" + urllib.parse.quote(n) for n in PAGE_METRICS)


def env_for(url: str, path: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    env.update(REDIS_STATS_URL=url, REDIS_STATS_NAMESPACE=NAMESPACE, **extra)
    if path is not None:
        env["PYTHONPATH"] = str(path)
    return env


def wait_up(url: str, engines: int, timeout: float = 600) -> None:
    """Until every engine of the simulated fleet is up (its writers' first flushes are in)."""
    reader = StatsReader(StatsConfig(url=url, namespace=NAMESPACE))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            view = reader.load().to_dict()
            if sum(1 for e in view["engines"].values() if e["up"]) >= engines:
                return
        except redis.RedisError:
            pass
        time.sleep(2)
    raise SystemExit(f"the simulated fleet did not come up within {timeout:.0f} s")


ERRORS: dict[str, int] = {}  # kind of failed request -> how many (all exporters)


def get(base: str, path: str, accept: str | None = None) -> int:
    """GET *base* + *path* (gzip accepted); the size of the body as sent, -1 on an error."""
    headers = {"Accept-Encoding": "gzip"}
    if accept:
        headers["Accept"] = accept
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=120) as r:
            return len(r.read())
    except OSError as exc:
        kind = f"{path.split('?')[0]} {getattr(exc, 'code', None) or type(exc).__name__}"
        ERRORS[kind] = ERRORS.get(kind, 0) + 1
        return -1


class Traffic:
    """The sliced layout's traffic against one exporter, from threads, until stopped."""

    def __init__(self, base: str, scrape_interval: float, local: bool = False) -> None:
        self.base = base
        self.local = local
        self.scrape_interval = scrape_interval
        self.stop = threading.Event()
        self.errors = 0
        self.threads = [
            threading.Thread(target=self._every, args=(scrape_interval, self._scrape), daemon=True),
            threading.Thread(target=self._every, args=(2.0, lambda: local or self._one(PAGE)), daemon=True),
            threading.Thread(target=self._every, args=(0.25, lambda: self._one("/load")), daemon=True),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(180)

    def _every(self, interval: float, fn: Any) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            fn()
            self.stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def _one(self, path: str, accept: str | None = None) -> None:
        if get(self.base, path, accept) < 0:
            self.errors += 1

    def _scrape(self) -> None:
        if self.local:  # a node's own view (REDIS_STATS_VIEW=local): one scrape of its engines
            self._one("/metrics", OPENMETRICS)
            return
        jobs = [(f"/metrics?slice={i}/4", OPENMETRICS) for i in range(4)]
        jobs += [("/metrics", OPENMETRICS), ("/snapshot", None)]
        with ThreadPoolExecutor(len(jobs)) as pool:
            list(pool.map(lambda job: self._one(*job), jobs))


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS in bytes, CPU seconds (user + system) x 100 of *pid*."""
    text = Path(f"/proc/{pid}/status").read_text()
    out = {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1)) * 1024 for k in ("VmHWM", "VmRSS")}
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu"] = int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
    return out


def start_exporter(url: str, path: Path, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "redis_stats", "exporter", "--port", "0", "--gc-interval", "0", *extra],
        env=env_for(url, path),
        cwd=path,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"on (http://[\d.]+:\d+)/metrics", line)
    if not match:
        proc.kill()
        raise SystemExit(f"the exporter of {path} did not start: {line!r}")
    return proc, match.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--flush-interval", type=float, default=5.0, help="the simulated writers'")
    parser.add_argument("--extra-args", default="", help="more exporter options, for the last checkout")
    parser.add_argument(
        "--local-view",
        type=int,
        default=0,
        help="also an exporter of engines 0..K-1 only (this checkout), scraped once per interval, "
        "with /load: what a node's view (REDIS_STATS_VIEW=local) costs",
    )
    parser.add_argument("paths", nargs="*", type=Path, default=[ROOT])
    args = parser.parse_args()
    paths = [p.resolve() for p in args.paths]
    server = EmbeddedRedis().start()
    sim = None
    exporters: list[tuple[Path, subprocess.Popen[str], str]] = []
    try:
        sim = subprocess.Popen(
            [sys.executable, "-m", "redis_stats", "simulate", "--engines", str(args.engines)],
            env=env_for(
                server.url,
                ROOT,
                REDIS_STATS_FLUSH_INTERVAL=str(args.flush_interval),
                REDIS_STATS_STALE_AFTER=str(max(60.0, 6 * args.flush_interval)),
            ),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        wait_up(server.url, args.engines)
        client = redis.Redis.from_url(server.url)
        cpu0 = client.info("cpu")
        for i, path in enumerate(paths):
            extra = args.extra_args.split() if i == len(paths) - 1 and len(paths) > 1 else []
            proc, base = start_exporter(server.url, path, extra)
            exporters.append((path, proc, base))
        if args.local_view:
            own = ",".join(str(e) for e in range(args.local_view))
            proc, base = start_exporter(server.url, ROOT, ["--engines", own])
            exporters.append((Path(f"local view of {args.local_view} engines"), proc, base))
        traffic = [
            Traffic(base, args.scrape_interval, local=str(path).startswith("local view"))
            for path, _, base in exporters
        ]
        started = time.monotonic()
        for t in traffic:
            t.start()
        time.sleep(args.seconds)
        for t in traffic:
            t.close()
        elapsed = time.monotonic() - started
        cpu1 = client.info("cpu")
        memory = client.info("memory")["used_memory"]
        ticks = os.sysconf("SC_CLK_TCK")
        print(
            f"{args.engines:,} engines x 2 API servers, full vLLM catalogue, {elapsed:.0f} s of the sliced "
            f"layout's traffic (4 slices + 1 whole /metrics + 1 /snapshot every {args.scrape_interval:g} s, "
            "the page every 2 s, /load every 0.25 s)"
        )
        rows = []
        for (path, proc, _), t in zip(exporters, traffic):
            st = proc_status(proc.pid)
            rows.append((path, st, t.errors))
        first = rows[0][1]
        heads = ("peak RSS", "x first", "RSS end", "CPU s", "x first")
        print(f"{'checkout':40} " + " ".join(f"{h:>10}" for h in heads) + " errors")
        for path, st, errors in rows:
            cells = (
                f"{st['VmHWM'] / 2**20:7.0f} MB",
                f"{st['VmHWM'] / first['VmHWM']:.2f}",
                f"{st['VmRSS'] / 2**20:7.0f} MB",
                f"{st['cpu'] / ticks:.1f}",
                f"{st['cpu'] / max(1, first['cpu']):.2f}",
            )
            print(f"{str(path)[-40:]:40} " + " ".join(f"{c:>10}" for c in cells) + f" {errors}")
        redis_cpu = sum(float(cpu1[k]) - float(cpu0[k]) for k in ("used_cpu_sys", "used_cpu_user"))
        print(
            f"Redis: used_memory {memory / 2**20:.1f} MB ({memory / args.engines / 1024:.1f} KB per engine); "
            f"CPU {redis_cpu / elapsed:.1%} of a core (the writers' flushes every {args.flush_interval:g} s "
            f"and {len(exporters)} exporters' reads)"
        )
        if ERRORS:
            print("failed requests:", ", ".join(f"{k}: {n}" for k, n in sorted(ERRORS.items())))
        gz = get(exporters[0][2], "/metrics", OPENMETRICS)
        print(f"one whole /metrics: {gz / 2**20:.1f} MB gzipped")
    finally:
        for _, proc, _ in exporters:
            proc.terminate()
            proc.wait(30)
        if sim is not None:
            sim.terminate()
            sim.wait(120)
        server.close()


if __name__ == "__main__":
    main()
