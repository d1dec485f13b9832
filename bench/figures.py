"""Every size and time the README and the docs state about a scrape, from ONE command, measured as an
operator meets them: a real ``redis-stats simulate`` fleet (the full vLLM catalogue with speculative
decoding and ``--kv-cache-metrics``, the model ``meta-llama/Llama-3.1-8B-Instruct``, 2 API servers
per engine) writing into a private redis-server for the whole run, and a standalone
``redis-stats exporter`` asked over HTTP, as Prometheus, a router and KEDA ask it.

For each fleet size: the whole ``/metrics`` (its body as a scrape limit counts it, uncompressed; the
gzipped bytes Prometheus receives; the wall time of a request, as the scraper waits for it), each
slice of 4 and of 8 (``?slice=i/N``: the largest, slice 0, carries the writers' self-metrics), and
``/load`` gzipped; per engine, the body's bytes; the CPU time the exporter spent on a whole
``/metrics`` (its work, whatever else the machine runs). It prints the machine and the date with
the figures, and writes them to ``bench/results/figures.json``.

The fleet writes while the exporter is asked (its data changes between two requests, as a busy
fleet's does), on the same machine: on a small one the simulation's processes take CPU from the
exporter and the times include that wait.

Usage: python bench/figures.py [--engines 64,1024] [--rounds 5] [--warmup 40]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats.tools.embedded import EmbeddedRedis, free_port  # noqa: E402
from redis_stats.tools.fleet_sim import MODEL  # noqa: E402

MIB = 1 << 20
API_SERVERS = 2
SLICES = (4, 8)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown CPU"
    try:
        found = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        cpu = found.group(1).strip() if found else cpu
    except OSError:
        pass
    memory = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
        memory = f"{kb / 1024 / 1024:.0f} GB"
    except (OSError, AttributeError):
        pass
    server = EmbeddedRedis().binary
    version = subprocess.run([server, "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "server": version.split(" sha=")[0],
        "load_before": os.getloadavg()[0],
    }


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process *pid* has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def fetch(url: str, gzipped: bool = False, pid: int | None = None) -> tuple[bytes, float, float]:
    """(the body as sent, seconds until its last byte, CPU seconds process *pid* spent meanwhile:
    the exporter's work for it, whatever else the machine runs)."""
    headers = {"Accept-Encoding": "gzip"} if gzipped else {}
    before = cpu_seconds(pid) if pid else 0.0
    started = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as resp:
        body = resp.read()
    took = time.perf_counter() - started
    return body, took, (cpu_seconds(pid) - before) if pid else 0.0


def wait_for(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            fetch(url)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {seconds} s")


def measure(engines: int, rounds: int, warmup: float) -> dict[str, Any]:
    namespace = f"figures-{engines}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    with EmbeddedRedis() as server:
        env.update(REDIS_STATS_URL=server.url, REDIS_STATS_NAMESPACE=namespace, PYTHONPATH=str(ROOT))
        sim = subprocess.Popen(
            [sys.executable, "-m", "redis_stats", "simulate", "--engines", str(engines), "--api-servers",
             str(API_SERVERS), "--model", MODEL, "--report-interval", "3600"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
        )  # fmt: skip
        port = free_port()
        exporter = subprocess.Popen(
            [sys.executable, "-m", "redis_stats", "exporter", "--port", str(port), "--gc-interval", "0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for(base + "/healthz")
            # Until every engine has recorded every family its load makes (the body stops growing).
            deadline, last = time.monotonic() + warmup, 0
            while time.monotonic() < deadline:
                time.sleep(5)
                size = len(fetch(base + "/metrics")[0])
                if last and abs(size - last) < 0.002 * size and time.monotonic() > deadline - warmup / 2:
                    break
                last = size
            return _rounds(base, engines, rounds, exporter.pid)
        finally:
            sim.send_signal(signal.SIGTERM)
            exporter.send_signal(signal.SIGTERM)
            for proc in (sim, exporter):
                try:
                    proc.wait(90)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _rounds(base: str, engines: int, rounds: int, pid: int) -> dict[str, Any]:
    whole, whole_gz, times, gz_times, cpu = [], [], [], [], []
    slices: dict[int, list[list[tuple[int, float]]]] = {n: [] for n in SLICES}
    load_gz = []
    for _ in range(rounds):
        body, took, used = fetch(base + "/metrics", pid=pid)
        whole.append(len(body))
        times.append(took)
        cpu.append(used)
        body, took, _ = fetch(base + "/metrics", gzipped=True)
        whole_gz.append(len(body))
        gz_times.append(took)
        assert gzip.decompress(body)[:6] == b"# HELP"
        for n in SLICES:
            got = [fetch(f"{base}/metrics?slice={i}/{n}") for i in range(n)]
            slices[n].append([(len(b), t) for b, t, _ in got])
        load_gz.append(len(fetch(base + "/load", gzipped=True)[0]))
    out: dict[str, Any] = {
        "engines": engines,
        "api_servers": API_SERVERS,
        "metrics_mib": statistics.median(whole) / MIB,
        "metrics_kb_per_engine": statistics.median(whole) / engines / 1000,
        "metrics_gzip_kb": statistics.median(whole_gz) / 1000,
        "metrics_ms": [1000 * min(times), 1000 * statistics.median(times), 1000 * max(times)],
        "metrics_gzip_ms": [1000 * min(gz_times), 1000 * statistics.median(gz_times), 1000 * max(gz_times)],
        "metrics_cpu_ms": 1000 * statistics.median(cpu),
        "load_gzip_kb": statistics.median(load_gz) / 1000,
    }
    for n in SLICES:
        largest = [max(size for size, _ in r) for r in slices[n]]
        smallest = [min(size for size, _ in r) for r in slices[n]]
        slowest = [max(t for _, t in r) for r in slices[n]]
        out[f"slices_{n}"] = {
            "largest_mib": statistics.median(largest) / MIB,
            "smallest_mib": statistics.median(smallest) / MIB,
            "slowest_ms": 1000 * statistics.median(slowest),
        }
    return out


def report(host: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [
        f"bench/figures.py, {host['date']}: {host['cpu']}, {host['cores']} cores, {host['memory']}, "
        f"{host['os']}, Python {host['python']}, {host['server']} (load average {host['load_before']:.1f} "
        "before the run)",
        f"redis-stats simulate: the full vLLM catalogue, model {MODEL!r}, {API_SERVERS} API servers per "
        "engine, writing all along; a standalone redis-stats exporter asked over HTTP",
        "",
        "| engines | /metrics | per engine | gzipped | request (min / median / max) | exporter CPU "
        "| gzipped request | largest of 4 slices | largest of 8 slices | /load gzipped |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t, g = r["metrics_ms"], r["metrics_gzip_ms"]
        s4, s8 = r["slices_4"], r["slices_8"]
        lines.append(
            f"| {r['engines']:,} x {r['api_servers']} | {r['metrics_mib']:.1f} MiB | "
            f"{r['metrics_kb_per_engine']:.0f} KB | {r['metrics_gzip_kb']:,.0f} KB | "
            f"{t[0]:,.0f} / {t[1]:,.0f} / {t[2]:,.0f} ms | {r['metrics_cpu_ms']:,.0f} ms | {g[1]:,.0f} ms | "
            f"{s4['largest_mib']:.1f} MiB ({s4['slowest_ms']:,.0f} ms) | "
            f"{s8['largest_mib']:.1f} MiB ({s8['slowest_ms']:,.0f} ms) | {r['load_gzip_kb']:.1f} KB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="64,1024")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=float, default=40.0, help="Most seconds the fleet writes before.")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "figures.json"))
    opts = parser.parse_args()
    host = machine()
    results = [measure(int(n), opts.rounds, opts.warmup) for n in opts.engines.split(",")]
    text = report(host, results)
    print(text)
    Path(opts.out).write_text(
        json.dumps({"machine": host, "results": results, "table": text}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
