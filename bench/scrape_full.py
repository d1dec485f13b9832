"""Scrape time with the full vLLM catalogue, by engines and API-server writers per engine.

Fills one private redis-server the way a busy fleet does (every engine gets simulated vLLM
traffic through ``VllmRecorder`` from *writers* API servers, 20 engine steps each, then one flush
per writer), then times what the exporter serves for ``/metrics`` (``RedisCollector.render_text``,
the fast text path) and the decoded snapshot (``StatsReader.snapshot``, what ``/snapshot`` and
the prometheus_client path use). Best of several runs: noise on a shared machine only adds.
``reply KB`` is the size of what one read returns (the strings of the reply).

``generate_latest`` is prometheus_client's formatting of the same samples (the families of one
``collect()``, held in a registry): what it would cost prometheus_client to serve them; ``busy/pc``
is the busy scrape (read, decode and text) against it.

Given package paths (checkouts: the directory holding ``redis_stats/``), it times each of them
in a worker process of its own (``PYTHONPATH=<path>``) against one redis-server, alternating the
versions round by round, and prints each version's best and the ratio of each to the first
(issue 15: read figures before and after a format change, in the same run):

    python bench/scrape_full.py /path/to/old/checkout /path/to/new/checkout
    python bench/scrape_full.py                  # this tree (or the first entry of PYTHONPATH)

``--clock cpu`` times with the process's CPU time (``time.process_time``) instead of the wall
clock: on a shared machine whose other processes keep both cores busy, the wall clock mostly
measures the wait for a core (both versions' figures swing by 1.5x from one round to the next).

Usage: python bench/scrape_full.py [--engines 64,1024] [--writers 1,2] [--rounds 5]
       [--clock wall|cpu] [PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _imports() -> Any:
    """The package's names, in the layout after issue 14 or before it (an older checkout)."""
    import redis_stats
    from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
    from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
    from redis_stats.keys import SCHEMA_VERSION

    try:
        from redis_stats.tools.embedded import EmbeddedRedis
        from redis_stats.tools.simulate import SimulatedApiServer
    except ImportError:  # before the relayout (#14): flat modules
        from redis_stats.embedded import EmbeddedRedis  # type: ignore[no-redef]
        from redis_stats.simulate import SimulatedApiServer  # type: ignore[no-redef]

    class Names:
        pass

    names: Any = Names()
    names.__dict__.update(
        package=Path(redis_stats.__file__).parent,
        RedisCollector=RedisCollector,
        StatsConfig=StatsConfig,
        StatsReader=StatsReader,
        StatsWriter=StatsWriter,
        VllmRecorder=VllmRecorder,
        vllm_catalog=vllm_catalog,
        SCHEMA_VERSION=SCHEMA_VERSION,
        EmbeddedRedis=EmbeddedRedis,
        SimulatedApiServer=SimulatedApiServer,
    )
    return names


# The synthetic set bench/peers.py compares libraries with: 40 series per engine.
SYNTHETIC = {"counters": 20, "gauges": 16, "histograms": 4}
SYNTHETIC_BUCKETS = [0.001 * 2**i for i in range(19)]  # 19 bounds and +Inf: 20 buckets


class SyntheticServer:
    """One engine's 40 synthetic series in one writer, each changed by every :meth:`step` (the
    stand-in for :class:`SimulatedApiServer` with ``--catalogue synthetic``)."""

    def __init__(self, writer: Any, engine: int) -> None:
        self.counters = [writer.counter(f"counter_{i}").labels(engine=engine) for i in range(20)]
        self.gauges = [writer.gauge(f"gauge_{i}").labels(engine=engine) for i in range(16)]
        self.histograms = [writer.histogram(f"hist_{i}").labels(engine=engine) for i in range(4)]
        self.engine = engine
        self.steps = 0

    def step(self, now: float) -> None:
        self.steps += 1
        for i, c in enumerate(self.counters):
            c.inc(1 + (self.engine + i) % 7)
        for i, g in enumerate(self.gauges):
            g.set(self.steps * 0.5 + i)
        for i, h in enumerate(self.histograms):
            h.observe(SYNTHETIC_BUCKETS[(self.steps + i) % len(SYNTHETIC_BUCKETS)] * 0.9)


def synthetic_catalog(rs: Any) -> Any:
    """The synthetic set's catalogue."""
    from redis_stats import Catalog

    cat = Catalog()
    for i in range(20):
        cat.counter(f"counter_{i}", "c")
    for i in range(16):
        cat.gauge(f"gauge_{i}", "g")
    for i in range(4):
        cat.histogram(f"hist_{i}", "h", buckets=SYNTHETIC_BUCKETS)
    return cat


CATALOGUE = "vllm"  # or "synthetic" (--catalogue)


def catalog_of(rs: Any) -> Any:
    """The catalogue the bench fills (--catalogue)."""
    return synthetic_catalog(rs) if CATALOGUE == "synthetic" else rs.vllm_catalog()


def fill(
    rs: Any, url: str, namespace: str, engines: int, writers: int, shards: int = 1
) -> list[tuple[Any, list[Any]]]:
    """*writers* simulated API servers per engine, 20 steps each, one flush per writer; the
    writers and their simulated servers, to go on (:func:`churn`). With the synthetic
    catalogue (``--catalogue synthetic``), 40 series per engine, each changed by every step."""
    # A flush of 1,024 engines can take schema 1's script over a second on a busy machine.
    cfg = rs.StatsConfig(url=url, namespace=namespace, socket_timeout_ms=30_000, shards=shards)
    cat = catalog_of(rs)
    made = []
    for w in range(writers):
        writer = rs.StatsWriter(cfg, cat, engines=list(range(engines)), start=False, role=f"api{w}")
        if CATALOGUE == "synthetic":
            sims: list[Any] = [SyntheticServer(writer, e) for e in range(engines)]
        else:
            sims = [
                rs.SimulatedApiServer(rs.VllmRecorder(writer, "model", [e]), e, seed=w * 100_000 + e)
                for e in range(engines)
            ]
        now = time.monotonic()
        for step in range(20):
            for sim in sims:
                sim.step(now + step * 0.05)
        assert writer.flush()
        made.append((writer, sims))
    return made


def churn(made: list[tuple[Any, list[Any]]]) -> None:
    """One more engine step of every simulated server, and a flush of every writer: every
    chunk changes, as between two scrapes of a busy fleet."""
    now = time.monotonic()
    for writer, sims in made:
        for sim in sims:
            sim.step(now)
        assert writer.flush()


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # set by --clock (in the worker: by each request)


def best_churned_ms(fn: Any, runs: int, made: list[tuple[Any, list[Any]]]) -> float:
    """:func:`best_ms`, with every chunk changed before each call (not timed)."""
    times = []
    for _ in range(runs):
        churn(made)
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times) * 1e3


def best_ms(fn: Any, runs: int) -> float:
    """The fastest of *runs* calls of *fn*, in ms."""
    times = []
    for _ in range(runs):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times) * 1e3


def reply_bytes(reply: Any) -> int:
    """The size of the strings in a read reply."""
    if isinstance(reply, (list, tuple)):
        return sum(reply_bytes(x) for x in reply)
    if isinstance(reply, (str, bytes)):
        return len(reply)
    return 0


class Bench:
    """One namespace per (engines, writers), filled once, timed on demand."""

    def __init__(self, rs: Any, url: str) -> None:
        self.rs = rs
        self.url = url
        self.views: dict[tuple[int, int], Any] = {}

    def prepare(self, engines: int, writers: int, tag: str) -> None:
        rs = self.rs
        ns = f"scrape-{engines}-{writers}-{tag}"
        made = fill(rs, self.url, ns, engines, writers)
        reader = rs.StatsReader(rs.StatsConfig(url=self.url, namespace=ns), catalog_of(rs))
        collector = rs.RedisCollector(reader)
        text = collector.render_text()  # warm: field caches, engine list
        reader.snapshot()
        samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        self.views[engines, writers] = (reader, collector, samples, reply_bytes(reader.read()), made)

    def time(self, engines: int, writers: int, runs: int) -> dict[str, float]:
        """Best times of both paths: the store unchanged between reads (an idle fleet), and
        every chunk changed before each read (a busy one: writers flush every second, scrapes
        come every 15 s or more)."""
        reader, collector, samples, size, made = self.views[engines, writers]
        from prometheus_client import CollectorRegistry, generate_latest

        class Static:
            """prometheus_client holding the same samples (the families of one collect)."""

            def __init__(self, families: list[Any]) -> None:
                self.families = families

            def collect(self) -> Any:
                return self.families

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Static(list(collector.collect())))
        return {
            "prometheus_client": best_ms(lambda: generate_latest(registry), runs),
            "scrape": best_ms(collector.render_text, runs),
            "snapshot": best_ms(reader.snapshot, runs),
            "scrape_busy": best_churned_ms(collector.render_text, runs, made),
            "snapshot_busy": best_churned_ms(reader.snapshot, runs, made),
            "samples": samples,
            "kb": size / 1024,
        }


def worker(url: str, tag: str, catalogue: str) -> None:
    """Serve the parent: one JSON request per line on stdin, one JSON answer per line."""
    global clock, CATALOGUE
    CATALOGUE = catalogue
    rs = _imports()
    bench = Bench(rs, url)
    print(json.dumps({"package": str(rs.package), "schema": rs.SCHEMA_VERSION}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "prepare":
            bench.prepare(req["engines"], req["writers"], tag)
            print(json.dumps({}), flush=True)
        else:
            clock = CLOCKS[req.get("clock", "wall")]
            print(json.dumps(bench.time(req["engines"], req["writers"], req["runs"])), flush=True)


class Worker:
    """A worker process importing redis_stats from *path*."""

    def __init__(self, path: str, url: str, tag: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", url, tag, CATALOGUE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.hello = self._answer()

    def _answer(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker {self.proc.args} failed (see above)")
        return json.loads(line)

    def ask(self, **req: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def compare(paths: list[str], sizes: list[tuple[int, int]], rounds: int, rs: Any, clock_name: str) -> None:
    """Each of *paths* timed round by round, alternating; bests and ratios to the first."""
    with rs.EmbeddedRedis() as server:
        workers = [Worker(p, server.url, f"v{i}") for i, p in enumerate(paths)]
        try:
            for i, w in enumerate(workers):
                print(f"v{i}: redis_stats from {w.hello['package']} (schema {w.hello['schema']})")
            print(f"clock: {clock_name}")
            head = f"{'':>8}{'':>8}  {'':<5}{'':>8}{'':>10}"
            print(head + f"{'--- unchanged store ---':>38}{'--- every chunk changed ---':>38}")
            head = f"{'engines':>8}{'writers':>8}  {'version':<5}{'samples':>8}{'reply KB':>10}"
            cols = f"{'scrape ms':>11}{'x v0':>7}{'snapshot ms':>13}{'x v0':>7}"
            print(head + cols + cols + f"{'busy/pc':>8}")
            for engines, writers in sizes:
                for w in workers:
                    w.ask(op="prepare", engines=engines, writers=writers)
                best: list[dict[str, float]] = [{} for _ in workers]
                runs = 3 if engines >= 256 else 5
                for r in range(rounds):
                    # Alternate which version goes first: a slow spell hits both alike.
                    order = list(enumerate(workers))
                    for i, w in order if r % 2 == 0 else order[::-1]:
                        got = w.ask(op="time", engines=engines, writers=writers, runs=runs, clock=clock_name)
                        for k, v in got.items():
                            best[i][k] = min(best[i].get(k, v), v)
                base = best[0]
                for i, b in enumerate(best):
                    print(
                        f"{engines:>8}{writers:>8}  {'v' + str(i):<5}{b['samples']:>8.0f}{b['kb']:>10.0f}"
                        f"{b['scrape']:>11.1f}{b['scrape'] / base['scrape']:>7.2f}"
                        f"{b['snapshot']:>13.1f}{b['snapshot'] / base['snapshot']:>7.2f}"
                        f"{b['scrape_busy']:>11.1f}{b['scrape_busy'] / base['scrape_busy']:>7.2f}"
                        f"{b['snapshot_busy']:>13.1f}{b['snapshot_busy'] / base['snapshot_busy']:>7.2f}"
                        f"{b['scrape_busy'] / b['prometheus_client']:>8.2f}"
                    )
        finally:
            for w in workers:
                w.close()


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="64,1024")
    parser.add_argument("--writers", default="1,2", help="API-server writers per engine")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (with paths)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="wall clock or CPU time")
    parser.add_argument(
        "--catalogue",
        choices=["vllm", "synthetic"],
        default="vllm",
        help="vLLM's catalogue, or the 40-series synthetic set of bench/peers.py",
    )
    parser.add_argument("paths", nargs="*", help="checkouts to compare (the first is the baseline)")
    opts = parser.parse_args()
    global clock, CATALOGUE
    clock = CLOCKS[opts.clock]
    CATALOGUE = opts.catalogue
    sizes = [(int(e), int(w)) for e in opts.engines.split(",") for w in opts.writers.split(",")]
    rs = _imports()
    if opts.paths:
        compare(opts.paths, sizes, opts.rounds, rs, opts.clock)
        return
    print(f"redis_stats from {rs.package} (schema {rs.SCHEMA_VERSION})")
    print(
        f"{'engines':>8}{'writers':>8}{'samples':>10}{'reply KB':>10}{'scrape ms':>11}{'snapshot ms':>13}"
        f"{'busy scrape':>13}{'busy snapshot':>15}{'generate_latest':>17}{'busy/pc':>9}"
    )
    with rs.EmbeddedRedis() as server:
        bench = Bench(rs, server.url)
        for engines, writers in sizes:
            bench.prepare(engines, writers, "v0")
            b = bench.time(engines, writers, 5 if engines >= 256 else 9)
            print(
                f"{engines:>8}{writers:>8}{b['samples']:>10.0f}{b['kb']:>10.0f}"
                f"{b['scrape']:>11.1f}{b['snapshot']:>13.1f}{b['scrape_busy']:>13.1f}{b['snapshot_busy']:>15.1f}"
                f"{b['prometheus_client']:>17.1f}{b['scrape_busy'] / b['prometheus_client']:>9.2f}"
            )


if __name__ == "__main__":
    main()
