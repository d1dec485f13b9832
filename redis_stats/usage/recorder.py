""":class:`UsageRecorder`: a writer's usage, in memory on the hot path, into Redis exactly once
with the writer's flushes.

    recorder = UsageRecorder(writer)            # writer: a StatsWriter (or the asyncio one)
    recorder.record(Usage(tenant="acme", adapter=None, model="llama", prompt_tokens=812,
                          cached_prompt_tokens=512, generation_tokens=96, outcome="stop"))

:meth:`UsageRecorder.record` adds to the writer's pending sums under one lock (no I/O). Each of
the writer's flushes then sends them to ``usage.lua``, one **batch** per shard: a sequence number
per writer and shard, resent as it is until Redis confirms it, applied at most once (the script
skips a number it has applied: a retried or timed-out call never doubles). A process killed loses
what it had recorded since its last confirmed batch: at most one flush interval of its requests,
and the batch in flight (applied or not, never twice) — see docs/usage.md, "What a kill loses".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from operator import add
from typing import Any, Protocol

from redis_stats.keys import Keys
from redis_stats.usage.layout import (
    UsageKeys,
    day_of,
    encode_entity,
    encode_values,
    hour_of,
    tenant_shard,
)
from redis_stats.usage.record import Usage

__all__ = ["Batch", "UsageRecorder"]

log = logging.getLogger("redis_stats.usage")

MAX_CALL_WORDS = 3_999
"""Words of one script call at most (a managed store may cap them; see docs/key-schema.md)."""

MAX_ENTRIES = 256
"""Entries (tenant, adapter, model and hour) one call adds at most: each costs Redis about 13
commands (~10 us on a quiet core), so a call stays a few milliseconds, far inside the client's
timeout even on a loaded machine, and a batch resent after a timeout is a small one."""

PARTS_PER_FLUSH = 64
"""Batches one shard sends in one flush round at most (each once the one before is confirmed):
the rest waits for the next round, so a backlog never holds the flusher for long."""

PRUNE_MS = 7 * 86_400_000
"""A writer's sequence entry is pruned once it has sent nothing for this long (7 days)."""

Entry = tuple[int, str, str, str]  # hour, tenant, adapter, model


class Host(Protocol):
    """What the recorder needs of a writer (:class:`~redis_stats.writer.StatsWriter` or the
    asyncio one): its config, its id, and a place among its flush's parts."""

    @property
    def writer_id(self) -> str:
        """The writer's id (the recorder's id in the ledger's sequence hash)."""

    @property
    def config(self) -> Any:
        """The writer's StatsConfig (namespace, shards, flush interval)."""

    def attach(self, part: Any) -> None:
        """Have each flush round carry *part*'s steps too."""


@dataclass
class Batch:
    """One call of ``usage.lua``: its sequence number, the call, and what it adds, per entry."""

    seq: int
    keys: list[str]
    args: list[str]
    entries: dict[Entry, list[int]]


@dataclass
class _Shard:
    """One shard's side of the protocol: the next number, the batch in flight, the last confirmed."""

    index: int
    keys: UsageKeys
    seq: int = 1
    in_flight: Batch | None = None
    confirmed: int = 0
    confirmed_ms: int = 0
    pending: dict[Entry, list[int]] = field(default_factory=dict)


class UsageRecorder:
    """Usage per tenant, adapter and model, recorded in memory and flushed by *writer* exactly
    once (see the module docstring). *hours* and *days* are how long the hour and day buckets are
    kept in Redis (all-time totals are kept for good); *on_confirmed* is called (in the flusher,
    keep it short) with each batch Redis confirmed and whether it was applied by that call (False:
    an earlier call's, whose answer was lost) — what a bench or a bill reconciles against."""

    def __init__(
        self,
        writer: Host,
        *,
        hours: int = 72,
        days: int = 400,
        clock: Callable[[], float] = time.time,
        on_confirmed: Callable[[Batch, bool], None] | None = None,
    ) -> None:
        for what, value, top in (("hours", hours, 24 * 366), ("days", days, 36_600)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"UsageRecorder {what}={value!r}: must be an int from 1 to {top}")
        self.hours, self.days = hours, days
        self._clock = clock
        self._on_confirmed = on_confirmed
        self._lock = threading.Lock()
        config = writer.config
        self._k = config.shards
        keys = Keys(config.namespace)
        self._shards = [_Shard(s, UsageKeys(keys.shard(s, self._k))) for s in range(self._k)]
        self.writer_id = writer.writer_id
        self.stats: Counter[str] = Counter()
        """What the recorder's flushes came to: ``batches``, ``errors:<kind>``, ``behind``
        (the store had lost this writer's earlier batches), ``lost_requests`` (dropped: see
        status 2 of ``usage.lua``)."""
        writer.attach(self)

    # -- the hot path ---------------------------------------------------------------------------
    def record(self, usage: Usage) -> None:
        """Add *usage* to what the next flush sends (memory only; thread-safe)."""
        names = usage.names()
        values = usage.values()
        entry: Entry = (hour_of(self._clock()), *names)
        shard = self._shards[tenant_shard(names[0], self._k) if self._k > 1 else 0]
        with self._lock:
            sums = shard.pending.get(entry)
            if sums is None:
                shard.pending[entry] = values
            else:
                sums[:] = map(add, sums, values)

    # -- the writer's flush round ---------------------------------------------------------------
    def pending(self) -> bool:
        """Whether anything recorded is not confirmed by Redis yet."""
        return any(s.pending or s.in_flight is not None for s in self._shards)

    def lost_summary(self) -> str:
        """What is not confirmed yet, in words (a close that gives up logs it as lost)."""
        with self._lock:
            batches = [s.in_flight for s in self._shards if s.in_flight is not None]
            sums = [v for s in self._shards for v in s.pending.values()]
        sent = sum(v[0] for b in batches for v in b.entries.values())
        return (
            f"usage of {sent} requests in {len(batches)} unconfirmed batches (applied once or not at all) "
            f"and of {sum(v[0] for v in sums)} more requests recorded since"
        )

    def forked(self, writer_id: str) -> None:
        """In a child after fork(): a new recorder under *writer_id*, nothing pending (the
        parent's sums are the parent's)."""
        self._lock = threading.Lock()
        self.writer_id = writer_id
        self.stats = Counter()
        self._shards = [_Shard(s.index, s.keys) for s in self._shards]

    def flush_steps(self, closing: bool = False) -> Generator[tuple[str, Any], Any, bool]:
        """The recorder's part of a flush round: ``("script", ("usage", KEYS, ARGV))`` per batch;
        True if Redis confirmed every one. A failure keeps the batch for the next round."""
        ok = True
        for shard in self._shards:
            for _ in range(PARTS_PER_FLUSH):
                batch = shard.in_flight or self._take(shard)
                if batch is None:
                    break
                shard.in_flight = batch
                try:
                    reply = yield ("script", ("usage", batch.keys, batch.args))
                except Exception as exc:  # kept; sent again as it is
                    self._failed(exc)
                    ok = False
                    break
                self._answered(shard, batch, reply)
        return ok

    def _take(self, shard: _Shard) -> Batch | None:
        """The next batch of *shard*: as many of its pending sums as one call holds."""
        with self._lock:
            if not shard.pending:
                return None
            entries: dict[Entry, list[int]] = {}
            words = 3 + 7 + 8  # EVALSHA sha numkeys, the fixed keys, the header
            hours: set[int] = set()
            for entry in list(shard.pending):
                cost = 3 + (0 if entry[0] in hours else 4 + 8 + 5)  # a new hour: 4 keys, 4 expiries, a group
                if words + cost > MAX_CALL_WORDS or len(entries) == MAX_ENTRIES:
                    break
                words += cost
                hours.add(entry[0])
                entries[entry] = shard.pending.pop(entry)
        return self._batch(shard, entries)

    def _batch(self, shard: _Shard, entries: dict[Entry, list[int]]) -> Batch:
        uk = shard.keys
        keys = uk.fixed()
        index: dict[str, int] = {}
        expire: list[str] = []

        def key(name: str, until: int) -> str:
            if name not in index:
                keys.append(name)
                index[name] = len(keys)
                expire.extend((str(len(keys)), str(until)))
            return str(index[name])

        groups: dict[int, list[str]] = {}
        for (hour, tenant, adapter, model), values in entries.items():
            words = groups.setdefault(hour, [])
            words += [tenant, encode_entity(tenant, adapter, model), encode_values(values)]
        args: list[str] = []
        for hour, words in groups.items():
            day = day_of(hour)
            hour_end, day_end = (hour + 1 + self.hours) * 3600, (day + 1 + self.days) * 86400
            ids = [key(uk.entity_hour(hour), hour_end), key(uk.tenant_hour(hour), hour_end)]
            ids += [key(uk.entity_day(day), day_end), key(uk.tenant_day(day), day_end)]
            args += [str(len(words) // 3), *ids, *words]
        header = [self.writer_id, str(shard.seq), str(shard.confirmed), str(shard.confirmed_ms)]
        header += [str(PRUNE_MS), str(self.hours), str(self.days), str(len(expire) // 2), *expire]
        return Batch(shard.seq, keys, header + args, entries)

    def _answered(self, shard: _Shard, batch: Batch, reply: Any) -> None:
        status, now = int(reply[0]), int(reply[1])
        shard.in_flight = None
        shard.seq += 1
        if status == 2:
            # The ledger pruned this writer's entry while it was silent: this batch may have been
            # applied before its answer was lost. Never twice: it is dropped, and counted.
            lost = sum(v[0] for v in batch.entries.values())
            self.stats["lost_requests"] += lost
            shard.confirmed, shard.confirmed_ms = 0, 0
            log.warning(
                "usage writer %s was pruned from the ledger while silent; %d requests of its batch "
                "in flight dropped (never counted twice)",
                self.writer_id,
                lost,
            )
            return
        shard.confirmed, shard.confirmed_ms = batch.seq, now
        self.stats["batches"] += 1
        if status == 3:
            self.stats["behind"] += 1
            log.warning(
                "the usage ledger at %s had lost writer %s's earlier batches (Redis restarted empty "
                "or from an older snapshot): their usage is missing there",
                shard.keys.base,
                self.writer_id,
            )
        if self._on_confirmed is not None:
            self._on_confirmed(batch, status != 0)

    def _failed(self, exc: Exception) -> None:
        kind = type(exc).__name__
        self.stats[f"errors:{kind}"] += 1
        (log.warning if self.stats[f"errors:{kind}"] == 1 else log.debug)(
            "usage flush failed (%s: %s); the batch is sent again", kind, exc
        )
