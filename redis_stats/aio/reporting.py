"""The asyncio periodic log: :class:`AsyncStatsReporter`, the shared ReportCore ticked by a task."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis_stats.aio.reader import AsyncStatsReader
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
            return self._core.consume(snap, takeover=takeover)

    def start(self) -> None:
        """Tick every interval on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis_stats-reporter")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()

    async def close(self) -> None:
        """Stop ticking and give up leadership."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        aclose = getattr(self.leader, "aclose", None)
        if aclose is not None:
            await aclose()
        else:
            self.leader.close()

    aclose = close  # every async class closes with ``await x.aclose()``, as redis.asyncio does
