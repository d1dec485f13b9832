"""The live page at 64 and 1,024 engines (issue 25, item 4): what one poll costs the browser and
the exporter.

For each fleet size (simulated vLLM engines, ``tests/page_fleet.py``, in a process of its own):

- ``/snapshot`` as the page asks for it (``?buckets=0&name[]=`` its seven metrics) against the whole
  document, in the same run: build time in the exporter (median of 5) and body size, and the ratio;
- the page in a real headless Chromium (Debian's ``chromium``/``chromedriver``): browser time of
  each poll, ``performance.now()`` around ``JSON.parse``, the render and the layout it causes
  (``window.__renders``), median and fastest of the polls with a window.

``--cost REF``: what the page costs the **exporter** (issue 50, item 3), this tree's page against
the one at git *REF* (its whole package: the exporter, its views and its page), in the same run:
each exporter in a process of its own over the same simulated fleet, read from ``/proc`` (user +
system CPU of that process): per poll (the page left open for ``--seconds``, its sampler's reads
included: the cost of a page an operator keeps open, divided by its polls) and per reload (the page
opened ``--reloads`` times: ``/namespaces``, ``/history`` and the engines' history it asks, the
first ``/snapshot``). A B A B, each figure the median of its two runs.

Usage: python bench/live_page.py [--engines 64,1024] [--polls 5]
       python bench/live_page.py --cost main --engines 1024 [--seconds 60] [--reloads 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig, StatsReader  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY  # noqa: E402
from redis_stats.server import Exporter  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402
from tests import browser, page_fleet  # noqa: E402
from tests.server import states  # noqa: E402

PAGE_METRICS = [
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
]


def document(exporter: Exporter, names: list[str] | None, buckets: bool = True) -> tuple[float, int]:
    """Median build time (s) of 5 documents, and the size of the last."""
    times, size = [], 0
    for _ in range(5):
        started = time.perf_counter()
        _, doc = states.snapshot_json(exporter, names, buckets)
        body = json.dumps(doc, allow_nan=False).encode()
        times.append(time.perf_counter() - started)
        size = len(body)
    return statistics.median(times), size


def one(engines: int, polls: int) -> None:
    server = EmbeddedRedis().start()
    proc = page_fleet.spawn(
        server.url, "bench", engines, interval=2.0, stale_after=30.0, load=0.3, queued=(3,), full=(5,)
    )
    config = StatsConfig(url=server.url, namespace="bench", stale_after=30.0)
    exporter = Exporter(
        StatsReader(config, vllm_catalog()),
        port=0,
        window=10,
        summary=VLLM_FLEET_SUMMARY,
        history=VLLM_PAGE_HISTORY,
    ).start()
    try:
        states.snapshot_json(exporter)
        time.sleep(2)
        whole_s, whole_b = document(exporter, None)
        page_s, page_b = document(exporter, PAGE_METRICS, buckets=False)
        print(
            f"{engines:5} engines  /snapshot whole: {whole_s * 1000:7.0f} ms {whole_b / 1e6:6.2f} MB   "
            f"the page's ?buckets=0&name[]=: {page_s * 1000:6.0f} ms {page_b / 1e6:5.2f} MB   "
            f"(x{whole_s / page_s:.1f} faster, x{whole_b / page_b:.1f} smaller)"
        )
        b = browser.Browser()
        try:
            b.resize(1280, 1500)
            b.get(exporter.url + "/")
            deadline = time.monotonic() + 60 + polls * 10
            renders: list[dict[str, float]] = []
            while time.monotonic() < deadline:
                renders = [r for r in (b.js("return window.__renders") or []) if r["window"] is not None]
                if len(renders) >= polls:
                    break
                time.sleep(1)
        finally:
            b.close()
        totals = sorted(r["total_ms"] for r in renders)
        parse = statistics.median(r["parse_ms"] for r in renders) if renders else float("nan")
        print(
            f"{'':5}          browser per poll ({len(totals)} polls): "
            f"median {statistics.median(totals):.0f} ms, "
            f"fastest {totals[0]:.0f} ms, slowest {totals[-1]:.0f} ms (JSON.parse median {parse:.0f} ms)"
        )
    finally:
        exporter.close()
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(60)
        server.close()


# An exporter as `redis-stats exporter` makes it (the page's figures given), in a process of its own
# whose package is the tree it runs in; it prints its URL and the package it imported.
EXPORTER = """
import sys
import redis_stats
from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY
from redis_stats.server import Exporter
config = StatsConfig(url=sys.argv[1], namespace=sys.argv[2], stale_after=30.0)
reader = StatsReader(config, vllm_catalog())
e = Exporter(reader, port=0, summary=VLLM_FLEET_SUMMARY, history=VLLM_PAGE_HISTORY).start()
print(e.url, redis_stats.__file__, flush=True)
sys.stdin.read()
e.close()
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process *pid* so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_of(ref: str, into: Path) -> Path:
    """The package at git *ref*, unpacked under *into* (``git archive``)."""
    archive = subprocess.run(
        ["git", "archive", ref, "redis_stats"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(into, filter="data")
    return into


def exporter_cost(tree: Path, url: str, seconds: float, reloads: int) -> tuple[float, float, int]:
    """(exporter CPU ms per poll, per reload, polls) of the page served by the package in *tree*."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(
        [sys.executable, "-c", EXPORTER, url, "bench"],
        cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    base, imported = proc.stdout.readline().split()
    assert imported.startswith(str(tree)), (imported, tree)  # this tree's package, not the venv's
    b = browser.Browser()
    try:
        b.resize(1280, 1500)
        time.sleep(3)
        cpu0 = cpu_seconds(proc.pid)
        for _ in range(reloads):  # each: opened, its first render (and the engines' history) done
            b.get(base + "/")
            deadline = time.monotonic() + 60
            while not b.js("return (window.__renders || []).length >= 1") and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)
        per_reload = (cpu_seconds(proc.pid) - cpu0) / reloads
        polls0, cpu1 = len(b.js("return window.__renders") or []), cpu_seconds(proc.pid)
        time.sleep(seconds)  # the page left open
        polls = len(b.js("return window.__renders") or []) - polls0
        per_poll = (cpu_seconds(proc.pid) - cpu1) / max(1, polls)
    finally:
        b.close()
        proc.stdin.close()
        proc.wait(60)
    return per_poll * 1000, per_reload * 1000, polls


def cost(ref: str, engines: int, seconds: float, reloads: int) -> None:
    server = EmbeddedRedis().start()
    proc = page_fleet.spawn(
        server.url,
        "bench",
        engines,
        interval=2.0,
        stale_after=30.0,
        load=0.3,
        queued=(3,),
        full=(5,),
        down=(7,),
    )
    try:
        with tempfile.TemporaryDirectory(prefix="redis_stats-baseline-") as tmp:
            trees = {f"{ref} (before)": tree_of(ref, Path(tmp)), "this tree (after)": ROOT}
            runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in trees}
            for _ in range(2):  # A B A B
                for name, tree in trees.items():
                    runs[name].append(exporter_cost(tree, server.url, seconds, reloads))
        print(f"{engines} engines, the page open {seconds:.0f} s and reloaded {reloads} times, exporter CPU:")
        med = {
            n: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
            for n, v in runs.items()
        }
        for name, (per_poll, per_reload) in med.items():
            polls = [r[2] for r in runs[name]]
            print(
                f"  {name:28} {per_poll:7.0f} ms per poll ({polls} polls)   {per_reload:7.0f} ms per reload"
            )
        (before_poll, before_reload), (after_poll, after_reload) = med.values()
        print(
            f"  after / before: x{after_poll / before_poll:.2f} per poll,"
            f" x{after_reload / before_reload:.2f} per reload"
        )
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(60)
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="64,1024")
    parser.add_argument("--polls", type=int, default=5)
    parser.add_argument("--cost", metavar="REF", help="the exporter's CPU for this tree's page against REF's")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--reloads", type=int, default=5)
    opts = parser.parse_args()
    if why := browser.missing():
        sys.exit(why)
    for n in (int(x) for x in opts.engines.split(",")):
        if opts.cost:
            cost(opts.cost, n, opts.seconds, opts.reloads)
        else:
            one(n, opts.polls)


if __name__ == "__main__":
    main()
