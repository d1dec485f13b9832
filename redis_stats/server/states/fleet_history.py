"""The fleet's recent history: a few figures per sample, for as long as the live page's charts span.

The live page charts the fleet over the last minutes (throughput, KV cache, waiting queue, TTFT and
ITL p99). A page computes each point from a ``/snapshot`` it polled, so on first open its charts
were empty although the exporter had been reading the fleet all along (its ``/snapshot`` window).
A :class:`FleetHistory` keeps, per namespace, the figures of those charts for every snapshot the
window takes (its sampler's and each ``/snapshot`` request's; never a read of its own), at most one
every *spacing* seconds over :data:`HISTORY_SECONDS`: a few floats per point, at most
:data:`MAX_POINTS` points, whatever the fleet's size.

Which figures is a :data:`~redis_stats.server.options.HistorySpec` the integration injects (the
vLLM one names the page's charts), so this module knows no product's metric names. Each figure is
computed by the rules the page applies to a ``/snapshot`` document, over the engines up in the
newest snapshot, so that a point kept here and the one a page computes from the same read are the
same numbers.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from redis_stats.server.options import HistorySpec
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

# A point is an array of doubles (its time and each figure, NaN for none) and a deque slot; measured
# with tracemalloc (tests/prometheus/test_fleet_history.py keeps it honest).
POINT_BYTES = 80
FIGURE_BYTES = 8


def fleet_point(now: Snapshot, earlier: Snapshot | None, spec: HistorySpec) -> list[float | None]:
    """The figures of *spec* for *now*, rates and p99 over the window from *earlier* (None: no
    window, those figures are None), in *spec*'s order."""
    seconds = now.time - earlier.time if earlier is not None else None
    up = [e for _, e in sorted(now.engines.items()) if e.up]
    per_engine: dict[tuple[str, str], list[float | None]] = {}
    out: list[float | None] = []
    for metric, engine_kind, fleet_kind in spec.values():
        if engine_kind in WINDOWED and not seconds:
            out.append(None)
            continue
        values = per_engine.get((metric, engine_kind))
        if values is None:  # two figures of one metric (worst and median) compute it once
            values = per_engine[metric, engine_kind] = [
                _engine_value(e, earlier, metric, engine_kind, seconds or 0.0) for e in up
            ]
        out.append(_over_engines(values, fleet_kind))
    return out


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


class FleetHistory:
    """The figures of *spec* at every snapshot :meth:`add` is given, at most one every *spacing*
    seconds (and every ``HISTORY_SECONDS / MAX_POINTS``), over the last :data:`HISTORY_SECONDS`
    (server clock); thread safe. An empty *spec* keeps nothing."""

    def __init__(self, spec: HistorySpec, *, spacing: float, seconds: float = HISTORY_SECONDS) -> None:
        self.spec = dict(spec)
        self.seconds = seconds
        self.spacing = max(spacing, seconds / MAX_POINTS)
        self._points: deque[array[float]] = deque(maxlen=MAX_POINTS + 1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._points)

    @property
    def bytes(self) -> int:
        """The estimated bytes of the kept points."""
        return len(self) * (POINT_BYTES + FIGURE_BYTES * (1 + len(self.spec)))

    def _due(self, t: float) -> bool:
        """Whether a point at *t* is kept (the lock held): *spacing* after the newest one. A clock
        that went back past the whole history (another server) starts it again."""
        if self._points and t < self._points[-1][0] - self.seconds:
            self._points.clear()
        return not self._points or t - self._points[-1][0] >= self.spacing

    def add(self, now: Snapshot, earlier: Snapshot | None) -> None:
        """Keep the figures of *now* (rates and p99 over the window from *earlier*) when due."""
        if not self.spec:
            return
        with self._lock:
            if not self._due(now.time):
                return  # too soon after the newest point, or an older read finishing late
        figures = fleet_point(now, earlier, self.spec)  # outside the lock: ms at a thousand engines
        point = array("d", [now.time, *(math.nan if v is None else v for v in figures)])
        with self._lock:
            if not self._due(now.time):
                return
            self._points.append(point)
            while self._points[0][0] < now.time - self.seconds:
                self._points.popleft()

    def columns(self) -> dict[str, list[float | str | None]]:
        """``{"time": [...], figure: [...]}``, oldest first; ``None`` for a figure without a value,
        ``"+Inf"`` / ``"-Inf"`` for an infinite one (strict JSON)."""
        with self._lock:
            points = list(self._points)
        out: dict[str, list[float | str | None]] = {"time": [p[0] for p in points]}
        for i, name in enumerate(self.spec, start=1):
            out[name] = [json_number(p[i], nan=None) for p in points]
        return out
