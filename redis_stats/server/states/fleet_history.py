"""The fleet's recent history: a few figures per sample, for the fleet and for each engine, for as
long as the live page's charts span.

The live page charts the fleet over the last minutes (throughput, KV cache, waiting queue, TTFT and
ITL p99) and the engines that need attention (each one's queue, KV cache, TTFT p99). A page
computes each point from a ``/snapshot`` it polled, so on first open, and after every reload, its
charts were empty although the exporter had been reading the fleet all along (its ``/snapshot``
window). A :class:`FleetHistory` keeps, per namespace, the figures of those charts for every
snapshot the window takes (its sampler's and each ``/snapshot`` request's; never a read of its
own), at most one every *spacing* seconds over :data:`HISTORY_SECONDS`, at most
:data:`MAX_POINTS` points:

- the fleet's figures: a few floats a point, whatever the fleet's size;
- each up engine's figures (those whose "over engines" kind is :data:`PER_ENGINE`): 4 bytes a
  figure and engine (a float32: a chart's precision), and the engines' indexes (8 bytes each,
  shared with the point before when the same engines are up). At 1,024 engines and the page's
  three, 12 KB a point, 3.7 MB for 10 minutes. All of it within *max_bytes* (the
  ``history_budget``): past it the oldest points go, and the span kept is what fits.

Which figures is a :data:`~redis_stats.server.options.HistorySpec` the integration injects (the
vLLM one names the page's charts), so this module knows no product's metric names. Each figure is
computed by the rules the page applies to a ``/snapshot`` document, over the engines up in the
newest snapshot, so that a point kept here and the one a page computes from the same read are the
same numbers.
"""

from __future__ import annotations

import bisect
import math
import threading
from array import array
from collections import deque
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

from redis_stats.server.options import HISTORY_BUDGET, PER_ENGINE, HistorySpec
from redis_stats.server.states.window import increase, since
from redis_stats.snapshot import EngineSnapshot, Snapshot, json_number

__all__ = [
    "HISTORY_SECONDS",
    "MAX_POINTS",
    "FleetHistory",
    "fleet_point",
]

WINDOWED = ("rate", "p99")  # engine kinds that need a window: None without one

HISTORY_SECONDS = 600.0
"""How far back the history reaches: the page's charts span the last 10 minutes."""

MAX_POINTS = 300
"""Points over :data:`HISTORY_SECONDS` at most (one every 2 s, the page's own poll rate; the
first and last included, 301): a short ``--window`` samples more often, and must not make the
history grow with it."""

# A point is a tuple, arrays of doubles (its time and each fleet figure, NaN for none), the up
# engines' indexes and their figures as float32, and a deque slot; measured with tracemalloc
# (tests/server/test_fleet_history.py keeps it honest).
POINT_BYTES = 160  # the tuple, its time and size, a deque slot
FIGURE_BYTES = 8
ARRAY_BYTES = 80  # an array object, empty
ENGINE_ID_BYTES = 8
ENGINE_FIGURE_BYTES = 4

Key = tuple[str, str]  # (metric, per-engine kind)
MAX_ENGINE_ID = 2**63 - 1  # what an engine's index takes in the arrays


class _Point(NamedTuple):
    time: float
    fleet: array[float]  # the fleet figures (NaN: none)
    ids: array[int]  # the up engines, ascending (shared with the point before when the same)
    values: array[float]  # float32, len(ids) x per-engine figures, engine by engine (NaN: none)
    size: int  # its estimated bytes (the ids counted only where not shared)


def engine_columns(
    now: Snapshot, earlier: Snapshot | None, keys: Collection[Key]
) -> tuple[list[int], dict[Key, list[float | None]]]:
    """The up engines of *now*, ascending, and for each (metric, per-engine kind) of *keys* their
    values in that order (None: none; rates and p99 over the window from *earlier*, None without)."""
    seconds = now.time - earlier.time if earlier is not None else None
    up = [e for _, e in sorted(now.engines.items()) if e.up]
    columns: dict[Key, list[float | None]] = {}
    for metric, kind in keys:
        if (metric, kind) in columns:
            continue
        if kind in WINDOWED and not seconds:
            columns[metric, kind] = [None] * len(up)
        else:
            columns[metric, kind] = [_engine_value(e, earlier, metric, kind, seconds or 0.0) for e in up]
    return [e.engine for e in up], columns


def fleet_point(now: Snapshot, earlier: Snapshot | None, spec: HistorySpec) -> list[float | None]:
    """The fleet figures of *spec* for *now* (those not :data:`PER_ENGINE`), rates and p99 over the
    window from *earlier* (None: no window, those figures are None), in *spec*'s order."""
    fleet = {n: f for n, f in spec.items() if f[2] != PER_ENGINE}
    _ids, columns = engine_columns(now, earlier, [(m, k) for m, k, _ in fleet.values()])
    return [_over_engines(columns[m, k], how) for m, k, how in fleet.values()]


def _engine_value(
    e: EngineSnapshot, earlier: Snapshot | None, metric: str, kind: str, seconds: float
) -> float | None:
    """One engine's value of *metric* (None: none), its series in the document's order."""
    if kind not in WINDOWED:
        return _fold([v for _k, v in _series(e.gauges, metric)], kind)
    # As /snapshot's window: an engine its first read lacks is not measured (new, or back after
    # Redis lost its keys: its whole totals are not its increase).
    before = earlier.engines.get(e.engine) if earlier is not None else None
    if before is None:
        return None
    if kind == "p99":
        olds = before.histograms
        return _fold([since(h, olds.get(k)).quantile(0.99) for k, h in _series(e.histograms, metric)], "max")
    old = before.counters
    rate = _fold([increase(v, old.get(k, 0.0)) / seconds for k, v in _series(e.counters, metric)], "sum")
    return 0.0 if rate is None else rate  # measured, without a series of it: the page's 0


def _series(mapping: Mapping[tuple[str, tuple[str, ...]], Any], metric: str) -> list[tuple[Any, Any]]:
    return sorted((k, v) for k, v in mapping.items() if k[0] == metric)


def _fold(values: list[float], how: str) -> float | None:
    """Sum or max of *values*, NaN skipped (the document writes it ``null``); None if none is left.
    Added one by one in order, as the page adds them, so the two give the same float."""
    total: float | None = None
    for v in values:
        if math.isnan(v):
            continue
        total = v if total is None else total + v if how == "sum" else max(total, v)
    return total


def _over_engines(values: list[float | None], how: str) -> float | None:
    if how == "sum":  # a missing value as 0 (infinities too: the page adds them); none: None
        known = [v for v in values if v is not None]
        return _add(known) if known else None
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return _OVER_FINITE[how](finite) if finite else None


_OVER_FINITE: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda finite: _add(finite) / len(finite),
    "max": max,
    "median": lambda finite: sorted(finite)[(len(finite) - 1) // 2],  # the lower one, as the page's
}


def _add(values: list[float]) -> float:
    # One by one from 0 in order, as the page's reduce adds them (not fsum: the same float as it).
    total = 0.0
    for v in values:
        total += v
    return total


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


class FleetHistory:
    """The figures of *spec* at every snapshot :meth:`add` is given, at most one every *spacing*
    seconds (and every ``HISTORY_SECONDS / MAX_POINTS``), over the last :data:`HISTORY_SECONDS`
    (server clock), in at most *max_bytes* (estimated; past it the oldest points go); thread
    safe. An empty *spec* keeps nothing."""

    def __init__(
        self,
        spec: HistorySpec,
        *,
        spacing: float,
        seconds: float = HISTORY_SECONDS,
        max_bytes: int = HISTORY_BUDGET,
    ) -> None:
        self.spec = dict(spec)
        self.fleet_figures = [n for n, f in self.spec.items() if f[2] != PER_ENGINE]
        self.engine_figures = [n for n, f in self.spec.items() if f[2] == PER_ENGINE]
        self.seconds = seconds
        self.spacing = max(spacing, seconds / MAX_POINTS)
        self.max_bytes = max_bytes
        self._points: deque[_Point] = deque()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._points)

    @property
    def bytes(self) -> int:
        """The estimated bytes of the kept points."""
        with self._lock:
            return self._bytes

    def _due(self, t: float) -> bool:
        """Whether a point at *t* is kept (the lock held): *spacing* after the newest one. A clock
        that went back past the whole history (another server) starts it again."""
        if self._points and t < self._points[-1].time - self.seconds:
            self._points.clear()
            self._bytes = 0
        return not self._points or t - self._points[-1].time >= self.spacing

    def add(self, now: Snapshot, earlier: Snapshot | None) -> None:
        """Keep the figures of *now* (rates and p99 over the window from *earlier*) when due."""
        if not self.spec:
            return
        with self._lock:
            if not self._due(now.time):
                return  # too soon after the newest point, or an older read finishing late
        point = self._point(now, earlier)  # outside the lock: ms at a thousand engines
        with self._lock:
            if not self._due(now.time):
                return
            if self._points and self._points[-1].ids == point.ids:  # the same engines up: share
                point = point._replace(ids=self._points[-1].ids, size=point.size - self._ids_bytes(point.ids))
            self._points.append(point)
            self._bytes += point.size
            while (
                self._points[0].time < now.time - self.seconds
                or len(self._points) > MAX_POINTS + 1
                or (self._bytes > self.max_bytes and len(self._points) > 1)
            ):
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        gone = self._points.popleft()
        self._bytes -= gone.size
        if self._points and self._points[0].ids is gone.ids:  # its ids now belong to the next one
            nxt = self._points[0]
            self._points[0] = nxt._replace(size=nxt.size + self._ids_bytes(nxt.ids))
            self._bytes += self._ids_bytes(nxt.ids)

    @staticmethod
    def _ids_bytes(ids: array[int]) -> int:
        return ARRAY_BYTES + ENGINE_ID_BYTES * len(ids)

    def _point(self, now: Snapshot, earlier: Snapshot | None) -> _Point:
        spec = self.spec
        keys = [(spec[n][0], spec[n][1]) for n in spec]
        ids, columns = engine_columns(now, earlier, keys)
        fleet = array(
            "d",
            [
                now.time,
                *(
                    _nan(_over_engines(columns[spec[n][0], spec[n][1]], spec[n][2]))
                    for n in self.fleet_figures
                ),
            ],
        )
        per_engine = [columns[spec[n][0], spec[n][1]] for n in self.engine_figures]
        # An engine index past 64 bits (a writer may be given any int) is kept out of the engines'
        # part, not allowed to fail the point: one odd engine costs its own chart only.
        kept = [i for i, e in enumerate(ids) if e <= MAX_ENGINE_ID] if per_engine else []
        values = array("f", [_nan(column[i]) for i in kept for column in per_engine])
        id_array = array("q", [ids[i] for i in kept])
        size = POINT_BYTES + ARRAY_BYTES + FIGURE_BYTES * len(fleet)
        size += ARRAY_BYTES + ENGINE_FIGURE_BYTES * len(values) + self._ids_bytes(id_array)
        if size > self.max_bytes:  # one point's engines past the whole budget: the fleet's only
            id_array, values = array("q"), array("f")
            size = POINT_BYTES + 3 * ARRAY_BYTES + FIGURE_BYTES * len(fleet)
        return _Point(now.time, fleet, id_array, values, size)

    def columns(self) -> dict[str, list[float | str | None]]:
        """``{"time": [...], figure: [...]}`` of the fleet figures, oldest first; ``None`` for a
        figure without a value, ``"+Inf"`` / ``"-Inf"`` for an infinite one (strict JSON)."""
        with self._lock:
            points = list(self._points)
        out: dict[str, list[float | str | None]] = {"time": [p.time for p in points]}
        for i, name in enumerate(self.fleet_figures, start=1):
            out[name] = [json_number(p.fleet[i], nan=None) for p in points]
        return out

    def engine_series(self, engines: Collection[int]) -> dict[str, dict[str, list[float | str | None]]]:
        """Each of *engines*' per-engine figures at every point (aligned with :meth:`columns`'
        ``time``; ``None`` where it was not up, or had no value): ``{"3": {figure: [...]}}``."""
        with self._lock:
            points = list(self._points)
        n = len(self.engine_figures)
        out: dict[str, dict[str, list[float | str | None]]] = {}
        for engine in sorted(set(engines)):
            series: list[list[float | str | None]] = [[] for _ in range(n)]
            for p in points:
                at = bisect.bisect_left(p.ids, engine)
                found = at < len(p.ids) and p.ids[at] == engine
                for j in range(n):
                    series[j].append(json_number(_short(p.values[at * n + j]), nan=None) if found else None)
            out[str(engine)] = dict(zip(self.engine_figures, series))
        return out

    def engines_held(self) -> int:
        """How many engines the newest point holds figures of."""
        with self._lock:
            return len(self._points[-1].ids) if self._points else 0


def _short(v: float) -> float:
    """A float32 as the few digits it holds (``0.3``, not ``0.30000001192092896``)."""
    return float(f"{v:.7g}") if math.isfinite(v) else v
