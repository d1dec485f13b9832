"""The load lane: a writer's load entries between two of its flushes, without I/O.

Routers read the load feed (:mod:`redis_stats.load`): per engine, its requests running and
waiting, KV usage, ... Every flush stores the entries of the writer's engines with its batch
(``flush.lua``); between two flushes the lane stores those of the engines whose router numbers
changed since their last entry (:meth:`~redis_stats.writer.loadtracker.LoadTracker.changed`),
as a plain ``HSET``: unchanged numbers cost nothing, and a change reaches Redis within
:data:`LANE_POLL` seconds, or ``load_interval`` after the lane's last call (at most one call per
``load_interval``: ``StatsConfig.lane_interval``). The flushes still store every entry, so what
Redis lost (a restart, an older RDB) is back within one flush interval.

The blocking writer (:meth:`StatsWriter.flush_load <redis_stats.writer.blocking.StatsWriter>`)
and the asyncio one carry the calls out, each in its flusher's loop (:func:`lane_sleep`); what a
call came to is :meth:`LoadLane.done`'s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from redis_stats._core.write.accumulator import Accumulator
from redis_stats._core.write.protocol import MAX_CALL_WORDS
from redis_stats.config import StatsConfig
from redis_stats.errors import error_kind
from redis_stats.keys import Keys, shard_of
from redis_stats.writer.loadtracker import LoadTracker
from redis_stats.writer.stats import WriterStats

__all__ = ["LANE_POLL", "LoadLane", "lane_sleep"]

LANE_POLL = 0.01
"""Seconds between two looks of the load lane (``load_interval``) at a writer's router numbers:
a change is sent at the next look, or ``load_interval`` after the lane's last call."""

log = logging.getLogger("redis_stats.writer")


def lane_sleep(due: float, lane: float, last_lane: float) -> float:
    """Seconds the flusher sleeps: until the flush *due* (monotonic), and with a load lane
    (*lane* s between two of its calls, the last at *last_lane*) at most :data:`LANE_POLL`,
    or until the lane may call again."""
    now = time.monotonic()
    wait = max(0.0, due - now)
    if lane:
        wait = min(wait, max(LANE_POLL, last_lane + lane - now))
    return wait


class LoadLane:
    """The load entries of one writer (*tracker*: which series feed them, and their values), in
    its flushes (:meth:`entries`) and alone between them (:meth:`calls`, :meth:`done`). *acc*
    holds the writer's shards (their ids of the writer, their server clocks); *keys* and
    *config* name where the entries go."""

    def __init__(self, tracker: LoadTracker, acc: Accumulator, keys: Keys, config: StatsConfig) -> None:
        self.tracker = tracker
        self._acc = acc
        self._keys = keys
        self._config = config

    def entries(self, engines: list[int], closing: bool, *, carry: bool = False) -> list[str]:
        """The load entries (``engine, entry`` pairs) of *engines* (this writer's, in one
        shard), for its flush there (``flush.lua`` stores them with the batch) or alone (the
        load lane). A closing flush's name the engines only: the script deletes their entries.
        *carry*: the lane's (the request ids arrived on them are confirmed once stored)."""
        if not engines:
            return []
        if closing:
            return [x for e in engines for x in (str(e), "")]
        return self.tracker.entries(engines, self._acc.server_ms, carry=carry)

    def calls(self) -> list[tuple[str, list[str]]]:
        """The load lane's calls: ``HSET <load hash> <field> <value> ...`` of the engines whose
        gauge fields changed since their last entry (:meth:`LoadTracker.changed`; none: no call),
        one per shard, or more for a writer of so many engines that one call would exceed
        :data:`MAX_CALL_WORDS` words. Each value is the entry a flush stores, stamped with this
        writer's reading of its server's clock (the flush's stamp is the server's own ``TIME``:
        a plain ``HSET`` costs Redis a third less than a script call, and the lane's calls are
        the many ones)."""
        changed = self.tracker.changed()
        shards = self._config.shards
        per_call = (MAX_CALL_WORDS - 2) // 2  # HSET, the key
        calls = []
        for shard in sorted({shard_of(e, shards) for e in changed}):
            flow = self._acc.flows[shard]
            engines = [e for e in changed if shard_of(e, shards) == shard]
            stamp = f"{flow.server_ms(time.monotonic()):.0f},"
            for i in range(0, len(engines), per_call):
                entries = self.entries(engines[i : i + per_call], False, carry=True)
                args = [
                    x
                    for engine, entry in zip(entries[0::2], entries[1::2])
                    for x in (f"{engine}|{flow.writer_id}", stamp + entry)
                ]
                calls.append((flow.keys(self._keys, shards).load, args))
        return calls

    def confirm_calls(self, stored: bool) -> list[tuple[str, list[str]]]:
        """After the lane's calls: ``HDEL <bookings hash> <request id> ...`` (one per shard) of
        the requests the entries just sent count, once they are all *stored*: a router's booking
        of such a request ends as the engine's own count shows it, never before (so a reader sees
        it booked, then counted; at worst both for a moment, never neither). Not stored: the ids
        go with the next entries."""
        carried = self.tracker.carried()
        if not carried:
            return []
        if not stored:
            self.tracker.uncarry(carried)
            return []
        shards = self._config.shards
        by_key: dict[str, list[str]] = {}
        for engine, ids in sorted(carried.items()):
            key = self._acc.flows[shard_of(engine, shards)].keys(self._keys, shards).bookings
            by_key.setdefault(key, []).extend(ids)
        per_call = MAX_CALL_WORDS - 2
        return [
            (key, ids[i : i + per_call]) for key, ids in by_key.items() for i in range(0, len(ids), per_call)
        ]

    def done(self, result: Any, stats: WriterStats) -> None:
        """What storing the load entries came to (the lane's reply, or the error a flush reported
        for them): a failure is counted in *stats* (``flush_errors_total`` with kind
        ``load_<kind>``) and logged once per kind, and every engine's entry is sent again at the
        lane's next turn (it may not be stored); never raised (the flush is not affected)."""
        if not isinstance(result, Exception):
            return
        self.tracker.resend()
        kind = "load_" + error_kind(result)
        stats.errors[kind] += 1
        log_fn = log.warning if stats.errors[kind] == 1 else log.debug
        log_fn("storing the load entries at %s failed (%s: %s)", self._config.safe_url, kind, result)
