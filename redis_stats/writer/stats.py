"""A writer's self-metrics: :class:`WriterStats`, what it has done so far (flushes, errors,
drops, conflicts, flush durations), stored with its flushes as the ``w:<writer>`` hash that the
``redis_stats_writer_*`` series are read from."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter as _Tally
from dataclasses import dataclass, field

__all__ = ["CLAIMS_PER_STALE", "FLUSH_DURATION_BUCKETS", "STATS_INTERVAL", "WriterStats", "routine_stat"]


# Upper bounds (s) of the flush-duration histogram of every writer's self-metrics.
FLUSH_DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# Seconds between two flushes that store the self-metrics when only the routine ones changed
# (issue 28: one hash less written by four flushes in five at a 1 s flush interval; with the claim
# interval below, 7-9 % less Redis time per flush warm, docs/benchmarks.md). The flush counters
# Prometheus reads are at most this far behind.
STATS_INTERVAL = 5.0

# Claims of a writer's engines renewed this many times per its stale_after (issue 28: at the
# default 30 s, one flush in eight claims at a 1 s interval). Two live owners with stale_after
# Sa >= Sb: A's renewal finds B's claim (at most Sb/4 plus a flush old, within Sa): the conflict is
# found within Sa/4 plus a flush interval.
CLAIMS_PER_STALE = 4

_ROUTINE = frozenset({"flushes", "lane", "dur_sum", "pending"})


def routine_stat(name: str) -> bool:
    """Whether self-metric field *name* changes with every flush (flush counts and durations,
    pending series): those wait for :data:`STATS_INTERVAL`; errors, drops, conflicts and the
    writer's engines, owner and stale_after go with the next flush."""
    return name in _ROUTINE or name.startswith("dur:")


@dataclass
class WriterStats:
    """What a writer has done so far (the source of its self-metrics, stored with every flush)."""

    flushes: int = 0
    # Calls of the load lane (one HSET each, failed ones included): the attempts its errors
    # (``errors["load_<kind>"]``) are a share of. Stored as ``lane``
    # (redis_stats_writer_load_lane_calls_total), with the routine fields.
    lane_calls: int = 0
    duplicates: int = 0
    errors: _Tally[str] = field(default_factory=_Tally)
    # Failed listings of K in shard 0 (shards.lua), by kind: not flush attempts, so kept out of
    # ``errors`` (flush_errors_total); logged, and stored as ``shards_err:<kind>`` with the
    # self-metrics (redis_stats_writer_shards_listing_errors_total), so that a listing that keeps
    # failing (readers that were not given K then miss shards) shows in Prometheus.
    shards_errors: _Tally[str] = field(default_factory=_Tally)
    conflicts: int = 0
    # Keys (or fields) of this writer that a flush found gone although the store should hold them,
    # by kind (seq, catalogue, engine, chunk, names, stats, writers, engines, claims): evicted
    # under maxmemory, or deleted. Stored as ``lost:<kind>`` (redis_stats_writer_keys_lost_total).
    lost: _Tally[str] = field(default_factory=_Tally)
    last_success: float = 0.0
    last_duration: float = 0.0
    duration_counts: list[int] = field(default_factory=lambda: [0] * (len(FLUSH_DURATION_BUCKETS) + 1))
    duration_sum: float = 0.0

    def observe_duration(self, seconds: float) -> None:
        """Count one successful flush's duration."""
        self.last_duration = seconds
        self.duration_sum += seconds
        self.duration_counts[bisect_left(FLUSH_DURATION_BUCKETS, seconds)] += 1

    def field_count(self, drops: dict[str, int]) -> int:
        """How many fields a flush call may carry of them: the 8 fixed ones of :meth:`as_fields`,
        its tallies and duration buckets, the 3 the writer core adds (``stale_ms``, ``flush_ms``,
        ``endpoint``), and room for 8 more drop reasons counted meanwhile."""
        tallies = len(self.errors) + len(self.shards_errors) + len(drops) + len(self.lost)
        return 8 + 3 + tallies + len(self.duration_counts) + 8

    def as_fields(
        self, drops: dict[str, int], pending: int, engines: tuple[int, ...], owner: str
    ) -> list[str]:
        """Field/value pairs for the writer's stats hash (absolute values)."""
        out = [
            "flushes",
            str(self.flushes),
            "lane",
            str(self.lane_calls),
            "duplicates",
            str(self.duplicates),
            "conflicts",
            str(self.conflicts),
            "pending",
            str(pending),
            "dur_sum",
            repr(self.duration_sum),
            "engines",
            ",".join(map(str, engines)),
            "owner",
            owner,
        ]
        for kind, n in self.errors.items():
            out += (f"err:{kind}", str(n))
        for kind, n in self.shards_errors.items():
            out += (f"shards_err:{kind}", str(n))
        for reason, n in drops.items():
            out += (f"drop:{reason}", str(n))
        for kind, n in self.lost.items():
            out += (f"lost:{kind}", str(n))
        for bound, n in zip((*FLUSH_DURATION_BUCKETS, math.inf), self.duration_counts):
            out += (f"dur:{'+Inf' if bound == math.inf else repr(bound)}", str(n))
        return out
