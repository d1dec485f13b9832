"""close() and interpreter exit with Redis stopped (SIGSTOP: replies never come) or refused: the
host's shutdown waits at most ``close_timeout`` (plus a little), and one line says what was lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import subprocess
import threading
import time

import pytest

from redis_stats import StatsConfig, StatsWriter
from redis_stats.aio import AsyncStatsWriter
from redis_stats.connection import make_async_client
from redis_stats.tools.embedded import free_port
from tests.conftest import PYTHON, ROOT, sample_catalog
from tests.hiccups import cancel_as_timeout, frozen, stop_for_good

pytestmark = pytest.mark.redis_server

# Scheduling on a loaded machine: a margin it cannot miss. The bug is a close that waits on the
# network: 5-10 s before, and with Redis stopped the 10 s socket timeout the tests below set.
SLACK = 3.0
WAIT_MS = 10_000


def _stopped(server):
    """SIGSTOP the server: connections are accepted by the kernel, nothing is ever answered."""

    class _Ctx:
        def __enter__(self):
            os.kill(server.pid, signal.SIGSTOP)

        def __exit__(self, *exc):
            os.kill(server.pid, signal.SIGCONT)

    return _Ctx()


def _lost_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "gave up after" in r.getMessage()]


def test_close_with_redis_stopped_returns_within_close_timeout_and_says_what_was_lost(
    own_redis_server, namespace, caplog
):
    cfg = StatsConfig(
        url=own_redis_server.url, namespace=namespace, flush_interval=0.05, socket_timeout_ms=WAIT_MS
    )
    writer = StatsWriter(cfg, sample_catalog(), engines=[0])
    tokens = writer.counter("tokens").labels(engine=0)
    tokens.inc()
    deadline = time.monotonic() + 10
    while writer.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not writer.pending()  # connected and flushed once
    with _stopped(own_redis_server), caplog.at_level(logging.WARNING, "redis_stats.writer"):
        tokens.inc(5)
        writer.counter("requests").labels(engine=0, reason="stop").inc()
        time.sleep(0.2)  # the flusher now waits for a reply (for up to WAIT_MS)
        started = time.monotonic()
        ok = writer.close()
        elapsed = time.monotonic() - started
    print(f"\n[close, Redis stopped] close() took {elapsed:.2f} s (close_timeout {cfg.close_timeout} s)")
    assert not ok
    assert elapsed < cfg.close_timeout + SLACK
    (line,) = _lost_lines(caplog)
    assert own_redis_server.url in line and "2 series in the unconfirmed batch" in line, line


def test_close_with_redis_refused_is_bounded_and_the_line_masks_the_password(namespace, caplog):
    url = f"redis://app:s3cret-pw@127.0.0.1:{free_port()}/0"  # nothing listens there
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=0.05, close_timeout=0.3)
    # Recorded before the flusher starts, so that its first (failing) batch holds both series
    # however late this thread runs on a loaded machine.
    writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    writer.counter("tokens").labels(engine=0).inc(3)
    writer.histogram("latency_seconds").labels(engine=0).observe(0.2)
    writer.start()
    time.sleep(0.2)
    with caplog.at_level(logging.WARNING, "redis_stats.writer"):
        started = time.monotonic()
        assert not writer.close()
        elapsed = time.monotonic() - started
    assert elapsed < 0.3 + SLACK
    (line,) = _lost_lines(caplog)
    assert "s3cret-pw" not in caplog.text
    assert "redis://app:***@127.0.0.1" in line and "2 series in the unconfirmed batch" in line, line


def test_interpreter_exit_with_redis_stopped_waits_at_most_close_timeout(
    own_redis_server, namespace, python_env
):
    with _stopped(own_redis_server):
        proc = subprocess.run(
            [PYTHON, "-m", "tests.helpers.exit_proc", own_redis_server.url, namespace],
            cwd=ROOT,
            env=python_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        ended = time.time()
    exiting = float(proc.stdout.split("exiting ")[1].split()[0])
    print(f"\n[exit, Redis stopped] the interpreter's exit took {ended - exiting:.2f} s")
    assert proc.returncode == 0, proc.stderr
    assert ended - exiting < 1.0 + SLACK  # close_timeout, and the interpreter's own teardown
    assert "gave up after 1.0 s" in proc.stderr and "1 series in the unconfirmed batch" in proc.stderr


async def test_async_close_with_redis_stopped_is_bounded_and_says_what_was_lost(
    own_redis_server, namespace, caplog
):
    cfg = StatsConfig(
        url=own_redis_server.url,
        namespace=namespace,
        flush_interval=0.05,
        close_timeout=0.5,
        socket_timeout_ms=WAIT_MS,
    )
    writer = AsyncStatsWriter(cfg, sample_catalog(), engines=[0])
    writer.start()
    tokens = writer.counter("tokens").labels(engine=0)
    tokens.inc()
    assert await writer.flush()
    with _stopped(own_redis_server), caplog.at_level(logging.WARNING, "redis_stats.aio"):
        tokens.inc()
        await asyncio.sleep(0.2)  # the flusher task now waits for a reply
        started = time.monotonic()
        assert not await writer.close()
        elapsed = time.monotonic() - started
    print(f"\n[async close, Redis stopped] close() took {elapsed:.2f} s")
    assert elapsed < 0.5 + SLACK
    (line,) = _lost_lines(caplog)
    assert own_redis_server.url in line and "1 series in the unconfirmed batch" in line, line


# -- close is bounded, always: many rounds of hiccups under load (issue 32) ----------------------

ROUNDS = 40
BUDGET = 0.3  # close_timeout of the rounds below


def _round_config(server, namespace: str) -> StatsConfig:
    # A short socket timeout: within a round's freeze, flushes both wait on Redis and time out.
    return StatsConfig(
        url=server.url, namespace=namespace, flush_interval=0.05, close_timeout=BUDGET, socket_timeout_ms=300
    )


async def _async_round(server, namespace: str, rng: random.Random, *, cancel_lost: bool) -> float | None:
    """Four tasks record, Redis freezes for a random while, then close() (half the rounds right
    after SIGCONT, as in the issue; the others while still frozen). With *cancel_lost* the client's
    connections turn a cancellation into a timeout. The duration of close, None if it did not
    return within BUDGET + SLACK."""
    cfg = _round_config(server, namespace)
    client = make_async_client(cfg)
    if cancel_lost:
        cancel_as_timeout(client)
    writer = AsyncStatsWriter(cfg, sample_catalog(), engines=[0, 1, 2, 3], client=client)
    writer.start()
    done = asyncio.Event()

    async def record(engine: int) -> None:
        tokens, running = (
            writer.counter("tokens").labels(engine=engine),
            writer.gauge("running").labels(engine=engine),
        )
        n = 0
        while not done.is_set():
            n += 1
            tokens.inc()
            running.set(n % 7)
            await asyncio.sleep(0.001)

    recorders = [asyncio.create_task(record(e)) for e in range(4)]
    await asyncio.sleep(0.1)  # flushing
    closing: asyncio.Task[bool] | None = None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(rng.uniform(0.05, 0.5))  # a flush waits on Redis, or has timed out
        if rng.random() < 0.5:
            os.kill(server.pid, signal.SIGCONT)
        started = time.monotonic()
        closing = asyncio.create_task(writer.close())
        await asyncio.wait({closing}, timeout=BUDGET + SLACK)
        return time.monotonic() - started if closing.done() else None
    finally:
        os.kill(server.pid, signal.SIGCONT)
        done.set()
        await asyncio.gather(*recorders)
        await stop_for_good(closing, writer._task)


async def test_async_close_returns_within_its_timeout_in_every_round_of_hiccups_under_load(
    own_redis_server, namespace
):
    # The old close cancelled the flusher once and awaited it without a bound: when the
    # cancellation came out of redis-py as a timeout, the flusher went back to sleep and close
    # never returned (2 of 40 rounds in the issue; every such round here, cancel_lost=True).
    rng = random.Random(32)
    took = [
        await _async_round(own_redis_server, f"{namespace}-{i}", rng, cancel_lost=i % 2 == 1)
        for i in range(ROUNDS)
    ]
    late = [(i, t) for i, t in enumerate(took) if t is None]
    finished = [t for t in took if t is not None]
    print(f"\n[async close x{ROUNDS}] slowest {max(finished, default=0):.2f} s; did not return: {late}")
    assert not late


def _record(writer: StatsWriter, engine: int, done: threading.Event) -> None:
    tokens = writer.counter("tokens").labels(engine=engine)
    while not done.is_set():
        tokens.inc()
        time.sleep(0.001)


def test_close_returns_within_its_timeout_in_every_round_of_hiccups_under_load(own_redis_server, namespace):
    rng = random.Random(32)
    slow = []
    for i in range(ROUNDS):
        cfg = _round_config(own_redis_server, f"{namespace}-{i}")
        writer = StatsWriter(cfg, sample_catalog(), engines=[0, 1, 2, 3])
        done = threading.Event()
        threads = [threading.Thread(target=_record, args=(writer, e, done), daemon=True) for e in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.1)
        with frozen(own_redis_server):
            time.sleep(rng.uniform(0.05, 0.5))  # a flush waits on Redis, or has timed out
            started = time.monotonic()
            writer.close()
            took = time.monotonic() - started
        done.set()
        for t in threads:
            t.join()
        if took > BUDGET + SLACK:
            slow.append((i, took))
    assert not slow
