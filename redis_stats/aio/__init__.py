"""The asyncio twins: writer, reader, lease and reporter on ``redis.asyncio``, with no thread.

They share every rule with the threaded classes through the sans-I/O cores
(:class:`~redis_stats.writer.WriterCore`, :class:`~redis_stats.reader.ReaderCore`,
:class:`~redis_stats.leader.LeaseState`, :class:`~redis_stats.reporting.ReportCore`):
only the waiting differs. Recording stays synchronous and in memory (``child.inc(1)`` in a
coroutine is fine); flushing is a task on the running loop.

    async def main():
        writer = AsyncStatsWriter(config, catalog, engines=[0])
        writer.start()                       # needs a running loop
        writer.counter("tokens").labels(engine=0).inc(5)
        await writer.close()

The modules mirror the sync ones (as ``redis.asyncio`` mirrors ``redis``):
``aio/writer.py``, ``aio/reader.py``, ``aio/leader.py``, ``aio/reporting.py``; this package
re-exports their public names. Forking: see :mod:`redis_stats.aio.writer`.
"""

from __future__ import annotations

from redis_stats.aio.leader import AsyncLeaseLeader
from redis_stats.aio.reader import AsyncStatsReader
from redis_stats.aio.reporting import AsyncStatsReporter
from redis_stats.aio.writer import AsyncStatsWriter

__all__ = ["AsyncLeaseLeader", "AsyncStatsReader", "AsyncStatsReporter", "AsyncStatsWriter"]
