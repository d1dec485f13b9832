"""Attack (issue 39 item 2): what a thousand distinct ``?slice=`` values make the exporter keep.

Every other parameter held (measured on a real exporter process over 1,000 one-engine pods with
the full vLLM catalogue: 1,000 distinct ``?endpoint=``, ``?engine=``, unknown endpoints,
``?namespace=``, ``/get_load?endpoint=``, ``If-None-Match`` and ``?name[]=`` took it from 47.1 to
50.1 MiB, 50.1 a minute later; 3,000 distinct ``/load?slice=`` from 51.4 to 53.5). ``?slice=``
did not: each slice asked kept a reader of its own, whose fixed part (the catalogue it parsed
from Redis, ~100 KB at vLLM's) the view budget did not count, and the memory freed when the
slices went idle did not come back to the system (1,000 distinct slices of a 64-engine fleet: 52
MiB resting, 231 after, 204 a minute after every slice was dropped); ``/load?slice=`` kept about
twice what the budget counted. Now the slices share two readers, a renderer is kept for 16
slices at most and counted with its fixed part.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from pathlib import Path

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.server import Exporter
from redis_stats.server.http import Request
from redis_stats.tools.embedded import free_port
from tests.conftest import ROOT
from tests.server.test_kept_views import fleet

pytestmark = pytest.mark.redis_server

MIB = 2**20


@pytest.fixture
def pods(redis_server, namespace):
    """16 pods of 4 engines (64 engines), two API servers each, the full vLLM catalogue."""
    writers = fleet(redis_server.url, namespace, 16)
    yield StatsConfig(url=redis_server.url, namespace=namespace)
    for w in writers:
        w._closed = True


def one_engine_slices(n: int) -> list[str]:
    """*n* distinct slices of the 64-engine fleet holding one engine each (``k/N``, N >= 64)."""
    return [f"slice={k % 64}/{64 + k // 64}" for k in range(n)]


def empty_slices(n: int) -> list[str]:
    """*n* distinct slices of the 64-engine fleet holding no engine (``k/4096``, k >= 64)."""
    return [f"slice={64 + k}/4096" for k in range(n)]


def test_the_view_budget_bounds_what_small_slices_really_keep(pods):
    budget = 4 * MIB
    exporter = Exporter(StatsReader(pods, vllm_catalog()), port=0, view_budget=budget)
    try:
        assert exporter.app(Request("GET", "/metrics", "")).status == 200
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for query in empty_slices(300):
                assert exporter.app(Request("GET", "/metrics", query)).status == 200
            gc.collect()
            used = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        estimate = sum(exporter.app.kept.bytes_by_kind().values())
        assert estimate <= budget
        assert used <= 1.5 * budget, f"{used / MIB:.1f} MiB kept for a budget of {budget / MIB:.0f} MiB"
    finally:
        exporter.close()


def test_the_view_budget_bounds_what_load_slices_really_keep(pods):
    budget = 64 * 2**10
    # (no refresh while memory is measured: a refresh in flight holds its read, not kept state)
    exporter = Exporter(StatsReader(pods, vllm_catalog()), port=0, view_budget=budget, load_refresh=60)
    try:
        assert exporter.app(Request("GET", "/load", "")).status == 200
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for query in empty_slices(2000):
                assert exporter.app(Request("GET", "/load", query)).status == 200
            gc.collect()
            used = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert used <= 1.5 * budget, f"{used / 2**10:.0f} KiB kept for a budget of {budget / 2**10:.0f} KiB"
    finally:
        exporter.close()


SERVE = """
import sys, time
from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.server import Exporter
config = StatsConfig(url=sys.argv[1], namespace=sys.argv[2])
exporter = Exporter(
    StatsReader(config, vllm_catalog()), port=int(sys.argv[3]), view_idle=2.0, self_metrics=True
).start()
time.sleep(600)
"""


def _rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200
        return r.read()


def _slices_kept(url: str) -> bool:
    with urllib.request.urlopen(url + "/metrics?name[]=redis_stats_exporter_kept_entries", timeout=30) as r:
        return b'kind="slice"' in r.read()


def test_the_memory_of_a_thousand_slices_comes_back_once_they_are_dropped(pods, python_env):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, pods.url, pods.namespace, str(port)],
        env=python_env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(url + "/metrics")
                break
            except OSError:
                assert time.monotonic() < deadline, "the exporter did not start"
                time.sleep(0.1)
        _get(url + "/metrics?slice=0/2")
        rest = _rss(proc.pid)
        for query in one_engine_slices(500):
            _get(url + "/metrics?" + query)
        peak = _rss(proc.pid)
        assert peak <= rest + 16, f"resting {rest:.0f} MiB, {peak:.0f} with the slices"  # 16 kept at most
        deadline = time.monotonic() + 30  # idle past view_idle, then the upkeep's sweep (every 10 s)
        while _slices_kept(url):
            assert time.monotonic() < deadline, "the slices were not dropped"
            time.sleep(1)
        time.sleep(1)
        later = _rss(proc.pid)
        assert later <= rest + 16, f"resting {rest:.0f} MiB, {peak:.0f} with the slices, {later:.0f} after"
    finally:
        proc.terminate()
        proc.wait(10)
