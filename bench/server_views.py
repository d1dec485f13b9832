"""Each view of the exporter, side by side with another checkout's, at fleet size (issue 39).

A private redis-server (never port 6379) holds two namespaces:

- ``views``: ``--engines`` engines in pods of ``--per-endpoint`` engines, two API-server writers
  per pod (vLLM's full catalogue through the vLLM recorder, a real model name, the load feed);
- ``attack``: ``--attack`` pods of one engine each (every family once), for the request pattern
  that took an exporter from 52 MB to 817 MB: each of ``--attack`` distinct ``?endpoint=``
  values asked once.

Then, per checkout given (``PYTHONPATH=<path> python -m redis_stats exporter``, each its own
process, the checkouts' requests alternated in every round):

1. each view alone, over HTTP: ``/load`` (p50, p99 of ``--polls`` polls), the whole
   ``/metrics``, one of 4 slices, one endpoint's view, ``/snapshot`` (best and median of
   ``--rounds``);
2. the peak memory (``VmHWM``) of an exporter given all of them at once for ``--seconds``;
3. an exporter of ``attack``: its resident memory after one endpoint view, after the
   ``--attack`` distinct endpoints, and ``--idle`` seconds later.

Ratios are to the first checkout's figures. To compare with an older commit::

    git worktree add /tmp/rs-old <commit>
    python bench/server_views.py /tmp/rs-old .

``--only peak`` runs section 2 alone (``--only views``, ``--only attack`` the others), and
``--repeat R`` runs section 2 R times, the checkouts alternated (its figures are noisy).

Usage: python bench/server_views.py [--engines 1024] [--per-endpoint 4] [--attack 1100]
       [--rounds 5] [--polls 400] [--seconds 30] [--idle 75] [--repeat 1]
       [--only views|peak|attack] [PATH ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM  # noqa: E402
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis, free_port  # noqa: E402
from redis_stats.tools.simulate import SimulatedApiServer  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MIB = 1 << 20


def endpoint_of(pod: int) -> str:
    return f"10.{pod // 65536}.{pod // 256 % 256}.{pod % 256}:8000"


def fill_views(url: str, engines: int, per: int) -> list[StatsWriter]:
    """Pods of *per* engines, two writers each, simulated vLLM traffic, one flush each."""
    writers = []
    for pod, first in enumerate(range(0, engines, per)):
        cfg = StatsConfig(
            url=url, namespace="views", endpoint=endpoint_of(pod), stale_after=3600, retention=7200
        )
        mine = list(range(first, min(first + per, engines)))
        for api in range(2):
            writer = StatsWriter(
                cfg, vllm_catalog(), engines=mine, start=False, role=f"api{api}", load=VLLM_LOAD
            )
            sims = [SimulatedApiServer(VllmRecorder(writer, MODEL, [e]), e, seed=31 * e + api) for e in mine]
            now = time.monotonic()
            for step in range(20):
                for sim in sims:
                    sim.step(now + step * 0.05)
            assert writer.flush()
            writers.append(writer)
    return writers


def fill_attack(url: str, pods: int) -> list[StatsWriter]:
    """*pods* pods of one engine each, every family of the catalogue once."""
    writers = []
    for pod in range(pods):
        cfg = StatsConfig(
            url=url, namespace="attack", endpoint=endpoint_of(pod), stale_after=3600, retention=7200
        )
        writer = StatsWriter(cfg, vllm_catalog(), engines=[pod], start=False)
        for spec in vllm_catalog():
            labels = {name: "x" for name in spec.labels}
            if "model_name" in labels:
                labels["model_name"] = MODEL
            handle = writer.metric(spec.name).labels(pod, **labels)
            if spec.kind == COUNTER:
                handle.inc(pod + 1)
            elif spec.kind == GAUGE:
                handle.set(pod % 7 + 1)
            elif spec.kind == HISTOGRAM:
                handle.observe(0.1 * (pod % 5 + 1))
        assert writer.flush()
        writers.append(writer)
    return writers


class Exporter:
    """``python -m redis_stats exporter`` of one checkout, on a free port."""

    def __init__(self, path: str, url: str, namespace: str) -> None:
        self.path = path
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": path}
        args = [sys.executable, "-m", "redis_stats", "exporter", "--redis-url", url]
        args += ["--namespace", namespace, "--port", str(self.port), "--gc-interval", "0"]
        self.proc = subprocess.Popen(
            args, env=env, cwd=path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                get(self.url + "/healthz")
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the exporter of {path} did not start: {self.proc.stderr.read()[-2000:]!r}")  # type: ignore[union-attr]

    def memory(self, field: str) -> float:
        """``VmRSS`` or ``VmHWM`` in MiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise KeyError(field)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def get(url: str, gzip: bool = True) -> bytes:
    headers = {"Accept-Encoding": "gzip"} if gzip else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as r:
        return r.read()


VIEWS = {
    "whole /metrics": "/metrics",
    "/metrics?slice=0/4": "/metrics?slice=0/4",
    "/metrics?endpoint=": "/metrics?endpoint=" + endpoint_of(1),
    "/snapshot": "/snapshot",
}


def timings(exporters: list[Exporter], rounds: int, polls: int) -> dict[str, list[tuple[float, float]]]:
    """Per view, per exporter: (best or p50, median or p99) seconds; checkouts alternated."""
    out: dict[str, list[tuple[float, float]]] = {}
    for name, path in VIEWS.items():
        took: list[list[float]] = [[] for _ in exporters]
        for e in exporters:
            get(e.url + path)  # warm: plans, layouts, the endpoint map
        for _ in range(rounds):
            for k, e in enumerate(exporters):
                started = time.perf_counter()
                get(e.url + path)
                took[k].append(time.perf_counter() - started)
        out[name] = [(min(t), statistics.median(t)) for t in took]
    took = [[] for _ in exporters]
    for e in exporters:
        get(e.url + "/load")  # the refresher starts with the first request
    for _ in range(polls):
        for k, e in enumerate(exporters):
            started = time.perf_counter()
            get(e.url + "/load")
            took[k].append(time.perf_counter() - started)
        time.sleep(0.005)
    out["/load (p50, p99)"] = [(statistics.median(t), sorted(t)[int(0.99 * len(t))]) for t in took]
    return out


def all_at_once(exporter: Exporter, seconds: float) -> None:
    """Every view at once: 4 slice scrapes and a whole /metrics every 5 s, /snapshot every 2 s,
    an endpoint view every 0.5 s, /load every 0.1 s."""
    stop = time.monotonic() + seconds

    def every(interval: float, paths: list[str]) -> None:
        while time.monotonic() < stop:
            started = time.monotonic()
            with ThreadPoolExecutor(len(paths)) as pool:
                list(pool.map(lambda p: get(exporter.url + p), paths))
            time.sleep(max(0.0, interval - (time.monotonic() - started)))

    jobs = [
        (5.0, [f"/metrics?slice={i}/4" for i in range(4)] + ["/metrics"]),
        (2.0, ["/snapshot?buckets=0"]),
        (0.5, ["/metrics?endpoint=" + endpoint_of(2)]),
        (0.1, ["/load"]),
    ]
    threads = [threading.Thread(target=every, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="*", default=[str(ROOT)])
    parser.add_argument("--engines", type=int, default=1024)
    parser.add_argument("--per-endpoint", type=int, default=4)
    parser.add_argument("--attack", type=int, default=1100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--polls", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--idle", type=float, default=75.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs of section 2, checkouts alternated")
    parser.add_argument("--only", choices=["views", "peak", "attack"], help="one section alone")
    opts = parser.parse_args()
    when = time.strftime("%Y-%m-%d %H:%M")
    print(f"{platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}, {when}")
    server = EmbeddedRedis().start()
    try:
        started = time.monotonic()
        attack = opts.only in (None, "attack")
        kept = fill_views(server.url, opts.engines, opts.per_endpoint) if opts.only != "attack" else []
        kept += fill_attack(server.url, opts.attack) if attack else []
        print(
            f"filled {opts.engines} engines x 2 writers in pods of {opts.per_endpoint}, and "
            f"{opts.attack if attack else 0} one-engine pods, in {time.monotonic() - started:.0f} s"
        )
        report(opts, server.url)
        for w in kept:
            w._closed = True
    finally:
        server.close()


def report(opts: argparse.Namespace, url: str) -> None:
    names = [Path(p).resolve().name for p in opts.paths]
    if opts.only in (None, "views"):
        each_view(opts, url, names)
    if opts.only in (None, "peak"):
        peak(opts, url, names)
    if opts.only in (None, "attack"):
        attack(opts, url, names)


def each_view(opts: argparse.Namespace, url: str, names: list[str]) -> None:
    exporters = [Exporter(p, url, "views") for p in opts.paths]
    try:
        rows = timings(exporters, opts.rounds, opts.polls)
    finally:
        for e in exporters:
            e.close()
    print(f"\n1. each view alone ({opts.rounds} rounds; /load {opts.polls} polls), ms, ratio to {names[0]}")
    for view, per in rows.items():
        cells = [
            f"{names[k]}: {a * 1e3:8.2f} / {b * 1e3:8.2f} ({a / per[0][0]:4.2f}x)"
            for k, (a, b) in enumerate(per)
        ]
        print(f"  {view:22s} " + "   ".join(cells))


def peak(opts: argparse.Namespace, url: str, names: list[str]) -> None:
    print(f"\n2. peak memory under every view at once for {opts.seconds:.0f} s (VmHWM, MiB)")
    for run in range(opts.repeat):
        order = list(range(len(opts.paths)))
        if run % 2:
            order.reverse()  # the other checkout first: alternated
        peaks = [0.0] * len(order)
        for k in order:
            e = Exporter(opts.paths[k], url, "views")
            try:
                all_at_once(e, opts.seconds)
                peaks[k] = e.memory("VmHWM")
            finally:
                e.close()
        cells = [f"{n}: {p:7.1f} ({p / peaks[0]:4.2f}x)" for n, p in zip(names, peaks)]
        print("  " + "   ".join(cells), flush=True)


def attack(opts: argparse.Namespace, url: str, names: list[str]) -> None:
    print(f"\n3. {opts.attack} distinct ?endpoint= values, each asked once (VmRSS, MiB)")
    for name, path in zip(names, opts.paths):
        e = Exporter(path, url, "attack")
        try:
            get(e.url + "/metrics?endpoint=" + endpoint_of(0))
            rest = e.memory("VmRSS")
            for pod in range(opts.attack):
                get(e.url + "/metrics?endpoint=" + endpoint_of(pod))
            after = e.memory("VmRSS")
            time.sleep(opts.idle)
            later = e.memory("VmRSS")
            print(
                f"  {name}: resting {rest:7.1f}, after {after:7.1f}, {opts.idle:.0f} s later {later:7.1f}, "
                f"peak {e.memory('VmHWM'):7.1f}"
            )
        finally:
            e.close()


if __name__ == "__main__":
    main()
