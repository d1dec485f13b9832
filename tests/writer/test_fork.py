"""A writer made before os.fork(): parent and children each count exactly their own updates.

The honest cases: a fork while threads of the parent record, a fork while the parent's flusher
waits on a slow Redis (holding its flush lock), and a real gunicorn ``--preload`` app whose
workers inherit the writer made at import.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.tools.embedded import free_port
from tests.conftest import PYTHON, ROOT, sample_catalog
from tests.proxy import CuttingProxy

pytestmark = [pytest.mark.redis_server, pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")]


def _engine0(url: str, namespace: str):
    snap = StatsReader(StatsConfig(url=url, namespace=namespace), sample_catalog()).snapshot()
    return snap.engines[0], snap


def _run_fork_proc(url: str, namespace: str, mode: str, n: int, children: int, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [PYTHON, "-m", "tests.helpers.fork_proc", url, namespace, mode, str(n), str(children)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fork_while_threads_record_counts_parent_and_children_exactly(redis_server, namespace, python_env):
    n, children = 1000, 2
    out = _run_fork_proc(redis_server.url, namespace, "recording", n, children, python_env)
    e, snap = _engine0(redis_server.url, namespace)
    recorded = out["parent_sent"] + children * n
    print(f"\n[fork while recording] {out}\nrecorded {recorded}, stored {e.counter('tokens')}")
    assert [c["code"] for c in out["children"]] == [0] * children
    assert all(c["seconds"] < 5 for c in out["children"]), out
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
    e, _ = _engine0(redis_server.url, namespace)
    print(f"\n[fork while flushing] {out}\nrecorded {children * n}, stored {e.counter('tokens')}")
    # Before: the child inherited a held flush lock and hung for ever in its exit-time close().
    assert [c["code"] for c in out["children"]] == [0] * children, out
    assert all(c["seconds"] < 5 for c in out["children"]), out
    assert e.counter("tokens") == children * n
    assert e.histogram("latency_seconds").count == children * n
    assert e.counter("requests", "child") == children * n


def test_gunicorn_preload_workers_count_every_request(own_redis_server, namespace, python_env):
    pytest.importorskip("gunicorn")
    n, workers = 300, 3
    port = free_port()
    env = dict(python_env, REDIS_STATS_URL=own_redis_server.url, REDIS_STATS_NAMESPACE=namespace)
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "gunicorn",
            "--preload",
            "-w",
            str(workers),
            "-b",
            f"127.0.0.1:{port}",
            "--graceful-timeout",
            "10",
            "tests.helpers.gunicorn_app:app",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 30
        while True:  # wait until gunicorn answers (nothing is recorded before the first request)
            try:
                with urllib.request.urlopen(base + "ready", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.1)

        def get(i: int) -> int:
            with urllib.request.urlopen(f"{base}{i}", timeout=10) as resp:
                return resp.status

        with ThreadPoolExecutor(8) as pool:  # concurrent, so that every worker serves some
            assert set(pool.map(get, range(n))) == {200}
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)  # workers exit gracefully: their writers close at exit
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    e, snap = _engine0(own_redis_server.url, namespace)
    served = n + 1  # and the readiness request
    print(f"\n[gunicorn --preload -w {workers}] served {served}, stored {e.counter('requests', 'ok')}")
    assert e.counter("requests", "ok") == served
    assert e.counter("tokens") == 3 * served
    assert e.histogram("latency_seconds").count == served
    # The master and each worker wrote as themselves.
    assert len(snap.writers) >= 2


def _child_records(writer, n: int) -> None:
    tokens = writer.counter("tokens").labels(engine=0)
    for _ in range(n):
        tokens.inc()
        writer.histogram("latency_seconds").observe(0.3, engine=0)


def test_multiprocessing_fork_children_count_for_themselves(redis_server, namespace):
    import multiprocessing

    from redis_stats import StatsWriter

    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.05)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0])
    writer.counter("tokens").labels(engine=0).inc(7)  # pending in the parent at the fork
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_child_records, args=(writer, 400)) for _ in range(3)]
    started = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    elapsed = time.monotonic() - started
    # A multiprocessing child ends with os._exit() (no atexit): its writer still closes.
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert elapsed < 10
    assert writer.close()
    e, snap = _engine0(redis_server.url, namespace)
    print(f"\n[multiprocessing fork] recorded {7 + 3 * 400}, stored {e.counter('tokens')}")
    assert e.counter("tokens") == 7 + 3 * 400
    assert e.histogram("latency_seconds").count == 3 * 400
    assert len(snap.writers) == 4


def test_async_writer_inherited_across_fork_sends_only_the_childs_data_once_started(redis_server, namespace):
    import asyncio

    from redis_stats.aio import AsyncStatsWriter

    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.05)
    writer = AsyncStatsWriter(cfg, sample_catalog(), engines=[0])
    tokens = writer.counter("tokens").labels(engine=0)
    tokens.inc(5)  # pending in the parent at the fork: the parent's alone
    parent_id = writer.writer_id

    async def child_main() -> bool:
        writer.start()  # the rule: start the inherited writer on the child's own loop
        tokens.inc(10)
        await asyncio.sleep(0.2)
        return writer.writer_id != parent_id and await writer.close()

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if asyncio.run(child_main()) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert asyncio.run(writer.close())
    e, snap = _engine0(redis_server.url, namespace)
    assert e.counter("tokens") == 15
    assert len(snap.writers) == 2
