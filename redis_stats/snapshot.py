"""The value types of a read: :class:`Snapshot`, :class:`EngineSnapshot`, :class:`HistogramValue`,
:class:`WriterInfo` and :class:`Skipped`, as :meth:`redis_stats.StatsReader.snapshot` returns them.

Plain data with the arithmetic routers and autoscalers do on two reads (rates across a reset,
recent histograms, quantiles as Prometheus interpolates them) and the JSON ``/snapshot`` serves
(:meth:`Snapshot.to_dict`: the one place that JSON is built). How a reply of Redis becomes one
is the decoder's business (:mod:`redis_stats._core.read.decoder`), not this module's.
"""

from __future__ import annotations

import math
from collections import Counter as _Tally
from dataclasses import dataclass, field
from typing import Any, overload

from redis_stats.catalog import Catalog

__all__ = ["EngineSnapshot", "HistogramValue", "SeriesKey", "Skipped", "Snapshot", "WriterInfo"]

SeriesKey = tuple[str, tuple[str, ...]]
"""A series as a snapshot keys it: (metric name, label values in declared order)."""

_INF = math.inf
# JSON has no infinities or NaN (``json.dumps`` would write ``Infinity``, which strict parsers
# refuse): such a value is written as the string Prometheus and OpenMetrics use for it.
_NON_FINITE = {_INF: "+Inf", -_INF: "-Inf"}
_SKIPPED_NAMED = 50  # keys/fields a Skipped names; the counts go on past it


class Skipped(_Tally[str]):
    """What one read skipped: a count by reason (a ``Counter``), and ``where``, the first
    ``(reason, key, field)`` it met (``field`` is ``""`` for a whole key), to name them."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.where: list[tuple[str, str, str]] = []

    def note(self, reason: str, key: str, field: str = "") -> None:
        """Count one skipped field (or the whole *key*, when *field* is ``""``) and, while there
        is room, name it: *key* is the key it was read from, in its shard."""
        self[reason] += 1
        if len(self.where) < _SKIPPED_NAMED:
            self.where.append((reason, key, field))


@overload
def json_number(value: float, nan: str = ...) -> float | str: ...
@overload
def json_number(value: float, nan: None) -> float | str | None: ...
def json_number(value: float, nan: str | None = "NaN") -> float | str | None:
    """*value* itself when finite, else ``"+Inf"``, ``"-Inf"`` or *nan* (strict JSON): the one
    rule every JSON document of the package writes numbers by (``/snapshot``, ``/recent``)."""
    if math.isfinite(value):
        return value
    return _NON_FINITE.get(value, nan)


@dataclass(frozen=True)
class HistogramValue:
    """A histogram series: ascending bucket bounds (the last is ``+Inf``), cumulative counts, sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float

    @property
    def count(self) -> float:
        """Number of observations (the ``+Inf`` bucket)."""
        return self.cumulative[-1] if self.cumulative else 0.0

    def quantile(self, q: float) -> float:
        """The *q*-quantile (0..1), interpolated within buckets as Prometheus' histogram_quantile.

        NaN without observations; the highest finite bound when it falls in the ``+Inf`` bucket.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q={q!r} must be between 0 and 1")
        total = self.count
        if total <= 0:
            return math.nan
        rank = q * total
        prev_bound, prev_count = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative):
            if cum >= rank:
                if bound == _INF:
                    return prev_bound if len(self.bounds) > 1 else math.nan
                if cum == prev_count:
                    return bound
                lower = prev_bound if prev_bound < bound else 0.0
                return lower + (bound - lower) * (rank - prev_count) / (cum - prev_count)
            prev_bound, prev_count = bound, cum
        return self.bounds[-2] if len(self.bounds) > 1 else math.nan

    def plus(self, other: HistogramValue) -> HistogramValue:
        """This series and *other* (same bounds: another writer's part of it) added up."""
        cumulative = tuple(a + b for a, b in zip(self.cumulative, other.cumulative))
        return HistogramValue(self.bounds, cumulative, self.sum + other.sum)

    def minus(self, earlier: HistogramValue | None) -> HistogramValue:
        """The observations made since *earlier* (same series, an older snapshot)."""
        if earlier is None:
            return self
        before = dict(zip(earlier.bounds, earlier.cumulative))
        cumulative = tuple(max(0.0, c - before.get(b, 0.0)) for b, c in zip(self.bounds, self.cumulative))
        return HistogramValue(self.bounds, cumulative, max(0.0, self.sum - earlier.sum))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: buckets ``[[le, cumulative], ...]``, sum, count and p50/p90/p99.

        Quantiles are None without observations (JSON has no NaN); a sum or count that is not
        finite is written ``"+Inf"``, ``"-Inf"`` or ``"NaN"``, as Prometheus writes them.
        """

        def q(x: float) -> float | str | None:
            return json_number(self.quantile(x), nan=None)

        return {
            "buckets": [[json_number(b), json_number(c)] for b, c in zip(self.bounds, self.cumulative)],
            "sum": json_number(self.sum),
            "count": json_number(self.count),
            "p50": q(0.5),
            "p90": q(0.9),
            "p99": q(0.99),
        }


@dataclass
class EngineSnapshot:
    """One engine: liveness, and its series by ``(metric name, label values)``.

    ``gauges`` holds only values from live writers of a live engine; a stale engine shows none.
    """

    engine: int
    heartbeat: float
    age: float
    up: bool
    counters: dict[SeriesKey, float] = field(default_factory=dict)
    conflict: tuple[str, ...] = ()
    """Owners of two live instances that both claimed this engine within stale_after, if any."""
    gauges: dict[SeriesKey, float] = field(default_factory=dict)
    histograms: dict[SeriesKey, HistogramValue] = field(default_factory=dict)
    state: str = ""
    """``up``, ``stale`` or ``down``, by the one rule every view applies
    (``redis_stats._core.read.liveness``: ``stale`` is up but a flush or more behind); ``""``: not
    judged (an engine made by hand)."""
    endpoint: str | None = None
    """The endpoint its writers are served behind (``StatsConfig.endpoint``), None if none said."""
    writers: tuple[str, ...] = ()
    """The writers it runs in (their ids, ``host:pid[:role]:random``): the live ones holding chunks
    in it, or, when none is live, every one that does (where a down engine ran); newest heartbeat
    first."""
    closed: bool = False
    """Down because every writer holding chunks in it closed cleanly (a stop on purpose: a
    scale-in, a rolling restart), not because they went silent (killed, frozen, cut off)."""

    def counter(self, name: str, *labels: str) -> float:
        """The counter total for these label values (0 when never written)."""
        return self.counters.get((name, labels), 0.0)

    def gauge(self, name: str, *labels: str) -> float | None:
        """The current gauge value, or None when absent or not current."""
        return self.gauges.get((name, labels))

    def histogram(self, name: str, *labels: str) -> HistogramValue | None:
        """The histogram for these label values, or None."""
        return self.histograms.get((name, labels))


@dataclass
class WriterInfo:
    """A writer's last heartbeat (server time, s), its age, whether it closed or went stale, and
    the self-metrics it stored with its last flush (field -> text, see ``WriterStats.as_fields``)."""

    heartbeat: float
    age: float
    closed: bool
    live: bool
    stats: dict[str, str] = field(default_factory=dict)


@dataclass
class Snapshot:
    """All engines of a namespace at server time ``time`` (seconds since the epoch)."""

    time: float
    engines: dict[int, EngineSnapshot]
    writers: dict[str, WriterInfo]
    catalog: Catalog
    skipped: _Tally[str] = field(default_factory=Skipped)
    """Fields and keys skipped, by reason; a :class:`Skipped` also names the first few."""
    labels_replaced: int = 0
    """Label values of this read longer than the reader's ``max_label_length``, shown replaced
    by their first 64 characters and a digest of the whole value (two long values stay apart)."""

    def total(self, name: str, *labels: str) -> float:
        """A counter summed over every engine."""
        return sum(e.counter(name, *labels) for e in self.engines.values())

    def rate(self, previous: Snapshot, name: str, *labels: str, engine: int | None = None) -> float:
        """Per-second increase of a counter since *previous* (server clock), for one *engine* or
        summed over all. A counter that went down (Redis lost its data) counts from 0, as
        Prometheus' ``rate()`` treats a reset."""
        seconds = self.time - previous.time
        if seconds <= 0:
            return 0.0
        engines = [engine] if engine is not None else list(self.engines)
        increase = 0.0
        for e in engines:
            now = self.engines[e].counter(name, *labels) if e in self.engines else 0.0
            before = previous.engines[e].counter(name, *labels) if e in previous.engines else 0.0
            increase += now - before if now >= before else now
        return increase / seconds

    def histogram_since(
        self, previous: Snapshot, name: str, *labels: str, engine: int
    ) -> HistogramValue | None:
        """The observations of a histogram between two snapshots (for recent quantiles)."""
        now = self.engines.get(engine)
        hist = now.histogram(name, *labels) if now else None
        if hist is None:
            return None
        before = previous.engines.get(engine)
        return hist.minus(before.histogram(name, *labels) if before else None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for routers and autoscalers (``/snapshot``).

        Strict JSON: ``json.dumps(snapshot.to_dict(), allow_nan=False)`` always succeeds; a value
        that is not finite (a gauge set to ``inf``) is written ``"+Inf"``, ``"-Inf"`` or ``"NaN"``.
        """

        def series(d: dict[SeriesKey, Any], spec_of: Any) -> list[dict[str, Any]]:
            out = []
            for (name, values), v in sorted(d.items()):
                spec = spec_of(name)
                labels = dict(zip(spec.labels, values)) if spec else {}
                value = v.to_dict() if isinstance(v, HistogramValue) else json_number(v)
                out.append({"name": name, "labels": labels, "value": value})
            return out

        spec_of = self.catalog.get
        return {
            "time": json_number(self.time),
            "engines": {
                str(e.engine): {
                    "up": e.up,
                    "state": e.state or ("up" if e.up else "down"),
                    "endpoint": e.endpoint,
                    "writers": list(e.writers),
                    "age_seconds": json_number(e.age),
                    "counters": series(e.counters, spec_of),
                    "gauges": series(e.gauges, spec_of),
                    "histograms": series(e.histograms, spec_of),
                }
                for e in sorted(self.engines.values(), key=lambda e: e.engine)
            },
            "writers": {
                w: {"age_seconds": json_number(i.age), "closed": i.closed, "live": i.live}
                for w, i in self.writers.items()
            },
            "skipped": dict(self.skipped),
        }
