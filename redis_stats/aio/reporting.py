"""The asyncio periodic log: :class:`AsyncStatsReporter`, the shared ReportCore ticked by a task."""

from __future__ import annotations

import asyncio
import logging
import time

from redis_stats.aio.reader import AsyncStatsReader
from redis_stats.aio.stopping import stop_task, within
from redis_stats.background import survive
from redis_stats.leader import Leader
from redis_stats.reporting import LogLines, ReportCore

__all__ = ["AsyncStatsReporter"]


class AsyncStatsReporter:
    """The asyncio twin of :class:`~redis_stats.reporting.StatsReporter` (same lines, same rules)."""

    def __init__(
        self,
        reader: AsyncStatsReader,
        leader: Leader,
        *,
        lines: LogLines,
        interval: float = 10.0,
        logger: logging.Logger | None = None,
    ) -> None:
        self.reader = reader
        self.leader = leader
        self.interval = interval
        # The shared sans-I/O core (not the threaded StatsReporter: no thread, Event or Lock
        # here, and its tick() would call this reader's coroutine without awaiting it).
        self._core = ReportCore(reader, leader, lines=lines, interval=interval, logger=logger)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        if hasattr(leader, "on_acquire"):
            # A new lease holder prints at once: schedule a tick on the loop.
            leader.on_acquire = lambda: asyncio.get_running_loop().create_task(self._tick(takeover=True))

    async def tick(self) -> list[str]:
        """Read, and if leader log the interval since the previous read; returns the INFO lines."""
        return await self._tick(takeover=False)

    async def _tick(self, *, takeover: bool) -> list[str]:
        async with self._lock:
            try:
                snap = await self.reader.snapshot()
            except Exception as exc:
                return self._core.read_failed(exc)
            with survive("reporter", self._core.logger):  # the lines of a value nobody foresaw
                return self._core.consume(snap, takeover=takeover)
            return []

    def start(self) -> None:
        """Tick every interval on the running loop."""
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis_stats-reporter")

    async def _run(self) -> None:
        while not self._closing:  # set by close() before it cancels (see aio/stopping.py)
            await asyncio.sleep(self.interval)
            if not self._closing:
                await self.tick()  # never raises (see _tick)

    async def close(self, timeout: float | None = None) -> None:
        """Stop ticking and give up leadership, within *timeout* seconds (default the reader's
        ``close_timeout``) whatever Redis does."""
        deadline = self._core.close_deadline(timeout)
        self._closing = True
        await stop_task(self._task, deadline)
        left = max(0.0, deadline - time.monotonic())
        aclose = getattr(self.leader, "aclose", None)
        if aclose is not None:
            await within(aclose(left), deadline, None)
        else:
            self.leader.close(left)

    aclose = close  # every async class closes with ``await x.aclose()``, as redis.asyncio does
