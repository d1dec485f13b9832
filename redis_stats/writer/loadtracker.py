"""The writer's half of the load feed (redis_stats/load.py): which of a writer's series feed which
field, and the entry of each engine it records, made by its flusher (with each flush, and alone by
its load lane between flushes when a router number changed: :meth:`LoadTracker.changed`)."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from redis_stats.catalog import COUNTER, GAUGE, MetricSpec
from redis_stats.load import (
    FIELDS,
    RATE_FIELDS,
    RATE_WINDOW,
    LoadMap,
    LoadSource,
    encode_entry,
)

__all__ = ["LoadTracker"]

_MAX = sys.float_info.max
_RATE_AT = {FIELDS.index(f): j for j, f in enumerate(RATE_FIELDS)}  # field index -> its rate's
_IN_FLIGHT_AT = FIELDS.index("in_flight")
MAX_CONFIRMING = 4096
"""Request ids kept per engine to end their bookings with (the newest): while Redis cannot be
reached they wait for the lane, and a booking outlives its bound only for seconds, so an older id
ends nothing any more."""


class _Counted:
    """A counter series that also adds its increments to a :class:`LoadTracker`'s total (what
    a writer's ``labels()`` returns for a counter that feeds a rate of the load feed)."""

    __slots__ = ("_at", "_child", "_totals", "_tracker")

    def __init__(self, child: Any, totals: list[float], at: int, tracker: LoadTracker) -> None:
        self._child = child
        self._totals = totals
        self._at = at
        self._tracker = tracker

    def inc(self, amount: int | float = 1) -> None:
        """The series' ``inc`` (same rules: an invalid amount is dropped and counted there)."""
        self._child.inc(amount)
        kind = type(amount)
        if (kind is int or kind is float) and 0 <= amount <= _MAX:
            with self._tracker.lock:
                self._totals[self._at] += amount

    def __getattr__(self, name: str) -> Any:
        return getattr(self._child, name)


class LoadTracker:
    """A writer's side of the load feed: which of its series feed which field (by the
    :class:`LoadMap`), and the entry of each engine it records (:meth:`entries`).

    Gauges are read from their series when an entry is made (their last ``set``); counters are
    counted here as they are incremented (:class:`_Counted`), and their recent rate is the
    increase over the last :data:`RATE_WINDOW` seconds (monotonic clock) of this process, from
    the first series bound. :meth:`changed` says which engines' gauge fields differ from their
    last entry (what the writer's load lane sends between flushes). Thread-safe: series are bound
    and counted by the host's threads, entries made by the flusher.
    """

    def __init__(self, load_map: LoadMap, *, window: float = RATE_WINDOW) -> None:
        self.window = window
        self.lock = threading.Lock()  # replaced in a forked child (forked): a thread may hold it
        self._by_metric: dict[str, list[tuple[int, LoadSource]]] = {}
        self._constants: list[float | None] = [None] * len(FIELDS)
        for i, name in enumerate(FIELDS):
            source = getattr(load_map, name, None)  # in_flight: counted here (arrive), no metric
            if source is not None and source.constant is not None:
                self._constants[i] = float(source.constant)
            elif source is not None:
                self._by_metric.setdefault(source.metric, []).append((i, source))
        self._modes: list[str] = ["mostrecent"] * len(FIELDS)
        self._state: dict[int, _EngineState] = {}
        self.counting = False  # whether a front end counts arrivals (in_flight: 0, not null)
        # Request ids arrived and not yet confirmed to the routers (their bookings end), by engine;
        # and those carried by the load lane's entries in flight (confirmed once stored).
        self._arrived: dict[int, list[str]] = {}
        self._carried: dict[int, list[str]] = {}

    def forked(self) -> None:
        """In a forked child: a new lock (the parent's may be held by a thread not copied), and
        no request in flight (the parent's requests are the parent's: it still counts them)."""
        self.lock = threading.Lock()
        for state in self._state.values():
            if state.in_flight is not None:
                state.in_flight = 0
        self._arrived, self._carried = {}, {}

    @property
    def metrics(self) -> set[str]:
        """The metrics that feed a field."""
        return set(self._by_metric)

    def bind(self, spec: MetricSpec, engine: int, values: tuple[str, ...], series: Any) -> Any:
        """*series* (of *spec*, stored *engine*, label *values*), or what stands in for it when
        it feeds the load feed (a counter: one that also counts here)."""
        found = self._by_metric.get(spec.name)
        if not found:
            return series
        with self.lock:
            for i, source in found:
                j = _RATE_AT.get(i)
                if j is not None:
                    if spec.kind == COUNTER and hasattr(series, "deltas"):
                        state = self._engine(engine)
                        state.rated[j] = True
                        return _Counted(series, state.totals, j, self)
                # A dropped series (label too long, cardinality) has no state: it reads as nothing.
                elif spec.kind == GAUGE and hasattr(series, "state"):
                    self._modes[i] = spec.mode
                    self._engine(engine).gauges[i][id(series)] = (series, _factor(source, spec, values))
        return series

    def _engine(self, engine: int) -> _EngineState:
        """*engine*'s state, made on first use (under the lock)."""
        found = self._state.get(engine)
        if found is None:
            found = self._state[engine] = _EngineState(time.monotonic(), self._constants)
            if self.counting:
                found.in_flight = 0
        return found

    def count_arrivals(self, engines: Iterable[int]) -> None:
        """From now on every engine's entry reports ``in_flight`` (0 until a request arrives),
        *engines* (stored indexes) included: a front end counts this writer's requests."""
        with self.lock:
            self.counting = True
            for engine in engines:
                self._engine(engine)
            for state in self._state.values():
                if state.in_flight is None:
                    state.in_flight = 0

    def arrive(self, engine: int, request_id: str | None = None) -> None:
        """A request arrived for *engine*: counted in its ``in_flight`` until :meth:`depart`;
        its *request_id* (where the front end sees one) is confirmed to the routers with the
        entry that counts it (their booking of it ends then)."""
        with self.lock:
            state = self._engine(engine)
            state.in_flight = (state.in_flight or 0) + 1
            if request_id:
                ids = self._arrived.setdefault(engine, [])
                ids.append(request_id)
                if len(ids) > MAX_CONFIRMING:
                    del ids[: len(ids) - MAX_CONFIRMING]

    def depart(self, engine: int) -> None:
        """A request counted by :meth:`arrive` for *engine* ended (finished, aborted, failed)."""
        with self.lock:
            state = self._engine(engine)
            state.in_flight = max(0, (state.in_flight or 0) - 1)

    def in_flight(self, engines: Iterable[int] | None = None) -> int:
        """Requests counted by :meth:`arrive` and not departed, over *engines* (default: all)."""
        with self.lock:
            wanted = self._state if engines is None else [e for e in engines if e in self._state]
            return sum(self._state[e].in_flight or 0 for e in wanted)

    def carried(self) -> dict[int, list[str]]:
        """The request ids the load lane's last entries counted (taken: once stored, their
        bookings may end; :meth:`uncarry` gives them back after a failed call)."""
        with self.lock:
            out, self._carried = self._carried, {}
        return out

    def uncarry(self, ids: dict[int, list[str]]) -> None:
        """Request ids whose entries may not be stored: confirmed with the next ones."""
        with self.lock:
            for engine, taken in ids.items():
                kept = self._arrived.setdefault(engine, [])
                kept[:0] = taken
                if len(kept) > MAX_CONFIRMING:
                    del kept[: len(kept) - MAX_CONFIRMING]

    def engines(self) -> list[int]:
        """The engines (stored indexes) with a series that feeds a field."""
        with self.lock:
            return sorted(self._state)

    def changed(self) -> list[int]:
        """The engines whose gauge fields (requests, KV usage, ...: every field but the rates)
        differ from those of the last entry :meth:`entries` made for them, or that never had one:
        what a load lane sends (rates move with every token; they ride along, and with every
        flush)."""
        with self.lock:
            return [
                e
                for e, state in sorted(self._state.items())
                if e in self._arrived or state.gauge_values()[0] != state.sent
            ]

    def resend(self) -> None:
        """Forget what the last entries held: every engine counts as changed until its next entry
        (after a load call or a flush that failed, whose entries may not be stored)."""
        with self.lock:
            for state in self._state.values():
                state.sent = None

    def entries(
        self,
        engines: Iterable[int] | None = None,
        server_ms: Callable[[int, float], float] | None = None,
        *,
        carry: bool = False,
    ) -> list[str]:
        """``engine, entry, ...`` (``load.lua``'s arguments) for *engines* (default: every
        engine with a series that feeds a field; engines without one are left out). A gauge's
        stamp is monotonic (its ``set``): *server_ms* (engine, stamp) puts it in the engine's
        server clock, as the writer stamps the gauges it flushes (``Accumulator.server_ms``);
        without it, the stamps are this process's monotonic milliseconds. With *carry* (the load
        lane), the request ids arrived so far on these engines are carried by these entries
        (:meth:`carried`): their arrivals are in the values."""
        now = time.monotonic()
        out: list[str] = []
        with self.lock:
            wanted = sorted(self._state) if engines is None else [e for e in engines if e in self._state]
            for engine in wanted:
                state = self._state[engine]
                values, stamp = state.gauge_values()
                if carry and engine in self._arrived:
                    self._carried.setdefault(engine, []).extend(self._arrived.pop(engine))
                state.sent = values
                row = list(values)
                for i, rate in zip(_RATE_AT, state.rates(now, self.window)):
                    row[i] = rate
                ms = server_ms(engine, stamp) if server_ms is not None and stamp else stamp * 1000.0
                out += [str(engine), encode_entry(ms, self._modes, row)]
        return out


def _factor(source: LoadSource, spec: MetricSpec, values: tuple[str, ...]) -> float | None:
    """The product of the *source*'s label values of a series (NaN when one is not a number:
    the series reports nothing); None for a source without labels (the series' value counts)."""
    if not source.labels:
        return None
    factor = 1.0
    for label in source.labels:
        try:
            factor *= float(values[spec.labels.index(label)])
        except (ValueError, IndexError):
            factor = math.nan  # not a number: this series reports nothing
    return factor


class _EngineState:
    """What a :class:`LoadTracker` holds of one engine."""

    __slots__ = ("constants", "gauges", "history", "in_flight", "rated", "sent", "totals")

    def __init__(self, started: float, constants: list[float | None]) -> None:
        # per field (the gauge ones): {id(series): (series, factor or None)}
        self.gauges: list[dict[int, tuple[Any, float | None]]] = [{} for _ in FIELDS]
        self.constants = constants  # per field: the constant source's number, or None
        self.totals = [0.0] * len(RATE_FIELDS)  # running totals of the counters of each rate field
        self.rated = [False] * len(RATE_FIELDS)  # whether a counter feeds it
        self.history: deque[tuple[float, tuple[float, ...]]] = deque([(started, tuple(self.totals))])
        self.sent: tuple[float | None, ...] | None = None  # the gauge values of the last entry
        self.in_flight: int | None = None  # requests its front end holds (None: none counts them)

    def gauge_values(self) -> tuple[tuple[float | None, ...], float]:
        """Each field's gauge value, in FIELDS order (the sum of its series that were set, or its
        constant; None when none was set, and for the rate fields), and the newest stamp of their
        sets (monotonic seconds, 0.0 when none was set)."""
        values: list[float | None] = []
        stamp = 0.0
        for i, bound in enumerate(self.gauges):
            total: float | None = self.constants[i]
            for series, factor in bound.values():
                at, value = series.state  # one tuple: read whole without the record lock
                if not at:
                    continue  # never set
                stamp = max(stamp, at)
                if factor is not None:
                    value = factor if value else 0.0
                total = value if total is None else total + value
            # Not finite: stored as null (encode_entry), and compared as such by changed() (a NaN
            # would differ from itself, and make every poll a change).
            values.append(total if total is None or math.isfinite(total) else None)
        if self.in_flight is not None:
            values[_IN_FLIGHT_AT] = float(self.in_flight)
        return tuple(values), stamp

    def rates(self, now: float, window: float) -> list[float | None]:
        """Each rate field's increase per second over the last *window* seconds (None for a
        field no counter feeds); *now* joins the history."""
        history = self.history
        totals = tuple(self.totals)
        history.append((now, totals))
        # The oldest sample kept is the newest one at least a window old: the rate is
        # over the last window (or since the first series was bound, when younger).
        while len(history) > 2 and history[1][0] <= now - window:
            history.popleft()
        then, before = history[0]
        span = now - then
        return [
            (total - before[j]) / span if span > 0 and self.rated[j] else None
            for j, total in enumerate(totals)
        ]
