"""No background thread or task dies (issue 32): an exception nobody foresaw in the writer's
flusher (threaded and asyncio), the lease keeper, the reporter, the exporter's gc and window
loops is counted (``redis_stats_background_errors_total{thread,kind}``), logged once, and the
loop goes on with its next round. (The ``/load`` refresher: tests/prometheus/test_load_feed.py.)"""

from __future__ import annotations

import asyncio
import http.client
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats._core.lease import LeaseState
from redis_stats.aio import AsyncLeaseLeader, AsyncStatsReader, AsyncStatsReporter, AsyncStatsWriter
from redis_stats.background import background_errors
from redis_stats.connection import make_async_client, make_client
from redis_stats.keys import Keys
from redis_stats.leader import LeaseLeader
from redis_stats.reporting import StatsReporter
from redis_stats.server import Exporter
from tests.conftest import sample_catalog
from tests.prometheus import views

pytestmark = pytest.mark.redis_server


@pytest.fixture
def cfg(redis_server, namespace) -> StatsConfig:
    return StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.02)


def _count(thread: str, kind: str) -> int:
    return background_errors().get((thread, kind), 0)


def _until(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


class Failing:
    """Wraps *real*: the first *times* calls raise *exc* (a class nobody handles), then it is real."""

    def __init__(self, real: Callable[..., Any], exc: type[Exception], times: int = 3) -> None:
        self.real, self.exc, self.left, self.calls = real, exc, times, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise self.exc("injected")
        return self.real(*args, **kwargs)


def _tokens(cfg: StatsConfig) -> float:
    snap = StatsReader(cfg, sample_catalog()).snapshot()
    engine = snap.engines.get(0)
    return engine.counters.get(("tokens", ()), 0.0) if engine is not None else 0.0


def test_the_flusher_thread_survives_an_exception_and_goes_on(cfg, caplog):
    before = _count("flusher", "ZeroDivisionError")
    writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    writer.prepare_flushes = Failing(writer.prepare_flushes, ZeroDivisionError)  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG, "redis_stats.writer"):
        writer.start()
        writer.counter("tokens").labels(engine=0).inc(5)
        # the old thread died at the first one: nothing recorded after reached Redis
        assert _until(lambda: _tokens(cfg) == 5), "the flusher stopped"
    assert writer._thread is not None and writer._thread.is_alive()
    assert _count("flusher", "ZeroDivisionError") == before + 3
    logged = [r for r in caplog.records if "background flusher: ZeroDivisionError" in r.getMessage()]
    assert logged[0].levelno == logging.ERROR and logged[0].exc_info  # once, with its traceback
    assert all(r.levelno == logging.DEBUG for r in logged[1:])
    assert writer.close()


async def test_the_asyncio_flusher_task_survives_an_exception_and_goes_on(cfg):
    before = _count("flusher", "LookupError")
    writer = AsyncStatsWriter(cfg, sample_catalog(), engines=[0])
    writer.prepare_flushes = Failing(writer.prepare_flushes, LookupError)  # type: ignore[method-assign]
    writer.start()
    writer.counter("tokens").labels(engine=0).inc(5)
    deadline = time.monotonic() + 5
    while _tokens(cfg) != 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert _tokens(cfg) == 5, "the flusher task stopped"
    assert writer._task is not None and not writer._task.done()
    assert _count("flusher", "LookupError") == before + 3
    assert await writer.close()


def _failing_renewals(monkeypatch: pytest.MonkeyPatch, exc: type[Exception], times: int) -> None:
    """The lease's first *times* renewals (every keeper's) raise *exc*."""
    real, left = LeaseState.renewal, [times]

    def renewal(self: LeaseState) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise exc("injected")
        return real(self)

    monkeypatch.setattr(LeaseState, "renewal", renewal)


def test_the_lease_keeper_survives_an_exception_and_goes_on(cfg, monkeypatch):
    before = _count("lease", "KeyError")
    _failing_renewals(monkeypatch, KeyError, 2)
    leader = LeaseLeader(make_client(cfg), Keys(cfg.namespace), "keeper", ttl=0.6)
    assert _until(leader.is_leader), "the lease keeper stopped"
    assert leader._thread is not None and leader._thread.is_alive()
    assert _count("lease", "KeyError") == before + 2
    leader.close()


async def test_the_asyncio_lease_task_survives_an_exception_and_goes_on(cfg, monkeypatch):
    before = _count("lease", "IndexError")
    _failing_renewals(monkeypatch, IndexError, 2)
    leader = AsyncLeaseLeader(make_async_client(cfg), Keys(cfg.namespace), "keeper", ttl=0.6)
    leader.start()
    deadline = time.monotonic() + 5
    while not leader.is_leader() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert leader.is_leader(), "the lease task stopped"
    assert _count("lease", "IndexError") == before + 2
    await leader.aclose()


class Lines:
    """Log lines that fail (OverflowError: a rate of two huge values) the first two intervals."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, previous: Any, current: Any) -> list[tuple[int, str, list[Any]]]:
        self.calls += 1
        if self.calls <= 2:
            raise OverflowError("(34, 'Numerical result out of range')")
        return [(logging.INFO, "interval %d", [self.calls])]


def test_the_reporter_thread_survives_an_exception_and_goes_on(cfg, caplog):
    from redis_stats.leader import Rank0Leader

    before = _count("reporter", "OverflowError")
    lines = Lines()
    reporter = StatsReporter(StatsReader(cfg, sample_catalog()), Rank0Leader([0]), lines=lines, interval=0.05)
    with caplog.at_level(logging.INFO, "redis_stats.reporter"):
        reporter.start()
        assert _until(lambda: lines.calls >= 4), "the reporter stopped"
    assert any(r.getMessage() == "interval 3" for r in caplog.records)
    assert _count("reporter", "OverflowError") == before + 2
    reporter.close()


async def test_the_asyncio_reporter_task_survives_an_exception_and_goes_on(cfg):
    from redis_stats.leader import Rank0Leader

    before = _count("reporter", "OverflowError")
    lines = Lines()
    reader = AsyncStatsReader(cfg, sample_catalog())
    reporter = AsyncStatsReporter(reader, Rank0Leader([0]), lines=lines, interval=0.05)
    reporter.start()
    deadline = time.monotonic() + 5
    while lines.calls < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert lines.calls >= 4, "the reporter task stopped"
    assert _count("reporter", "OverflowError") == before + 2
    await reporter.close()
    await reader.aclose()


def _metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def test_the_exporters_gc_and_window_loops_survive_and_every_error_is_served(cfg, monkeypatch):
    import redis_stats.ops.retention as retention

    gc_runs = Failing(retention.collect_garbage, TypeError, times=2)
    monkeypatch.setattr(retention, "collect_garbage", gc_runs)
    reader = StatsReader(cfg, sample_catalog())
    exporter = Exporter(reader, port=0, gc_interval=0.05, window=0.3, self_metrics=True).start()
    try:
        assert _until(lambda: gc_runs.calls >= 4), "the gc loop stopped"
        samples = Failing(reader.snapshot, AttributeError, times=2)
        reader.snapshot = samples  # type: ignore[method-assign]
        views.window(exporter).asked()  # a sample every window / 6 = 0.05 s
        assert _until(lambda: samples.calls >= 4), "the window loop stopped"
        text = _metrics(exporter.port)
    finally:
        exporter.close()
    for thread, kind in (("gc", "TypeError"), ("window", "AttributeError")):
        n = background_errors()[(thread, kind)]
        assert f'redis_stats_background_errors_total{{kind="{kind}",thread="{thread}"}} {float(n)}' in text
    assert "# TYPE redis_stats_background_errors_total counter" in text
