"""The series of one writer as its callers hold them: one *child* per metric, engine and labels.

What a record call does (the hot path: memory only, never raises), and what a take does with it:

- ``record`` side: a child (:class:`CounterChild`, :class:`GaugeChild`, :class:`HistogramChild`)
  adds to its pending delta under the accumulator's record lock; the first change since the last
  take puts it on the dirty list (:meth:`~redis_stats._core.write.accumulator.Accumulator.enlist`). No
  allocation per update. A value that is not a real number in range is dropped and counted
  (``invalid_value``), never raised.
- Two delta slots per counter and histogram, one per *generation* (``gen & 1``): recorders
  write the slot of the current generation; a take bumps the generation (under the lock) and then
  reads and resets the slot of the generation it swapped out without the lock (``_take``): until
  the next take, which waits for this one, recorders write the other slot. No update is lost or
  doubled. A gauge keeps one ``(stamp, value)`` tuple, read whole by the take.
- Stand-ins with the same methods: :class:`DroppedChild` for a series that may not be stored
  (over cardinality, label too long), and per kind a conflict class (:data:`CONFLICT_CLASS`)
  that a live child switches to when its metric's definition conflicts with the stored one.
"""

from __future__ import annotations

import math
import numbers
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING

from redis_stats import codec
from redis_stats._core.write.chunks import Total
from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM, MetricSpec
from redis_stats.codec import gauge_text

if TYPE_CHECKING:  # the children's owner (accumulator.py imports this module)
    from redis_stats._core.write.accumulator import Accumulator


_INF = math.inf
_monotonic = time.monotonic
_NAN = math.nan
# The largest finite float: an amount beyond it (e.g. the int 10**400) cannot be stored or summed.
_MAX = 1.7976931348623157e308
# The largest int delta added as an int; a larger one is added as a float (exact to 53 bits), so a
# total that large is a float, which readers add up over writers to inf at worst (two int totals
# near 1e308 would overflow the conversion of their sum; tests/store/test_every_view.py).
_INT_DELTA_MAX = 2**63 - 1

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


class CounterChild(Total):
    """One counter series of one engine. ``inc`` is the hot path: memory only, never raises.

    It is its own :class:`Total` in its shard's totals (its place given by its first take)."""

    __slots__ = ("_acc", "_lock", "deltas", "engine", "gen", "stored")

    def __init__(self, acc: Accumulator, engine: int, field_name: str) -> None:
        super().__init__(field_name, COUNTER)
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
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
        # Without the lock: recorders write the other slot until the next take (see the module docstring).
        delta, self.deltas[slot] = self.deltas[slot], 0
        if type(delta) is int and delta > _INT_DELTA_MAX:
            # Beyond 64 bits: added as a float (exact to 53 bits, as a reader reads the total).
            delta = float(delta) if delta <= _MAX else _INF
        if delta == _INF:  # a sum of valid amounts beyond the largest float
            self._acc.drop("invalid_value")
            return
        if delta or not self.stored:
            self.stored = True
            if self.chunk is None:
                self._acc.bind(self)
            self.add_total(delta)


class GaugeChild(Total):
    """One gauge series of one engine, as this writer sees it; the reader rolls writers up."""

    __slots__ = ("_acc", "_lock", "engine", "gen", "state")

    def __init__(self, acc: Accumulator, engine: int, field_name: str) -> None:
        super().__init__(field_name, GAUGE)
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
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
        if self.chunk is None:
            self._acc.bind(self)
        self.set_text(gauge_text(ms, value))


class HistogramChild(Total):
    """One histogram series of one engine: non-cumulative bucket counts and a sum.

    In Redis the whole series is one field, ``<series>|h:<layout>`` -> ``"<sum> <c0> ... <cN>"``,
    so a flush updates it in one step and a read gets it in one value (see docs/key-schema.md).
    """

    __slots__ = ("_acc", "_lock", "bounds", "engine", "gen", "pending")

    def __init__(self, acc: Accumulator, engine: int, spec: MetricSpec, components: tuple[str, ...]) -> None:
        bounds = (*spec.buckets, _INF)
        super().__init__(codec.encode((*components, codec.bucket_tag(bounds))), HISTOGRAM)
        self._acc = acc
        self._lock = acc.lock
        self.engine = engine
        self.bounds = bounds
        # Its total ([sum, per-bucket counts]) made here, with the delta slots, by the host's
        # labels() call: a take then allocates nothing for it, not even the first (issue 32).
        self.total = [0.0, [0] * len(bounds)]
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
        # Without the lock: recorders write the other slot until the next take (see the module docstring).
        if self.chunk is None:
            self._acc.bind(self)
        self.add_pending(self.pending[slot])

    def _empty(self) -> list[float]:
        return [0] * len(self.bounds) + [0.0]


class DroppedChild:
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


CONFLICT_CLASS: dict[type, type] = {
    CounterChild: _ConflictCounter,
    GaugeChild: _ConflictGauge,
    HistogramChild: _ConflictHistogram,
}

Child = CounterChild | GaugeChild | HistogramChild
"""One series of one engine, as :meth:`~redis_stats._core.write.accumulator.Accumulator.child` makes it."""
