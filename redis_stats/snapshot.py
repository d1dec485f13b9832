"""Snapshot: every engine's series at one instant, decoded from one reply of ``read.lua``.

Decoding is sans-I/O (the sync and asyncio readers share it) and tolerant: a field or value that
does not parse (written by hand, or by a newer version) is skipped and counted in
``Snapshot.skipped``; it never fails the read.
"""

from __future__ import annotations

import logging
import math
from collections import Counter as _Tally
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from . import fields
from .catalog import COUNTER, GAUGE, HISTOGRAM, Catalog, MetricSpec
from .errors import CatalogError

__all__ = ["EngineSnapshot", "HistogramValue", "SeriesKey", "Snapshot", "SnapshotDecoder", "WriterInfo"]

log = logging.getLogger("redis_stats.reader")

SeriesKey = tuple[str, tuple[str, ...]]
_INF = math.inf
# JSON has no infinities or NaN (``json.dumps`` would write ``Infinity``, which strict parsers
# refuse): such a value is written as the string Prometheus and OpenMetrics use for it.
_NON_FINITE = {_INF: "+Inf", -_INF: "-Inf"}
_FIELD_CACHE_LIMIT = 1_000_000


def _json_number(value: float) -> float | str:
    """*value* itself when finite, else ``"+Inf"``, ``"-Inf"`` or ``"NaN"`` (strict JSON)."""
    if math.isfinite(value):
        return value
    return _NON_FINITE.get(value, "NaN")


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

        def q(x: float) -> float | None:
            value = self.quantile(x)
            return None if math.isnan(value) else _json_number(value)

        return {
            "buckets": [
                [_json_number(b), _json_number(c)] for b, c in zip(self.bounds, self.cumulative)
            ],
            "sum": _json_number(self.sum),
            "count": _json_number(self.count),
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
    skipped: _Tally[str] = field(default_factory=_Tally)
    engine_hashes: list[tuple[str, EngineSnapshot, list[Any], list[Any]]] = field(
        default_factory=list, repr=False, compare=False
    )

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
                value = v.to_dict() if isinstance(v, HistogramValue) else _json_number(v)
                out.append({"name": name, "labels": labels, "value": value})
            return out

        spec_of = self.catalog.get
        return {
            "time": _json_number(self.time),
            "engines": {
                str(e.engine): {
                    "up": e.up,
                    "age_seconds": _json_number(e.age),
                    "counters": series(e.counters, spec_of),
                    "gauges": series(e.gauges, spec_of),
                    "histograms": series(e.histograms, spec_of),
                }
                for e in sorted(self.engines.values(), key=lambda e: e.engine)
            },
            "writers": {
                w: {"age_seconds": _json_number(i.age), "closed": i.closed, "live": i.live}
                for w, i in self.writers.items()
            },
            "skipped": dict(self.skipped),
        }


_LAYOUTS: dict[tuple[float, ...], str] = {}


def layout_of(spec: MetricSpec) -> str:
    """The bucket-layout tag a histogram's fields carry (see accumulator.bucket_layout)."""
    tag = _LAYOUTS.get(spec.buckets)
    if tag is None:
        tag = _LAYOUTS[spec.buckets] = fields.bucket_layout((*spec.buckets, _INF))
    return tag


def parse_histogram(spec: MetricSpec, raw: str) -> HistogramValue | None:
    """``"<sum> <c0> ... <cN>"`` (cumulative counts) as a HistogramValue, None if malformed."""
    parts = raw.split()
    bounds = (*spec.buckets, _INF)
    if len(parts) != len(bounds) + 1:
        return None
    try:
        total = float(parts[0])
        cumulative = tuple(float(x) for x in parts[1:])
    except ValueError:
        return None
    if total != total or any(b < a for a, b in pairwise(cumulative)):
        return None
    return HistogramValue(bounds, cumulative, total)


def _pairs(flat: list[Any]) -> Iterable[tuple[Any, Any]]:
    it = iter(flat)
    return zip(it, it)


class SnapshotDecoder:
    """Turns replies of ``read.lua`` into :class:`Snapshot` objects.

    Keeps what does not change between reads: the catalogue stored in Redis (re-read only when
    its version changes) and the parse of every field seen.
    """

    def __init__(self, catalog: Catalog | None = None, *, stale_after: float = 30.0) -> None:
        self.local = catalog if catalog is not None else Catalog()
        self.stale_after_ms = stale_after * 1000.0
        self.meta_version = ""
        self.catalog = self.local
        self._fields: dict[str, tuple[MetricSpec, tuple[str, ...], str] | str] = {}

    # Local specs that conflict with the stored ones (names), counted in every read's ``skipped``.
    _conflicting: tuple[str, ...] = ()

    def _update_meta(self, version: str, flat: list[Any], skipped: _Tally[str]) -> None:
        """Merge the catalogue stored in Redis (*flat*, at *version*) with the local one.

        The stored definition wins (it is the first one written, see docs/key-schema.md): stored
        series are always read with the labels they were written with. A local spec that conflicts
        with it (kind, labels, buckets, mode) is not used, and is counted in every read as
        ``skipped["catalog_conflict"]``; local specs Redis does not hold are used as they are.
        """
        if version != self.meta_version:
            stored: dict[str, MetricSpec] = {}
            for name, value in _pairs(flat):
                if not name.startswith("m:"):
                    continue
                try:
                    stored[name[2:]] = MetricSpec.from_json(name[2:], value)
                except (ValueError, TypeError):
                    skipped["bad_spec"] += 1
            conflicting = []
            base = Catalog()
            for spec in self.local:
                theirs = stored.pop(spec.name, None)
                if theirs is not None and theirs.conflicts_with(spec):
                    conflicting.append(spec.name)
                    log.warning(
                        "metric %r is stored in Redis as %s, but this reader's code defines it as %s: "
                        "shown as stored (the first definition wins); fix the code or the namespace",
                        spec.name,
                        theirs.to_json(),
                        spec.to_json(),
                    )
                try:
                    base.add(theirs if theirs is not None else spec)
                except CatalogError:
                    # A stored spec taking a local one's place whose samples would repeat another
                    # local metric's: one series printed twice is worse than one metric missing.
                    skipped["name_clash"] += 1
            # A stored spec whose samples would repeat another's (written by an older or foreign
            # writer) is left out, for the same reason.
            self.catalog = base.merged(stored.values(), lambda spec, why: skipped.update(["name_clash"]))
            self._conflicting = tuple(conflicting)
            self.meta_version = version
            self._fields.clear()
        if self._conflicting:
            skipped["catalog_conflict"] += len(self._conflicting)

    def _parse(self, name: str) -> tuple[MetricSpec, tuple[str, ...], str] | str:
        """(spec, label values, suffix) of a field, or the reason it is skipped."""
        try:
            parts = fields.decode(name)
        except ValueError:
            return "bad_field"
        spec = self.catalog.get(parts[0])
        if spec is None:
            return "unknown_metric"
        extra = 1 if (spec.kind != COUNTER) else 0
        if len(parts) != 1 + len(spec.labels) + extra:
            return "bad_field"
        if spec.kind == HISTOGRAM and parts[-1] != layout_of(spec):
            return "unknown_bucket"  # written with other bucket bounds than the catalogue's
        return spec, tuple(parts[1 : 1 + len(spec.labels)]), parts[-1] if extra else ""

    def _field(self, name: str) -> tuple[MetricSpec, tuple[str, ...], str] | str:
        parsed = self._fields.get(name)
        if parsed is None:
            if len(self._fields) > _FIELD_CACHE_LIMIT:
                self._fields.clear()
            parsed = self._fields[name] = self._parse(name)
        return parsed

    def decode_shell(self, reply: list[Any], skipped: _Tally[str]) -> Snapshot:
        """The snapshot of a reply without its series: catalogue, writers, engines and their
        liveness; ``engine_hashes`` holds each engine's raw (counter, gauge) hashes for the caller
        to decode (this decoder, or the text renderer)."""
        now_ms = float(reply[0])
        self._update_meta(str(reply[3]), reply[4] or [], skipped)
        writers: dict[str, WriterInfo] = {}
        for wid, score in _pairs(reply[2]):
            score = float(score)
            closed = score < 0
            beat = abs(score)
            age = max(0.0, (now_ms - beat) / 1000.0)
            writers[wid] = WriterInfo(
                beat / 1000.0, age, closed, not closed and age * 1000.0 <= self.stale_after_ms
            )
        conflicts = self._conflicts(reply[5], now_ms)
        engines: dict[int, EngineSnapshot] = {}
        engine_pairs = list(_pairs(reply[1]))
        hashes = reply[6 : 6 + 2 * len(engine_pairs)]
        for stats, info in zip(reply[6 + 2 * len(engine_pairs) :], writers.values()):
            info.stats = dict(_pairs(stats))
        shell = Snapshot(now_ms / 1000.0, engines, writers, self.catalog, skipped)
        for idx, (engine_text, score) in enumerate(engine_pairs):
            try:
                engine = int(engine_text)
            except ValueError:
                skipped["bad_engine"] += 1
                continue
            beat = float(score)
            age = max(0.0, (now_ms - beat) / 1000.0)
            snap = EngineSnapshot(engine, beat / 1000.0, age, age * 1000.0 <= self.stale_after_ms)
            snap.conflict = conflicts.get(engine_text, ())
            engines[engine] = snap
            shell.engine_hashes.append((engine_text, snap, hashes[2 * idx], hashes[2 * idx + 1]))
        return shell

    def decode(self, reply: list[Any]) -> Snapshot:
        """Build a snapshot from ``{now, engines, writers, version, meta, conflicts, c, g, ...}``."""
        skipped: _Tally[str] = _Tally()
        shell = self.decode_shell(reply, skipped)
        for _, snap, c_flat, g_flat in shell.engine_hashes:
            self._decode_counters(snap, c_flat, skipped)
            if snap.up:
                self._decode_gauges(snap, g_flat, shell.writers, skipped)
        shell.engine_hashes = []
        return shell

    def _conflicts(self, flat: list[Any], now_ms: float) -> dict[str, tuple[str, ...]]:
        """Engines claimed by two live owners within stale_after: engine -> (owner a, owner b)."""
        out = {}
        for engine, text in _pairs(flat):
            parts = text.split("|")
            try:
                at = float(parts[-1])
            except ValueError:
                continue
            if len(parts) >= 3 and now_ms - at <= self.stale_after_ms:
                out[engine] = tuple(parts[:-1])
        return out

    def _decode_counters(self, snap: EngineSnapshot, flat: list[Any], skipped: _Tally[str]) -> None:
        for name, raw in _pairs(flat):
            parsed = self._field(name)
            if isinstance(parsed, str):
                skipped[parsed] += 1
                continue
            spec, labels, _ = parsed
            if spec.kind == COUNTER:
                try:
                    value = float(raw)
                except ValueError:
                    value = math.nan
                if value != value:
                    skipped["bad_value"] += 1
                    continue
                snap.counters[(spec.name, labels)] = value
                continue
            hist = parse_histogram(spec, raw)
            if hist is None:
                skipped["bad_value"] += 1
            else:
                snap.histograms[(spec.name, labels)] = hist

    def _decode_gauges(
        self, snap: EngineSnapshot, flat: list[Any], writers: dict[str, WriterInfo], skipped: _Tally[str]
    ) -> None:
        newest: dict[SeriesKey, tuple[float, float]] = {}
        combined: dict[SeriesKey, list[float]] = {}
        modes: dict[SeriesKey, str] = {}
        for name, raw in _pairs(flat):
            parsed = self._field(name)
            if isinstance(parsed, str):
                skipped[parsed] += 1
                continue
            spec, labels, writer = parsed
            if spec.kind != GAUGE:
                skipped["bad_field"] += 1
                continue
            info = writers.get(writer)
            if info is None or not info.live:
                continue  # not current: a stale, closed or removed writer's value
            stamp_text, _, value_text = raw.partition("|")
            try:
                stamp, value = float(stamp_text), float(value_text)
            except ValueError:
                value = math.nan
            if value != value:
                skipped["bad_value"] += 1
                continue
            key = (spec.name, labels)
            if spec.mode == "mostrecent":
                best = newest.get(key)
                if best is None or stamp > best[0]:
                    newest[key] = (stamp, value)
            else:
                modes[key] = spec.mode
                combined.setdefault(key, []).append(value)
        for key, (_, value) in newest.items():
            snap.gauges[key] = value
        for key, values in combined.items():
            mode = modes[key]
            snap.gauges[key] = sum(values) if mode == "sum" else max(values) if mode == "max" else min(values)
