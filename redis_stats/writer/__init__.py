"""StatsWriter: record counters, gauges and histograms per engine; a thread flushes them to Redis.

    writer = StatsWriter(StatsConfig.from_env(), catalog, engines=[0, 1])
    tokens = writer.counter("generation_tokens").labels(engine=0)   # bind once
    tokens.inc(17)                                                   # hot path: memory only
    writer.close()                                                   # last flush

Every flush interval the thread sends one script call with every change since the last one (one
per shard it writes to when the namespace is split into shards, see docs/key-schema.md; the
exactly-once rules are in :mod:`redis_stats._core.write.protocol`). Start-up does not need Redis;
while Redis is down, updates keep landing in memory and nothing raises into the caller.

**Fork.** A writer made before ``os.fork()`` (gunicorn ``--preload``, multiprocessing's fork
start method) carries on in both processes. The parent keeps its id, its pending and in-flight
data. The child becomes a new writer: a new id, no pending data (it never re-sends the
parent's), fresh locks, a new connection pool, and its own flusher thread, started by its first
record (not by the fork itself). Children bound before the fork (``tokens = ...labels(...)``)
keep working in the child and count for the child. See docs/operations.md for the asyncio writer.

The package, one concept a module: :mod:`~redis_stats.writer.blocking` (:class:`StatsWriter`, the
flusher thread and its client), :mod:`~redis_stats.writer.core` (:class:`WriterCore`, the
sans-I/O writer it shares with the asyncio one: its flush round), :mod:`~redis_stats.writer.lane`
(the load entries between two flushes), :mod:`~redis_stats.writer.lane_group` (several writers'
load lanes in one round trip), :mod:`~redis_stats.writer.loadtracker` (which series feed them),
:mod:`~redis_stats.writer.arrivals` (the requests a front end holds, counted where they land:
``in_flight``), :mod:`~redis_stats.writer.outages` (what the log says of its flushes' outages),
:mod:`~redis_stats.writer.handles` (metric handles and the bound series' types),
:mod:`~redis_stats.writer.stats` (the self-metrics), :mod:`~redis_stats.writer.identity` (writer
ids, and the checks of what a writer is given), :mod:`~redis_stats.writer.forking` (the at-fork
hooks) and :mod:`~redis_stats.writer.packing` (how a large command is packed without holding the
GIL).
"""

from redis_stats.errors import ReplicationLag, error_kind  # both importable from here as they always were
from redis_stats.writer.arrivals import Arrival, Arrivals
from redis_stats.writer.blocking import StatsWriter
from redis_stats.writer.core import WriterCore
from redis_stats.writer.handles import CounterSeries, GaugeSeries, HistogramSeries, MetricHandle
from redis_stats.writer.identity import new_writer_id
from redis_stats.writer.lane_group import LaneGroup
from redis_stats.writer.stats import WriterStats

__all__ = [
    "Arrival",
    "Arrivals",
    "CounterSeries",
    "GaugeSeries",
    "HistogramSeries",
    "LaneGroup",
    "MetricHandle",
    "ReplicationLag",
    "StatsWriter",
    "WriterCore",
    "WriterStats",
    "error_kind",
    "new_writer_id",
]
