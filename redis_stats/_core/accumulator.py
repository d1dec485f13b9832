"""The sans-I/O half of a writer: in-memory series, batches, and the exactly-once flush protocol.

Nothing here touches the network, so the threaded writer (:mod:`redis_stats.writer`) and the
asyncio writer (:mod:`redis_stats.aio`) share every rule:

- ``record`` side: a *child* (one series of one engine) adds to its pending delta under one lock;
  the first change since the last flush puts it on the dirty list. No allocation per update.
- ``take_batch``: swaps the dirty list out and turns it into one :class:`Batch` (script arguments).
  The record lock is held only for that swap (O(1), whatever the number of pending series):
  each child keeps two delta slots, one per *generation* (``gen & 1``). Recorders write the
  slot of the current generation; the swap bumps the generation, so the slots of the list just
  taken belong to the collector alone, which reads, resets and encodes them without the lock.
  The next swap happens only after that (takes are serialized), so no update is lost or doubled.
- :class:`FlushProtocol`: a batch keeps its sequence number and contents until Redis confirms it
  (applied, or already applied). A lost reply is retried with the same number; the script skips
  numbers it has seen, so nothing is applied twice. New updates wait in the dirty list for the
  next number, so an outage costs memory per series, never per update.
- **Shards** (option ``shards`` = K > 1): engine ``e`` belongs to shard ``e % K``, each shard a
  self-contained namespace with its own sequence numbers. Every shard has its own totals, specs to
  send and in-flight batch, so a shard whose call fails keeps and retries its own batch while the
  others carry on. One take feeds them all: its deltas go into each engine's shard's totals (also
  of a shard whose batch is in flight: totals are absolute, its next batch sends the sum).
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from bisect import bisect_left
from collections import Counter as _Tally
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from redis_stats._core import fields
from redis_stats._core.chunks import Totals
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


class CounterChild:
    """One counter series of one engine. ``inc`` is the hot path: memory only, never raises."""

    __slots__ = ("_acc", "_lock", "deltas", "engine", "field", "gen", "stored")

    def __init__(self, acc: Accumulator, engine: int, field_name: str) -> None:
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
        self.field = field_name
        self.deltas: list[int | float] = [0, 0]  # pending delta per generation slot (gen & 1)
        self.gen = -1  # the generation whose dirty list holds this child (-1: none yet)
        self.stored = False  # a bound series shows as 0 from the start, as in prometheus_client

    def inc(self, amount: int | float = 1) -> None:
        """Add *amount*: a real number, >= 0, at most the largest float (an int beyond that, NaN,
        inf, a negative or a non-number is dropped and counted as ``invalid_value``; never raises).
        """
        kind = type(amount)
        if kind is not int and kind is not float:
            amount = _real(amount)  # Decimal, Fraction, bool, numpy...: a plain int or float, or NaN
        if not 0 <= amount <= _MAX:  # NaN fails too
            self._acc.drop("invalid_value")
            return
        acc = self._acc
        with self._lock:
            gen = acc.gen
            try:
                self.deltas[gen & 1] += amount
            except OverflowError:  # an int delta beyond the float range meets a float amount
                self.deltas[gen & 1] = _INF  # dropped (and counted) when the batch is built
            if self.gen != gen:
                self.gen = gen
                acc.dirty.append(self)
                if acc.wake is not None:
                    acc.wake()

    def _take(self, batch: Batch, slot: int) -> None:
        # Without the lock: recorders write the other slot until the next take (see the module doc).
        delta, self.deltas[slot] = self.deltas[slot], 0
        if type(delta) is int and delta > _I64_MAX:
            # More than HINCRBY holds: sent as a float (exact to 53 bits, as the stored total will be).
            delta = float(delta) if delta <= _MAX else _INF
        if delta == _INF:  # a sum of valid amounts beyond the largest float
            self._acc.drop("invalid_value")
            return
        if delta or not self.stored:
            self.stored = True
            batch.add_delta(self.engine, self.field, delta)


class GaugeChild:
    """One gauge series of one engine, as this writer sees it; the reader rolls writers up."""

    __slots__ = ("_acc", "_lock", "engine", "field", "gen", "state")

    def __init__(self, acc: Accumulator, engine: int, field_name: str) -> None:
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
        self.field = field_name
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
                self.gen = acc.gen
                acc.dirty.append(self)
                if acc.wake is not None:
                    acc.wake()

    def inc(self, amount: float = 1) -> None:
        """Add *amount* to this writer's value (e.g. requests in flight on this API server).

        *amount* must be a finite real number within the float range; anything else is dropped and
        counted as ``invalid_value`` (never raised).
        """
        kind = type(amount)
        if kind is not int and kind is not float:
            amount = _real(amount)
        if not -_MAX <= amount <= _MAX:  # NaN fails too
            self._acc.drop("invalid_value")
            return
        acc = self._acc
        with self._lock:
            # float + an amount within the float range: never raises, never NaN
            self.state = (_monotonic(), self.state[1] + amount)
            if self.gen != acc.gen:
                self.gen = acc.gen
                acc.dirty.append(self)
                if acc.wake is not None:
                    acc.wake()

    def dec(self, amount: float = 1) -> None:
        """Subtract *amount* from this writer's value (the rules of :meth:`inc`)."""
        kind = type(amount)
        if kind is not int and kind is not float:
            amount = _real(amount)  # negating an arbitrary object could raise
        self.inc(-amount)

    def _take(self, batch: Batch, slot: int = 0) -> None:
        stamp, value = self.state  # one read: a racing set() is re-sent by the next batch anyway
        ms = self._acc.server_ms(self.engine, stamp)
        batch.add_gauge(self.engine, self.field, f"{ms:.3f}|{float(value)!r}")


class HistogramChild:
    """One histogram series of one engine: non-cumulative bucket counts and a sum.

    In Redis the whole series is one field, ``<series>|h:<layout>`` -> ``"<sum> <c0> ... <cN>"``,
    so a flush updates it in one step and a read gets it in one value (see docs/key-schema.md).
    """

    __slots__ = ("_acc", "_lock", "bounds", "engine", "field", "gen", "pending")

    def __init__(self, acc: Accumulator, engine: int, spec: MetricSpec, components: tuple[str, ...]) -> None:
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
        self.bounds = (*spec.buckets, _INF)
        self.field = fields.encode((*components, fields.bucket_layout(self.bounds)))
        # Per generation slot (gen & 1), as for counters: the pending bucket counts, then the sum.
        self.pending = [self._empty(), self._empty()]
        self.gen = -1

    def observe(self, value: float) -> None:
        """Count *value* in the first bucket whose bound is >= it, and add it to the sum.

        *value* must be a finite real number within the float range; anything else is dropped and
        counted as ``invalid_value`` (never raised).
        """
        kind = type(value)
        if kind is not int and kind is not float:
            value = _real(value)
        if not -_MAX <= value <= _MAX:  # NaN fails too
            self._acc.drop("invalid_value")
            return
        i = bisect_left(self.bounds, value)
        acc = self._acc
        with self._lock:
            gen = acc.gen
            pending = self.pending[gen & 1]
            pending[i] += 1
            pending[-1] += value
            if self.gen != gen:
                self.gen = gen
                acc.dirty.append(self)
                if acc.wake is not None:
                    acc.wake()

    def _take(self, batch: Batch, slot: int) -> None:
        # Without the lock: recorders write the other slot until the next take (see the module doc).
        pending, self.pending[slot] = self.pending[slot], self._empty()
        batch.add_histogram(self.engine, self.field, pending[-1], pending[:-1])

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

    inc = dec = set = observe = _count


class _ConflictCounter(CounterChild):
    """A counter whose metric conflicts with the stored definition: updates are counted as
    ``catalog_conflict`` drops, nothing is sent. Same layout as its base, so a live child (held by
    the caller) switches by ``__class__`` assignment and the hot path gains no check."""

    __slots__ = ()

    def inc(self, amount: int | float = 1) -> None:
        """Dropped and counted (``catalog_conflict``)."""
        self._acc.drop("catalog_conflict")

    def _take(self, batch: Batch, slot: int) -> None:
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

    def _take(self, batch: Batch, slot: int = 0) -> None:
        self._acc.drop("catalog_conflict")


class _ConflictHistogram(HistogramChild):
    """A histogram whose metric conflicts with the stored definition (see :class:`_ConflictCounter`)."""

    __slots__ = ()

    def observe(self, value: float) -> None:
        """Dropped and counted (``catalog_conflict``)."""
        self._acc.drop("catalog_conflict")

    def _take(self, batch: Batch, slot: int) -> None:
        # The observations recorded before the conflict was known: each one is a drop.
        pending, self.pending[slot] = self.pending[slot], self._empty()
        self._acc.drop("catalog_conflict", max(int(sum(pending[:-1])), 1))


_CONFLICT_CLASS: dict[type, type] = {
    CounterChild: _ConflictCounter,
    GaugeChild: _ConflictGauge,
    HistogramChild: _ConflictHistogram,
}


@dataclass
class _EngineBlock:
    # The deltas of one take, flat: ints/floats (field, delta), gauges (field, "<ms>|<value>"),
    # hists (field, sum delta, per-bucket increases). Added to the writer's totals at the take.
    ints: list[Any] = field(default_factory=list)
    floats: list[Any] = field(default_factory=list)
    gauges: list[Any] = field(default_factory=list)
    hists: list[Any] = field(default_factory=list)


@dataclass
class Batch:
    """One flush: catalogue specs to store, and per engine the chunks of the writer's absolute
    state that changed (see :mod:`redis_stats._core.chunks`).

    Built once, then sent as-is until Redis confirms it; ``seq`` never changes.
    """

    seq: int = 0
    specs: list[MetricSpec] = field(default_factory=list)
    engines: dict[int, _EngineBlock] = field(default_factory=dict)
    closing: bool = False
    chunks: dict[int, list[tuple[int, str | None, str]]] = field(default_factory=dict)
    """engine -> (chunk index, its names or None when Redis holds them, its values)."""
    sent: list[Any] = field(default_factory=list, repr=False)
    """What confirming this batch means (:meth:`redis_stats._core.chunks.Totals.confirm`)."""
    confirmed: int = 0
    """The writer's last batch Redis confirmed applied in this shard when this one was made (0:
    this batch carries the writer's whole state there), and the server time it was applied at:
    how the script tells a store that went back in time (see ``flush.lua``)."""
    confirmed_ms: int = 0

    def _block(self, engine: int) -> _EngineBlock:
        block = self.engines.get(engine)
        if block is None:
            block = self.engines[engine] = _EngineBlock()
        return block

    def add_delta(self, engine: int, field_name: str, delta: int | float) -> None:
        """Add a counter increment (an int stays exact)."""
        block = self._block(engine)
        if type(delta) is int:
            block.ints += (field_name, delta)
        else:
            block.floats += (field_name, float(delta))

    def add_gauge(self, engine: int, field_name: str, stamped_value: str) -> None:
        """Set a gauge to ``<wall ms>|<value>``."""
        self._block(engine).gauges += (field_name, stamped_value)

    def add_histogram(self, engine: int, field_name: str, sum_delta: float, counts: list[float]) -> None:
        """Add observations to a histogram series: the sum's and each bucket's increase."""
        self._block(engine).hists += (field_name, float(sum_delta), counts)

    def series(self) -> int:
        """How many series (counter fields, gauges, histograms) this batch carries."""
        return sum(
            (len(b.ints) + len(b.floats) + len(b.gauges)) // 2 + len(b.hists) // 3
            for b in self.engines.values()
        )

    def fields(self) -> list[tuple[int, str]]:
        """Every (engine, series field) this batch's deltas change."""
        return [
            (engine, name)
            for engine, b in self.engines.items()
            for name in (*b.ints[0::2], *b.floats[0::2], *b.gauges[0::2], *b.hists[0::3])
        ]

    def touch(self, engine: int) -> None:
        """Make sure *engine* is heartbeated by this batch even without data."""
        self._block(engine)

    def absorb_into(self, totals: Totals) -> None:
        """Add this batch's deltas to the writer's *totals* and take the chunks that changed."""
        self.add_to(totals)
        self.take_chunks(totals)

    def take_chunks(self, totals: Totals) -> None:
        """Take the chunks of *totals* that changed since its last take into this batch."""
        self.chunks, self.sent = totals.take(with_names=bool(self.specs))

    def add_to(self, totals: Totals) -> None:
        """Add this batch's deltas to the writer's *totals*."""
        for engine, block in self.engines.items():
            ints, floats, gauges, hists = block.ints, block.floats, block.gauges, block.hists
            totals.absorb(
                engine,
                [*zip(ints[0::2], ints[1::2]), *zip(floats[0::2], floats[1::2])],
                zip(gauges[0::2], gauges[1::2]),
                zip(hists[0::3], hists[1::3], hists[2::3]),
            )

    def block_engines(self) -> list[int]:
        """The engines of this batch's blocks, in the order of its arguments (and keys)."""
        return list(dict.fromkeys([*self.engines, *self.chunks]))

    def script_keys(self, keys: Keys, writer_id: str) -> list[str]:
        """The KEYS of ``flush.lua`` for this batch: every key it may touch (a Redis Cluster
        requires them declared), the engine hashes in the order of :meth:`script_args`' blocks."""
        fixed = [keys.seq, keys.engines, keys.writers, keys.meta, keys.claims, keys.conflicts]
        return [*fixed, keys.writer_stats(writer_id), *[keys.counters(e) for e in self.block_engines()]]

    def script_args(
        self,
        prefix: str,
        writer_id: str,
        *,
        owner: str = "",
        stale_ms: int = 0,
        claims: Iterable[int] = (),
        stats: list[str] | tuple[str, ...] = (),
    ) -> list[str]:
        """The ARGV of ``flush.lua`` for this batch.

        *owner* claims the *claims* engines for conflict detection; *stats* are the writer's
        self-metrics that changed, as ``field, value`` pairs (absolute values: safe to send again).
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
        for engine in self.block_engines():
            pairs: list[str] = []
            for index, names, values in self.chunks.get(engine, ()):
                name = fields.chunk_field(writer_id, index)
                if names is not None:
                    pairs += (name + fields.NAMES_SUFFIX, names)
                pairs += (name, values)
            args += (str(engine), str(len(pairs) // 2), *pairs)
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
        """Parse the script's reply ``{status, now, conflicts, {metric, ...}, refused series}``."""
        status, now, conflicts = (int(x) for x in reply[:3])
        names = tuple(x.decode() if isinstance(x, bytes) else str(x) for x in reply[3])
        return cls(status, now, conflicts, names, int(reply[4]))


_Series = CounterChild | GaugeChild | HistogramChild  # one series of one engine, made by child()


class Accumulator:
    """All series of one writer, by metric, engine and label values; the dirty list; drop tallies."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        max_label_length: int,
        max_series_per_metric: int,
        engine_offset: int = 0,
        shards: int = 1,
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
        self._gauges: list[GaugeChild] = []
        # The absolute totals and chunks, per shard: touched only by takes and their answers
        # (serialized).
        self.shards = shards
        self.shard_totals = [Totals(self.drop) for _ in range(shards)]
        # Shards whose totals changed since their last batch was made (their batch was in flight),
        # and the series changed there meanwhile (engine, field): what a close that gives up
        # loses besides the batches in flight (lost_summary).
        self.owed: set[int] = set()
        self.owed_series: dict[int, set[tuple[int, str]]] = {}
        # The specs each shard has yet to store (every shard holds the catalogue it is written with).
        self._unsent: list[dict[str, MetricSpec]] = [{s.name: s for s in catalog} for _ in range(shards)]
        # Metrics whose definition conflicts with the one stored first in Redis: never sent.
        self.conflicted: set[str] = set()
        # Per shard: its server's clock minus time.monotonic(), in s, from the last answer (None:
        # no answer yet), which turns a gauge's monotonic stamp into that server's time; and the
        # shards whose gauges were sent before that, stamped 0 (sent again once it is known).
        self._clock: list[float | None] = [None] * shards
        self._unstamped: set[int] = set()
        self._restamp = False

    def server_ms(self, engine: int, stamp: float) -> float:
        """The monotonic *stamp* of a value of *engine* in its shard's server time (ms), or 0 when
        that server has not answered yet (the value is sent again, stamped, once it has)."""
        shard = engine % self.shards
        offset = self._clock[shard]
        if offset is None:
            self._unstamped.add(shard)
            return 0.0
        return (stamp + offset) * 1000.0

    def anchor(self, shard: int, server_ms: int) -> None:
        """*shard*'s server answered at *server_ms* (its clock): anchor its gauge stamps to it
        (within the round trip; anchored again at every answer, so a pause or a failover to
        another server's clock is followed at the next flush)."""
        self._clock[shard] = server_ms / 1000.0 - _monotonic()
        if shard in self._unstamped:
            self._unstamped.discard(shard)
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
            for (name, _engine, _values), child in self._children.items():
                if name in self.conflicted and type(child) in _CONFLICT_CLASS:
                    # Callers hold these objects: switch their class, so the hot path stays as is.
                    child.__class__ = _CONFLICT_CLASS[type(child)]
            for name in new:
                for unsent in self._unsent:
                    unsent.pop(name, None)
        if new:
            for totals in self.shard_totals:  # by the collector, which owns the totals
                totals.forget_metrics(set(new))
        if refused_series:
            self.drop("catalog_conflict", refused_series)
        return new

    def requeue_specs(self, specs: Iterable[MetricSpec], shard: int = 0) -> None:
        """Send *specs* again with *shard*'s next batch (the answer about them was lost)."""
        with self.lock:
            for spec in specs:
                if spec.name not in self.conflicted:
                    self._unsent[shard].setdefault(spec.name, spec)

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
            if spec.name in self.conflicted:
                return _DroppedChild(self, "catalog_conflict")
            if any(len(v) > self.max_label_length for v in values):
                return _DroppedChild(self, "label_too_long")
            if self._series_count[(spec.name, engine)] >= self.max_series_per_metric:
                return _DroppedChild(self, "cardinality")
            components = (spec.name, *values)
            made: CounterChild | GaugeChild | HistogramChild
            if spec.kind == COUNTER:
                made = CounterChild(self, engine, fields.encode(components))
            elif spec.kind == GAUGE:
                # The writer is named by the chunk holding the series, not by its field.
                made = GaugeChild(self, engine, fields.encode(components))
                self._gauges.append(made)
            else:
                made = HistogramChild(self, engine, spec, components)
            self._children[key] = made
            self._series_count[(spec.name, engine)] += 1
            if spec.kind != GAUGE:
                # Counters and histograms are exposed (at 0) as soon as they are bound.
                made.gen = self.gen
                self.dirty.append(made)
                if self.wake is not None:
                    self.wake()
            return made

    def add_spec(self, spec: MetricSpec) -> MetricSpec:
        """Add *spec* to the catalogue (after start) and queue it for storing in Redis."""
        spec = self.catalog.add(spec)
        with self.lock:
            for unsent in self._unsent:
                unsent.setdefault(spec.name, spec)
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
        resend = set(resend)
        k = self.shards
        batches = {shard: Batch(seq=seq) for shard, seq in seqs.items()}
        taken = Batch()  # every engine's deltas of this take, whatever its shard
        with self._take_lock:
            with self.lock:  # O(1): whatever the number of pending series, record calls barely wait
                for shard in resend:
                    self._unsent[shard] = {s.name: s for s in self.catalog}
                specs: dict[int, dict[str, MetricSpec]] = {}
                for shard in batches:
                    specs[shard], self._unsent[shard] = self._unsent[shard], {}
                dirty, self.dirty = self.dirty, []
                gen = self.gen
                self.gen = gen + 1
            for shard, batch in batches.items():
                batch.specs = [s for s in specs[shard].values() if s.name not in self.conflicted]
            batch = taken
            slot = gen & 1
            for i, child in enumerate(dirty, 1):
                child._take(batch, slot)
                if not i % _YIELD_EVERY:
                    # Let the host's threads have the GIL: otherwise a record call that wants it
                    # waits out the whole switch interval (5 ms) while this loop runs.
                    time.sleep(0)
            restamp, self._restamp = self._restamp, False
            if resend or restamp:
                # Every gauge with a value, again (a gauge set since the swap is sent now and
                # again with the next batch: harmless, the newer value wins); also once its
                # shard's server time is first known, for the values sent stamped 0. Not those
                # whose metric conflicts with the stored definition: they are never sent.
                seen = {id(c) for c in dirty}
                for g in list(self._gauges):
                    if g.state[0] and id(g) not in seen and type(g) is GaugeChild:
                        g._take(taken)
            for engine in engines:
                engine += self.engine_offset
                if shard_of(engine, k) in batches:
                    taken.touch(engine)
            # Without the record lock: the totals belong to the collector (takes are serialized).
            for shard in resend:
                self.shard_totals[shard].resend_all()
            if k == 1:  # the one shard: the take is its batch (no split, as before sharding)
                only = batches[0]
                only.engines = taken.engines
                only.absorb_into(self.shard_totals[0])
                return batches
            parts: dict[int, Batch] = {}
            for engine, block in taken.engines.items():
                shard = shard_of(engine, k)
                part = parts.get(shard)
                if part is None:
                    part = parts[shard] = batches.get(shard) or Batch()
                part.engines[engine] = block
            for shard, part in parts.items():
                # Also a shard with a batch in flight: its totals keep the changes (dirty chunks)
                # for its next batch.
                part.add_to(self.shard_totals[shard])
                self.owed.add(shard)
                if shard not in batches:
                    self.owed_series.setdefault(shard, set()).update(part.fields())
            for shard, batch in batches.items():
                batch.take_chunks(self.shard_totals[shard])
                self.owed.discard(shard)
                self.owed_series.pop(shard, None)
        return batches

    def pending_series(self) -> int:
        """Series changed since the last batch was taken."""
        return len(self.dirty)

    def forget_pending(self, writer_id: str) -> None:
        """In a forked child: drop every pending change (they are the parent's) and start afresh
        as writer *writer_id*. Bound children stay valid and count for the child from now on.

        Called with no other thread running (the at-fork hook), so no lock is needed; the take
        lock may have been held by the parent's flusher at fork time, so it is replaced.
        """
        self._take_lock = threading.Lock()
        self.dirty = []
        self.drops = _Tally()
        # A new writer stores them again, in every shard.
        self._unsent = [{s.name: s for s in self.catalog} for _ in range(self.shards)]
        for made in self._children.values():
            if isinstance(made, CounterChild):
                made.deltas = [0, 0]
            elif isinstance(made, HistogramChild):
                made.pending = [made._empty(), made._empty()]
            elif isinstance(made, GaugeChild):
                # The parent's value is the parent's (a summed gauge would count it twice).
                made.state = (0.0, 0.0)
            made.gen = -1
        # The totals are the parent's too: this writer's start at zero, under its own id (the
        # series fields do not name the writer; its chunks do).
        for totals in self.shard_totals:
            totals.reset()
        self.owed = set()
        self.owed_series = {}


class _ShardFlow:
    """One shard's part of the protocol: its next sequence number, its unconfirmed batch, and
    the last batch Redis confirmed applied there (number, server time; 0: none under this id, or
    the store lost it: the next batch carries everything)."""

    __slots__ = ("confirmed", "confirmed_ms", "in_flight", "next_seq", "resend_all")

    def __init__(self) -> None:
        self.in_flight: Batch | None = None
        self.next_seq = 1
        self.resend_all = False
        self.confirmed = 0
        self.confirmed_ms = 0


class FlushProtocol:
    """Sequence numbers and the in-flight batch: what to send next, and what an answer means.

    Per shard of the namespace (one for an unsharded one): each has its own numbers and batch,
    confirmed by its own answer (see the module docstring). ``in_flight``, ``next_seq``,
    :meth:`next_batch` and :meth:`confirmed` without a shard are shard 0's.
    """

    def __init__(self, acc: Accumulator) -> None:
        self.acc = acc
        self.flows = [_ShardFlow() for _ in range(acc.shards)]
        # Shards this writer has sent data to: each gets a call every round from then on (its
        # heartbeat there keeps the writer's chunks live for readers and gc).
        self.active: set[int] = set()

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
        flows = self.flows
        wanted = set(always) | self.active
        idle = {s: f.next_seq for s, f in enumerate(flows) if f.in_flight is None}
        if idle and (wanted & idle.keys() or self.acc.dirty):
            made = self.acc.take_shards(idle, engines, resend={s for s in idle if flows[s].resend_all})
            for shard, batch in made.items():
                if shard not in wanted:
                    if not batch.engines and not batch.chunks:
                        # Nothing for this shard: no call, and its specs wait for its first data.
                        self.acc.requeue_specs(batch.specs, shard)
                        continue
                    self.active.add(shard)
                    wanted.add(shard)
                flow = flows[shard]
                flow.in_flight, flow.resend_all = batch, False
                batch.confirmed, batch.confirmed_ms = flow.confirmed, flow.confirmed_ms
                flow.next_seq += 1
        out: dict[int, Batch] = {}
        for shard in sorted(wanted):
            sending = flows[shard].in_flight
            if sending is None:
                continue
            if closing and not self.acc.dirty and shard not in self.acc.owed:
                # Only the heartbeat depends on this flag, never the data: safe on a retried batch.
                sending.closing = True
            out[shard] = sending
        return out

    def confirmed(self, result: FlushResult, shard: int = 0) -> None:
        """Redis answered *shard*'s call: its in-flight batch is applied (now or by an earlier
        attempt), or nothing of it was: gc had removed this writer there, or the store is behind
        what it confirmed before (both: the next batch carries everything)."""
        flow = self.flows[shard]
        batch, flow.in_flight = flow.in_flight, None
        self.acc.anchor(shard, result.server_time_ms)
        if result.writer_removed or result.store_behind:
            if result.writer_removed:
                # What Redis held of this writer was folded into the base fields: keep only the
                # rest, for the new id (the batch's chunks are in the totals, sent with the rest).
                self.acc.shard_totals[shard].rebase()
            # Nothing of the batch was applied: its changes are in the totals, all sent again.
            flow.resend_all = True
            flow.confirmed = flow.confirmed_ms = 0
            return
        if batch is None:
            return
        Totals.confirm(batch.sent)
        flow.confirmed = batch.seq
        if result.applied:
            flow.confirmed_ms = result.server_time_ms
        # else: applied by an earlier attempt, at a time not known: the previous batch's stays
        # (a lower bound of this writer's heartbeat, which is what gc's fold watermark needs).
        if not result.applied and batch.specs:
            # An earlier attempt applied it, but its answer (which would name catalogue conflicts)
            # was lost: send the specs again, so the script can tell us.
            self.acc.requeue_specs(batch.specs, shard)

    def in_flight_series(self) -> int:
        """Series in the batches sent but not confirmed yet (0 if none)."""
        return sum(f.in_flight.series() for f in self.flows if f.in_flight is not None)

    def has_pending(self) -> bool:
        """Whether anything is waiting to be sent (in flight, dirty, or owed to a shard)."""
        return any(f.in_flight is not None for f in self.flows) or bool(self.acc.dirty or self.acc.owed)
