"""A writer made before os.fork(): parent and children each count exactly their own updates.

The honest cases: a fork while threads of the parent record, a fork while the parent's flusher
waits on a slow Redis (holding its flush lock), and a real gunicorn ``--preload`` app whose
workers inherit the writer made at import.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from redis_stats import StatsConfig, StatsReader

from .conftest import PYTHON, ROOT, sample_catalog
from .proxy import CuttingProxy

pytestmark = [pytest.mark.redis_server, pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")]


def _engine0(url: str, namespace: str):
    snap = StatsReader(StatsConfig(url=url, namespace=namespace), sample_catalog()).snapshot()
    return snap.engines[0], snap


def _run_fork_proc(url: str, namespace: str, mode: str, n: int, children: int, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [PYTHON, "-m", "tests.helpers.fork_proc", url, namespace, mode, str(n), str(children)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fork_while_threads_record_counts_parent_and_children_exactly(redis_server, namespace, python_env):
    n, children = 1000, 2
    out = _run_fork_proc(redis_server.url, namespace, "recording", n, children, python_env)
    print(f"\n[fork while recording] {out}")
    assert [c["code"] for c in out["children"]] == [0] * children
    assert all(c["seconds"] < 5 for c in out["children"]), out
    e, snap = _engine0(redis_server.url, namespace)
    recorded = out["parent_sent"] + children * n
    print(f"[fork while recording] recorded {recorded}, stored {e.counter('tokens')}")
    assert e.counter("tokens") == recorded
    assert e.histogram("latency_seconds").count == recorded
    assert e.counter("requests", "child") == children * n
    # Each child flushed as its own writer, and every writer closed cleanly.
    assert len(snap.writers) == 1 + children
    assert all(w.closed for w in snap.writers.values())


def test_fork_while_the_flusher_waits_on_a_slow_redis(redis_server, namespace, python_env):
    n, children = 500, 2
    proxy = CuttingProxy(redis_server.port)
    proxy.delay = 0.3  # every reply: the parent's flusher holds its flush lock for 0.3 s
    try:
        env = dict(python_env, REDIS_STATS_CLOSE_TIMEOUT="10")
        out = _run_fork_proc(proxy.url, namespace, "flushing", n, children, env)
    finally:
        proxy.close()
    print(f"\n[fork while flushing] {out}")
    # Before: the child inherited a held flush lock and hung for ever in its exit-time close().
    assert [c["code"] for c in out["children"]] == [0] * children, out
    assert all(c["seconds"] < 5 for c in out["children"]), out
    e, _ = _engine0(redis_server.url, namespace)
    assert e.counter("tokens") == children * n
    assert e.histogram("latency_seconds").count == children * n
    assert e.counter("requests", "child") == children * n
