"""The sans-I/O half of a writer: in-memory series, batches, and the exactly-once flush protocol.

Nothing here touches the network, so the threaded writer (:mod:`redis_stats.writer`) and the
asyncio writer (:mod:`redis_stats.aio`) share every rule:

- ``record`` side: a *child* (one series of one engine) adds to its pending delta under one lock;
  the first change since the last flush puts it on the dirty list. No allocation per update.
- ``take_batch``: swaps the dirty list out, adds each child's pending delta into the writer's
  absolute totals (:mod:`redis_stats._core.chunks`) and makes one :class:`Batch` of the chunks
  that changed. The record lock is held only for that swap (O(1), whatever the number of pending
  series): each child keeps two delta slots, one per *generation* (``gen & 1``). Recorders write
  the slot of the current generation; the swap bumps the generation, so the slots of the list
  just taken belong to the collector alone, which reads and resets them without the lock. The
  next swap happens only after that (takes are serialized), so no update is lost or doubled.
  A take allocates no container per series (issue 28): the host's garbage collector is not
  pushed into full collections by the number of series a writer flushes.
- :class:`FlushProtocol`: a batch keeps its sequence number and contents until Redis confirms it
  (applied, or already applied). A lost reply is retried with the same number; the script skips
  numbers it has seen, so nothing is applied twice. New updates wait in the dirty list for the
  next number, so an outage costs memory per series, never per update.
- **Shards** (option ``shards`` = K > 1): engine ``e`` belongs to shard ``e % K``, each shard a
  self-contained namespace with its own sequence numbers. Every shard is one
  :class:`~redis_stats._core.shardflow.ShardFlow` (its totals, specs to send, sequence, in-flight
  batch; K = 1 is a list of one), so a shard whose call fails keeps and retries its own batch while
  the others carry on. One take feeds them all: its deltas go into each engine's shard's totals
  (also of a shard whose batch is in flight: totals are absolute, its next batch sends the sum).
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from bisect import bisect_left
from collections import Counter as _Tally
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis_stats._core import chunks, fields
from redis_stats._core.chunks import Chunk, Series, Totals
from redis_stats._core.shardflow import ShardFlow
from redis_stats.catalog import COUNTER, GAUGE, Catalog, MetricSpec
from redis_stats.keys import SCHEMA_VERSION, Keys, shard_of

__all__ = [
    "Accumulator",
    "Batch",
    "CounterChild",
    "FlushProtocol",
    "FlushResult",
    "GaugeChild",
    "HistogramChild",
]

_INF = math.inf
_monotonic = time.monotonic
_NAN = math.nan
# The largest finite float: an amount beyond it (e.g. the int 10**400) cannot be stored or summed.
_MAX = 1.7976931348623157e308
# What HINCRBY holds (signed 64 bit). A larger integer delta is sent as a float (HINCRBYFLOAT).
_I64_MAX = 2**63 - 1

# A take of many series gives the GIL away every this many series (about 0.5 ms of work).
_YIELD_EVERY = 1024

# Why an update is dropped (counted in ``Accumulator.drops``, never raised into the host):
# invalid_value, label_too_long, cardinality, catalog_conflict (the metric's definition conflicts
# with the one stored in Redis first, see docs/key-schema.md).


def _real(x: object) -> int | float:
    """*x* as a plain int or float, NaN when it is not a real number (the slow path of the
    record calls: only for types other than int and float, e.g. bool, Decimal, Fraction, numpy).

    Strings are refused although ``float()`` would parse them: an amount is a number. Never raises.
    """
    try:
        if isinstance(x, (str, bytes, bytearray)):
            return _NAN
        if isinstance(x, numbers.Integral):
            return int(x)
        return float(x)  # type: ignore[arg-type]
    except Exception:  # OverflowError (Fraction(10**400)), ValueError (Decimal('sNaN')), ...
        return _NAN


def _admitted(acc: Accumulator, x: object, low: float) -> int | float:
    """The slow path of a record call's check (any *x* but a plain int or float within range):
    *x* as a plain int or float if it is a real number from *low* to the largest float, else NaN,
    and the update is dropped and counted as ``invalid_value``."""
    value = _real(x)
    if not low <= value <= _MAX:  # NaN fails too
        acc.drop("invalid_value")
        return _NAN
    return value


class CounterChild:
    """One counter series of one engine. ``inc`` is the hot path: memory only, never raises."""

    __slots__ = ("_acc", "_lock", "deltas", "engine", "field", "gen", "series", "stored")

    def __init__(self, acc: Accumulator, engine: int, field_name: str) -> None:
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
        self.field = field_name
        self.series: Series | None = None  # its total in its shard's totals, bound by the first take
        self.deltas: list[int | float] = [0, 0]  # pending delta per generation slot (gen & 1)
        self.gen = -1  # the generation whose dirty list holds this child (-1: none yet)
        self.stored = False  # a bound series shows as 0 from the start, as in prometheus_client

    def inc(self, amount: int | float = 1) -> None:
        """Add *amount*: a real number, >= 0, at most the largest float (an int beyond that, NaN,
        inf, a negative or a non-number is dropped and counted as ``invalid_value``; never raises).
        """
        kind = type(amount)
        if (kind is not int and kind is not float) or not 0 <= amount <= _MAX:
            amount = _admitted(self._acc, amount, 0)  # Decimal, Fraction, bool, numpy... or NaN
            if amount != amount:
                return
        acc = self._acc
        with self._lock:
            gen = acc.gen
            try:
                self.deltas[gen & 1] += amount
            except OverflowError:  # an int delta beyond the float range meets a float amount
                self.deltas[gen & 1] = _INF  # dropped (and counted) when the batch is built
            if self.gen != gen:
                acc.enlist(self, gen)

    def _take(self, slot: int) -> None:
        # Without the lock: recorders write the other slot until the next take (see the module doc).
        delta, self.deltas[slot] = self.deltas[slot], 0
        if type(delta) is int and delta > _I64_MAX:
            # Beyond 64 bits: added as a float (exact to 53 bits, as a reader reads the total).
            delta = float(delta) if delta <= _MAX else _INF
        if delta == _INF:  # a sum of valid amounts beyond the largest float
            self._acc.drop("invalid_value")
            return
        if delta or not self.stored:
            self.stored = True
            (self.series or self._acc.bind(self, chunks.COUNTER)).add(delta)


class GaugeChild:
    """One gauge series of one engine, as this writer sees it; the reader rolls writers up."""

    __slots__ = ("_acc", "_lock", "engine", "field", "gen", "series", "state")

    def __init__(self, acc: Accumulator, engine: int, field_name: str) -> None:
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
        self.field = field_name
        self.series: Series | None = None
        # (monotonic stamp, value) in one tuple: the collector reads both without the lock, and
        # a tuple is read whole (two attributes could mix two set() calls). The stamp becomes
        # server time when the value is sent (Accumulator.server_ms): no host's wall clock is
        # ever compared with another's.
        self.state: tuple[float, float] = (0.0, 0.0)
        self.gen = -1  # the generation whose dirty list holds this gauge (-1: none yet)

    def set(self, value: float) -> None:
        """Set the value (any number but NaN; +-inf allowed); stamped with the time it was set, in
        the server's clock (the newest value of a ``mostrecent`` gauge wins among writers).

        What ``float()`` refuses (e.g. the int 10**400, ``None``) is dropped and counted as
        ``invalid_value``; never raises.
        """
        try:
            value = float(value)
        except Exception:  # OverflowError, TypeError, ValueError, or whatever a __float__ raises
            value = _NAN
        if value != value:
            self._acc.drop("invalid_value")
            return
        acc = self._acc
        with self._lock:
            self.state = (_monotonic(), value)
            if self.gen != acc.gen:
                acc.enlist(self, acc.gen)

    def inc(self, amount: float = 1) -> None:
        """Add *amount* to this writer's value (e.g. requests in flight on this API server): a
        finite real number within the float range (anything else is dropped and counted as
        ``invalid_value``; never raised)."""
        kind = type(amount)
        if (kind is not int and kind is not float) or not -_MAX <= amount <= _MAX:
            amount = _admitted(self._acc, amount, -_MAX)
            if amount != amount:
                return
        acc = self._acc
        with self._lock:
            # float + an amount within the float range: never raises, never NaN
            self.state = (_monotonic(), self.state[1] + amount)
            if self.gen != acc.gen:
                acc.enlist(self, acc.gen)

    def dec(self, amount: float = 1) -> None:
        """Subtract *amount* from this writer's value (the rules of :meth:`inc`)."""
        kind = type(amount)
        if kind is not int and kind is not float:
            amount = _real(amount)  # negating an arbitrary object could raise
        self.inc(-amount)

    def _take(self, slot: int = 0) -> None:
        stamp, value = self.state  # one read: a racing set() is re-sent by the next batch anyway
        ms = self._acc.server_ms(self.engine, stamp)
        (self.series or self._acc.bind(self, chunks.GAUGE)).set_text(f"{ms:.3f}|{float(value)!r}")


class HistogramChild:
    """One histogram series of one engine: non-cumulative bucket counts and a sum.

    In Redis the whole series is one field, ``<series>|h:<layout>`` -> ``"<sum> <c0> ... <cN>"``,
    so a flush updates it in one step and a read gets it in one value (see docs/key-schema.md).
    """

    __slots__ = ("_acc", "_lock", "bounds", "engine", "field", "gen", "pending", "series")

    def __init__(self, acc: Accumulator, engine: int, spec: MetricSpec, components: tuple[str, ...]) -> None:
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
        self.series: Series | None = None
        self.bounds = (*spec.buckets, _INF)
        self.field = fields.encode((*components, fields.bucket_layout(self.bounds)))
        # Per generation slot (gen & 1), as for counters: the pending bucket counts, then the sum.
        # A take adds a slot into the totals and zeroes it in place: the lists live as long as
        # the series.
        self.pending = [self._empty(), self._empty()]
        self.gen = -1

    def observe(self, value: float) -> None:
        """Count *value* in the first bucket whose bound is >= it, and add it to the sum.

        *value* must be a finite real number within the float range; anything else is dropped and
        counted as ``invalid_value`` (never raised).
        """
        kind = type(value)
        if (kind is not int and kind is not float) or not -_MAX <= value <= _MAX:
            value = _admitted(self._acc, value, -_MAX)
            if value != value:
                return
        i = bisect_left(self.bounds, value)
        acc = self._acc
        with self._lock:
            gen = acc.gen
            pending = self.pending[gen & 1]
            pending[i] += 1
            pending[-1] += value
            if self.gen != gen:
                acc.enlist(self, gen)

    def add(self, counts: Sequence[int], total: float) -> None:
        """Add *counts* (one non-negative int per bucket, ``+Inf`` last) and *total* to the sum at
        once: for a histogram counted elsewhere, whose totals are known but not its observations
        (redis_stats.integrations.bridge). Anything else is dropped and counted as
        ``invalid_value`` (never raised)."""
        if (
            len(counts) != len(self.bounds)
            or not all(type(n) is int and n >= 0 for n in counts)
            or not -_MAX <= total <= _MAX
        ):
            self._acc.drop("invalid_value")
            return
        acc = self._acc
        with self._lock:
            gen = acc.gen
            pending = self.pending[gen & 1]
            for i, n in enumerate(counts):
                pending[i] += n
            pending[-1] += total
            if self.gen != gen:
                acc.enlist(self, gen)

    def _take(self, slot: int) -> None:
        # Without the lock: recorders write the other slot until the next take (see the module doc).
        (self.series or self._acc.bind(self, chunks.HISTOGRAM)).observe(self.pending[slot])

    def _empty(self) -> list[float]:
        return [0] * len(self.bounds) + [0.0]


class _DroppedChild:
    """Stands in for a series that may not be stored (over cardinality, label too long)."""

    __slots__ = ("_acc", "_reason")

    def __init__(self, acc: Accumulator, reason: str) -> None:
        self._acc = acc
        self._reason = reason

    def _count(self, *_args: object) -> None:
        self._acc.drop(self._reason)

    inc = dec = set = observe = add = _count


class _ConflictCounter(CounterChild):
    """A counter whose metric conflicts with the stored definition: updates are counted as
    ``catalog_conflict`` drops, nothing is sent. Same layout as its base, so a live child (held by
    the caller) switches by ``__class__`` assignment and the hot path gains no check."""

    __slots__ = ()

    def inc(self, amount: int | float = 1) -> None:
        """Dropped and counted (``catalog_conflict``)."""
        self._acc.drop("catalog_conflict")

    def _take(self, slot: int) -> None:
        # Changes recorded before the conflict was known: one drop per series (the number of
        # calls behind a counter delta is not kept).
        self.deltas[slot] = 0
        self._acc.drop("catalog_conflict")


class _ConflictGauge(GaugeChild):
    """A gauge whose metric conflicts with the stored definition (see :class:`_ConflictCounter`)."""

    __slots__ = ()

    def set(self, value: float) -> None:
        """Dropped and counted (``catalog_conflict``)."""
        self._acc.drop("catalog_conflict")

    def inc(self, amount: float = 1) -> None:
        """Dropped and counted (``catalog_conflict``)."""
        self._acc.drop("catalog_conflict")

    def dec(self, amount: float = 1) -> None:
        """Dropped and counted (``catalog_conflict``)."""
        self._acc.drop("catalog_conflict")

    def _take(self, slot: int = 0) -> None:
        self._acc.drop("catalog_conflict")


class _ConflictHistogram(HistogramChild):
    """A histogram whose metric conflicts with the stored definition (see :class:`_ConflictCounter`)."""

    __slots__ = ()

    def observe(self, value: float) -> None:
        """Dropped and counted (``catalog_conflict``)."""
        self._acc.drop("catalog_conflict")

    def add(self, counts: Sequence[int], total: float) -> None:
        """Dropped and counted (``catalog_conflict``)."""
        self._acc.drop("catalog_conflict")

    def _take(self, slot: int) -> None:
        # The observations recorded before the conflict was known: each one is a drop.
        pending, self.pending[slot] = self.pending[slot], self._empty()
        self._acc.drop("catalog_conflict", max(int(sum(pending[:-1])), 1))


_CONFLICT_CLASS: dict[type, type] = {
    CounterChild: _ConflictCounter,
    GaugeChild: _ConflictGauge,
    HistogramChild: _ConflictHistogram,
}


@dataclass
class Batch:
    """One flush: catalogue specs to store, and per engine the chunks of the writer's absolute
    state that changed (see :mod:`redis_stats._core.chunks`).

    Built once, then sent as-is until Redis confirms it; ``seq`` never changes. It holds no copy
    of the series: the texts it sends are on its chunks, which no other take touches until this
    batch is answered (a shard takes again only then).
    """

    seq: int = 0
    specs: list[MetricSpec] = field(default_factory=list)
    engines: dict[int, int] = field(default_factory=dict)
    """engine -> how many of its series changed (0: heartbeated only)."""
    closing: bool = False
    chunks: dict[int, list[Chunk]] = field(default_factory=dict)
    """engine -> its chunks that changed, in index order (texts in ``sent_values``/``sent_names``)."""
    confirmed: int = 0
    """The writer's last batch Redis confirmed applied in this shard when this one was made (0:
    this batch carries the writer's whole state there), and the server time it was applied at:
    how the script tells a store that went back in time (see ``flush.lua``)."""
    confirmed_ms: int = 0

    @property
    def sent(self) -> dict[int, list[Chunk]]:
        """What confirming this batch means (:meth:`redis_stats._core.chunks.Totals.confirm`)."""
        return self.chunks

    def series(self) -> int:
        """How many series (counters, gauges, histograms) changed in this batch."""
        return sum(self.engines.values())

    def block_engines(self) -> list[int]:
        """The engines of this batch's blocks, in the order of its arguments (and keys)."""
        return list(dict.fromkeys([*self.engines, *self.chunks]))

    def script_keys(self, keys: Keys, writer_id: str) -> list[str]:
        """The KEYS of ``flush.lua`` for this batch: every key it may touch (a Redis Cluster
        requires them declared), the engine hashes in the order of :meth:`script_args`' blocks."""
        fixed = [keys.seq, keys.engines, keys.writers, keys.meta, keys.claims, keys.conflicts]
        fixed += (keys.writer_stats(writer_id), keys.load)
        return [*fixed, *[keys.counters(e) for e in self.block_engines()]]

    def script_args(
        self,
        prefix: str,
        writer_id: str,
        *,
        owner: str = "",
        stale_ms: int = 0,
        claims: Iterable[int] = (),
        stats: list[str] | tuple[str, ...] = (),
        load: list[str] | tuple[str, ...] = (),
    ) -> list[str]:
        """The ARGV of ``flush.lua`` for this batch.

        *owner* claims the *claims* engines for conflict detection; *stats* are the writer's
        self-metrics that changed, as ``field, value`` pairs, and *load* its load entries, as
        ``engine, entry`` pairs (both absolute values: safe to send again).
        """
        claimed = [str(e) for e in claims]
        args = [
            prefix,
            writer_id,
            str(self.seq),
            "1" if self.closing else "0",
            SCHEMA_VERSION,
            owner,
            str(stale_ms),
            str(self.confirmed),
            str(self.confirmed_ms),
            str(len(claimed)),
            *claimed,
            str(len(stats) // 2),
            *stats,
            str(len(self.specs)),
        ]
        for spec in self.specs:
            args += (spec.name, spec.to_json())
        args.append(str(len(load) // 2))
        args += load
        head = fields.chunk_field(writer_id, 0)[:-1]  # "@|<writer>|": the writer escaped once
        names_suffix = fields.NAMES_SUFFIX
        append = args.append
        for engine in self.block_engines():
            taken = self.chunks.get(engine, ())
            append(str(engine))
            append(str(len(taken) + sum(1 for c in taken if c.send_names)))
            for chunk in taken:
                name = head + str(chunk.index)
                if chunk.send_names:
                    append(name + names_suffix)
                    append(chunk.sent_names)
                append(name)
                append(chunk.sent_values)
        return args


DUPLICATE, APPLIED, REMOVED, BEHIND = 0, 1, 2, 3
"""The statuses of ``flush.lua``'s reply (see :class:`FlushResult`)."""


@dataclass(frozen=True)
class FlushResult:
    """What the flush script answered."""

    status: int
    """APPLIED now; DUPLICATE (an earlier attempt applied it, its reply was lost); REMOVED (gc
    folded this writer: nothing applied, it continues under a new id); BEHIND (the shard lacks
    what this writer saw confirmed — Redis restarted empty or went back in time: nothing applied,
    the writer sends its whole state next)."""
    server_time_ms: int
    conflicts: int = 0
    catalog_conflicts: tuple[str, ...] = ()
    """Metrics whose spec in this batch conflicts with the definition stored first in Redis."""
    refused_series: int = 0
    """Series of this batch not written because their metric's spec conflicts."""
    load_error: str = ""
    """Why the batch's load entries were not stored ('' when they were, or it had none); the
    batch itself was applied."""

    @property
    def applied(self) -> bool:
        """Applied now (False: applied by an earlier attempt, or not at all)."""
        return self.status == APPLIED

    @property
    def writer_removed(self) -> bool:
        """gc removed this writer (and folded what Redis held of it): nothing of this batch was
        applied; the writer continues under a new id with the rest of its totals."""
        return self.status == REMOVED

    @property
    def store_behind(self) -> bool:
        """The shard lacks what this writer saw confirmed: nothing applied; send everything."""
        return self.status == BEHIND

    @classmethod
    def from_reply(cls, reply: list[Any]) -> FlushResult:
        """Parse the script's reply ``{status, now, conflicts, {metric, ...}, refused series[,
        load error]}`` (the last only when the batch was applied)."""
        status, now, conflicts = (int(x) for x in reply[:3])
        names = tuple(x.decode() if isinstance(x, bytes) else str(x) for x in reply[3])
        load_error = reply[5] if len(reply) > 5 else ""
        if isinstance(load_error, bytes):
            load_error = load_error.decode(errors="replace")
        return cls(status, now, conflicts, names, int(reply[4]), str(load_error))


_Series = CounterChild | GaugeChild | HistogramChild  # one series of one engine, made by child()


class Accumulator:
    """All series of one writer, by metric, engine and label values; the dirty list; drop tallies;
    and per shard of the namespace a :class:`~redis_stats._core.shardflow.ShardFlow` (``flows``,
    one for an unsharded namespace) whose totals the takes add to."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        max_label_length: int,
        max_series_per_metric: int,
        engine_offset: int = 0,
        shards: int = 1,
        writer_id: str = "",
    ) -> None:
        self.catalog = catalog
        self.lock = threading.Lock()  # the record lock: the dirty list, the generation, live slots
        self.gen = 0  # bumped by every take, under the lock; children write slot ``gen & 1``
        self.dirty: list[CounterChild | GaugeChild | HistogramChild] = []
        # Serializes takes: a take owns the slots of the generation it swapped out until it is done.
        self._take_lock = threading.Lock()
        # Called (under the lock) by a record that finds the dirty list of a generation empty
        # of it; set only in a forked child, to start its flusher on first use, then cleared.
        self.wake: Callable[[], None] | None = None
        self.drops: _Tally[str] = _Tally()
        self.max_label_length = max_label_length
        self.max_series_per_metric = max_series_per_metric
        self.engine_offset = engine_offset
        self._children: dict[tuple[str, int, tuple[str, ...]], _Series] = {}
        self._series_count: _Tally[tuple[str, int]] = _Tally()
        self._gauges: list[GaugeChild] = []  # taken again when their stamps must be (take_shards)
        # One flow per shard: its totals and chunks are touched only by takes and their answers
        # (serialized), its unsent specs under the record lock.
        self.shards = shards
        self.flows = [ShardFlow(s, Totals(self.drop), catalog, writer_id) for s in range(shards)]
        # Metrics whose definition conflicts with the one stored first in Redis: never sent.
        self.conflicted: set[str] = set()
        # Whether a shard's server answered for the first time since gauges were sent stamped by
        # this host's clock: the next take sends them again, stamped in the server's time.
        self._restamp = False

    @property
    def owed(self) -> set[int]:
        """Shards whose totals changed since their last batch was made (it was in flight): with
        the series changed there meanwhile (:meth:`owed_series`), what a close that gives up
        loses besides the batches in flight."""
        return {f.index for f in self.flows if f.owed}

    def enlist(self, child: _Series, gen: int) -> None:
        """Put *child*, changed for the first time in generation *gen*, on the dirty list (the
        caller holds the record lock)."""
        child.gen = gen
        self.dirty.append(child)
        if self.wake is not None:
            self.wake()

    def server_ms(self, engine: int, stamp: float) -> float:
        """The monotonic *stamp* of a value of *engine* in its shard's server time (ms); before
        that server has answered, in this host's time (the value is sent again once it has)."""
        return self.flows[shard_of(engine, self.shards)].server_ms(stamp)

    def anchor(self, shard: int, server_ms: int) -> None:
        """*shard*'s server answered at *server_ms* (its clock): anchor its gauge stamps to it."""
        if self.flows[shard].anchor(server_ms):
            self._restamp = True

    def drop(self, reason: str, n: int = 1) -> None:
        """Count *n* dropped updates (a dict increment; racing threads may rarely lose one count)."""
        self.drops[reason] += n

    def catalog_conflict(self, names: Iterable[str], refused_series: int = 0) -> list[str]:
        """Redis keeps another definition of the metrics *names*: from now on their updates are
        dropped and counted (``catalog_conflict``), and neither their specs nor their series are
        sent again. *refused_series* were refused by the flush that found the conflict.

        Returns the names not known to conflict before (to warn once each).
        """
        new = [n for n in names if n not in self.conflicted]
        with self.lock:
            self.conflicted.update(new)
            self._switch_conflicted()
            for flow in self.flows:
                for name in new:
                    flow.unsent.pop(name, None)
        if new:
            for flow in self.flows:  # by the collector, which owns the totals
                flow.totals.forget_metrics(set(new))
        if refused_series:
            self.drop("catalog_conflict", refused_series)
        return new

    def _switch_conflicted(self) -> None:
        """Switch the class of every child of a conflicted metric: callers hold these objects,
        so the hot path stays as it is (under the record lock)."""
        for (name, _engine, _values), child in self._children.items():
            if name in self.conflicted and type(child) in _CONFLICT_CLASS:
                child.__class__ = _CONFLICT_CLASS[type(child)]

    def requeue_specs(self, specs: Iterable[MetricSpec], shard: int = 0) -> None:
        """Send *specs* again with *shard*'s next batch (the answer about them was lost)."""
        with self.lock:  # a take swaps the dict out under it
            unsent = self.flows[shard].unsent
            for spec in specs:
                if spec.name not in self.conflicted:
                    unsent.setdefault(spec.name, spec)

    def child(
        self, spec: MetricSpec, engine: int, values: tuple[str, ...], writer_id: str
    ) -> CounterChild | GaugeChild | HistogramChild | _DroppedChild:
        """The child of *spec* for *engine* and label *values*, created on first use.

        Label values longer than ``max_label_length``, and label sets beyond
        ``max_series_per_metric`` per metric and engine, get a child that only counts drops.
        """
        engine += self.engine_offset
        key = (spec.name, engine, values)
        found = self._children.get(key)
        if found is not None:
            return found
        with self.lock:
            found = self._children.get(key)
            if found is not None:
                return found
            refused = self._refusal(spec, engine, values)
            if refused:
                return _DroppedChild(self, refused)
            made = self._children[key] = self._make(spec, engine, values)
            self._series_count[(spec.name, engine)] += 1
            if spec.kind != GAUGE:
                # Counters and histograms are exposed (at 0) as soon as they are bound.
                self.enlist(made, self.gen)
            return made

    def _refusal(self, spec: MetricSpec, engine: int, values: tuple[str, ...]) -> str:
        """Why a new series of *spec* for *engine* and *values* may not be stored ('' if it may)."""
        if spec.name in self.conflicted:
            return "catalog_conflict"
        if any(len(v) > self.max_label_length for v in values):
            return "label_too_long"
        if self._series_count[(spec.name, engine)] >= self.max_series_per_metric:
            return "cardinality"
        return ""

    def _make(self, spec: MetricSpec, engine: int, values: tuple[str, ...]) -> _Series:
        """A new child of *spec*'s kind (under the record lock)."""
        components = (spec.name, *values)
        if spec.kind == COUNTER:
            return CounterChild(self, engine, fields.encode(components))
        if spec.kind == GAUGE:
            # The writer is named by the chunk holding the series, not by its field.
            gauge = GaugeChild(self, engine, fields.encode(components))
            self._gauges.append(gauge)
            return gauge
        return HistogramChild(self, engine, spec, components)

    def add_spec(self, spec: MetricSpec) -> MetricSpec:
        """Add *spec* to the catalogue (after start) and queue it for storing in Redis."""
        spec = self.catalog.add(spec)
        with self.lock:
            for flow in self.flows:
                flow.unsent.setdefault(spec.name, spec)
        return spec

    def take_batch(self, seq: int, engines: Iterable[int] = (), *, resend_all: bool = False) -> Batch:
        """Move every pending change into a new batch numbered *seq* (heartbeating *engines*),
        for a namespace of one shard (see :meth:`take_shards`).

        With *resend_all* (Redis lost its data, or the writer has a new id), every spec and every
        chunk (names too) is sent again.
        """
        return self.take_shards({0: seq}, engines, resend={0} if resend_all else ())[0]

    def take_shards(
        self, seqs: dict[int, int], engines: Iterable[int] = (), *, resend: Iterable[int] = ()
    ) -> dict[int, Batch]:
        """Move every pending change into the totals of its engine's shard, and make a new batch
        for each shard of *seqs* (shard -> its sequence number), heartbeating those of *engines*
        that belong to it. The shards not in *seqs* have a batch in flight: their changes wait in
        their totals for their next batch.

        Each shard of *resend* (Redis lost its data, or the writer has a new id there) gets every
        spec and every chunk (names too) again.
        """
        resending = [self.flows[s] for s in set(resend)]
        batches = {shard: Batch(seq=seq) for shard, seq in seqs.items()}
        with self._take_lock:
            dirty, gen, specs = self._swap(resending, batches)
            # Without the record lock: the totals belong to the collector (takes are serialized).
            for flow in resending:
                flow.totals.resend_all()
            self._take_children(dirty, gen & 1)
            if self._restamp or resending:
                self._restamp = False
                self._take_gauges_again(dirty)
            del dirty
            self._heartbeat(engines, batches)
            for shard, batch in batches.items():
                self._fill(batch, specs[shard], self.flows[shard].totals)
            # A shard with a batch in flight keeps its changes (dirty chunks) for its next batch.
            for flow in self.flows:
                flow.owed = bool(flow.totals.touched)
        return batches

    def _swap(
        self, resending: list[ShardFlow], batches: dict[int, Batch]
    ) -> tuple[list[_Series], int, dict[int, dict[str, MetricSpec]]]:
        """Under the record lock, O(1) whatever the number of pending series (record calls
        barely wait): swap the dirty list and the specs to send out, bump the generation.
        Returns the dirty list, the generation it belongs to, and the specs of each shard."""
        with self.lock:
            for flow in resending:
                flow.unsent = {s.name: s for s in self.catalog}
            specs: dict[int, dict[str, MetricSpec]] = {}
            for shard in batches:
                flow = self.flows[shard]
                specs[shard], flow.unsent = flow.unsent, {}
            dirty, self.dirty = self.dirty, []
            gen = self.gen
            self.gen = gen + 1
        return dirty, gen, specs

    @staticmethod
    def _take_children(dirty: list[_Series], slot: int) -> None:
        """Add the pending deltas of *dirty* (in generation slot *slot*) into their totals."""
        for i, child in enumerate(dirty, 1):
            child._take(slot)
            if not i % _YIELD_EVERY:
                # Let the host's threads have the GIL: otherwise a record call that wants it
                # waits out the whole switch interval (5 ms) while this loop runs.
                time.sleep(0)

    def _take_gauges_again(self, dirty: list[_Series]) -> None:
        """Every gauge with a value, again: for a shard that gets everything again, and once a
        shard's server time is first known, for the values sent stamped by this host's clock (a
        gauge set since the swap is sent now and again with the next batch: harmless, the newer
        value wins). Not those whose metric conflicts with the stored definition: never sent."""
        seen = {id(c) for c in dirty}
        for g in list(self._gauges):
            if g.state[0] and id(g) not in seen and type(g) is GaugeChild:
                g._take()

    def _heartbeat(self, engines: Iterable[int], batches: dict[int, Batch]) -> None:
        """Make sure the batch of each of *engines*' shards heartbeats it, even without data."""
        for engine in engines:
            engine += self.engine_offset
            shard = shard_of(engine, self.shards)
            if shard in batches:
                self.flows[shard].totals.touch(engine)

    def _fill(self, batch: Batch, specs: dict[str, MetricSpec], totals: Totals) -> None:
        """Put into *batch* the *specs* not known to conflict, and what changed in *totals*."""
        batch.specs = [s for s in specs.values() if s.name not in self.conflicted]
        batch.engines, batch.chunks = totals.take(with_names=bool(batch.specs))

    def bind(self, child: _Series, kind: str) -> Series:
        """The series in the totals of *child*'s shard that its takes add to (made on first use).

        Called by the collector only (the first take of the child): the totals are its own.
        """
        totals = self.flows[shard_of(child.engine, self.shards)].totals
        child.series = made = totals.series(child.engine, child.field, kind)
        return made

    def owed_series(self) -> int:
        """Series changed for shards whose batch was in flight, not in a batch yet."""
        return sum(sum(f.totals.touched.values()) for f in self.flows if f.owed)

    def pending_series(self) -> int:
        """Series changed since the last batch was taken."""
        return len(self.dirty)

    def forget_pending(self, writer_id: str) -> None:
        """In a forked child: drop every pending change (they are the parent's) and start afresh
        as writer *writer_id*, in every shard. Bound children stay valid and count for the child
        from now on.

        Called with no other thread running (the at-fork hook), so no lock is needed; the take
        lock may have been held by the parent's flusher at fork time, so it is replaced.
        """
        self._take_lock = threading.Lock()
        self.dirty = []
        self.drops = _Tally()
        for made in self._children.values():
            made.series = None  # in the totals reset below
            if isinstance(made, CounterChild):
                made.deltas = [0, 0]
            elif isinstance(made, HistogramChild):
                made.pending = [made._empty(), made._empty()]
            elif isinstance(made, GaugeChild):
                # The parent's value is the parent's (a summed gauge would count it twice).
                made.state = (0.0, 0.0)
            made.gen = -1
        # The totals, sequence and batches are the parent's too: this writer's start at zero,
        # under its own id, which stores the catalogue again (the series fields do not name the
        # writer; its chunks do).
        for flow in self.flows:
            flow.restart(self.catalog)
            flow.writer_id = writer_id


class FlushProtocol:
    """Sequence numbers and the in-flight batch: what to send next, and what an answer means.

    Per shard of the namespace (one for an unsharded one), on the accumulator's flows: each has
    its own numbers and batch, confirmed by its own answer (see the module docstring).
    ``in_flight``, ``next_seq``, :meth:`next_batch` and :meth:`confirmed` without a shard are
    shard 0's.
    """

    def __init__(self, acc: Accumulator) -> None:
        self.acc = acc
        self.flows = acc.flows

    @property
    def in_flight(self) -> Batch | None:
        """Shard 0's unconfirmed batch."""
        return self.flows[0].in_flight

    @in_flight.setter
    def in_flight(self, batch: Batch | None) -> None:
        self.flows[0].in_flight = batch

    @property
    def next_seq(self) -> int:
        """Shard 0's next sequence number."""
        return self.flows[0].next_seq

    def next_batch(self, engines: Iterable[int] = (), *, closing: bool = False) -> Batch:
        """The batch to send now: the unconfirmed one again, else a new one with the next number
        (of shard 0: the whole namespace unless it is sharded)."""
        return self.next_batches(engines, closing=closing, always=(0,))[0]

    def next_batches(
        self, engines: Iterable[int] = (), *, closing: bool = False, always: Iterable[int] = (0,)
    ) -> dict[int, Batch]:
        """Shard -> the batch to send it now: its unconfirmed one again, else a new one with its
        next number. The shards of *always* get one every time (heartbeats, self-metrics), the
        others once they have data (and from then on)."""
        wanted = set(always) | {f.index for f in self.flows if f.active}
        idle = [f for f in self.flows if f.in_flight is None]
        if idle and (wanted.intersection(f.index for f in idle) or self.acc.dirty):
            self._take(idle, engines, wanted)
        return self._sending(sorted(wanted), closing)

    def _take(self, idle: list[ShardFlow], engines: Iterable[int], wanted: set[int]) -> None:
        """Take a new batch for each *idle* shard (none in flight) and send those of *wanted*,
        and those that got their first data (added to *wanted*)."""
        seqs = {f.index: f.next_seq for f in idle}
        resend = [f.index for f in idle if f.resend_all]
        for shard, batch in self.acc.take_shards(seqs, engines, resend=resend).items():
            if shard in wanted or self._first_data(shard, batch):
                self.flows[shard].send(batch)
                wanted.add(shard)

    def _first_data(self, shard: int, batch: Batch) -> bool:
        """Whether *batch* is the first with data for a shard not written to yet (which then gets
        a call every round); if not, no call, and its specs wait for its first data."""
        if not batch.engines and not batch.chunks:
            self.acc.requeue_specs(batch.specs, shard)
            return False
        self.flows[shard].active = True
        return True

    def _sending(self, shards: list[int], closing: bool) -> dict[int, Batch]:
        """Shard -> its batch in flight, for each of *shards* that has one; with *closing*, the
        batches that leave nothing behind say the writer closes."""
        out: dict[int, Batch] = {}
        for shard in shards:
            flow = self.flows[shard]
            sending = flow.in_flight
            if sending is None:
                continue
            if closing and not self.acc.dirty and not flow.owed:
                # Only the heartbeat depends on this flag, never the data: safe on a retried batch.
                sending.closing = True
            out[shard] = sending
        return out

    def confirmed(self, result: FlushResult, shard: int = 0) -> None:
        """Redis answered *shard*'s call: its in-flight batch is applied (now or by an earlier
        attempt), or nothing of it was: gc had removed this writer there, or the store is behind
        what it confirmed before (both: the next batch carries everything)."""
        self.acc.anchor(shard, result.server_time_ms)
        batch = self.flows[shard].answered(result)
        if batch is not None and not result.applied and batch.specs:
            # An earlier attempt applied it, but its answer (which would name catalogue conflicts)
            # was lost: send the specs again, so the script can tell us.
            self.acc.requeue_specs(batch.specs, shard)

    def in_flight_series(self) -> int:
        """Series in the batches sent but not confirmed yet (0 if none)."""
        return sum(f.in_flight.series() for f in self.flows if f.in_flight is not None)

    def has_pending(self) -> bool:
        """Whether anything is waiting to be sent (in flight, dirty, or owed to a shard)."""
        # A shard owed the writer's whole state (gc removed it, or the store went back in time)
        # is pending too: a closing writer must store it before it stops.
        return any(f.pending() or f.owed for f in self.flows) or bool(self.acc.dirty)
