"""Snapshot: every engine's series at one instant, decoded from one reply of ``read.lua``.

Decoding is sans-I/O (the sync and asyncio readers share it) and tolerant: a field or value that
does not parse (written by hand, or by a newer version), or a key of the wrong type, is skipped
and counted in ``Snapshot.skipped`` (which also names the first few keys and fields); it never
fails the read. Whether a raw value is valid for a kind is decided once, by
:func:`number_text`, :func:`gauge_parts` and :func:`histogram_parts`
(:mod:`redis_stats._core.values`, re-exported here), and an engine's writers are added up by
:meth:`SnapshotDecoder.merge` (:mod:`redis_stats._core.merge`): the text renderer
(:mod:`redis_stats.prometheus.exposition`) is fed by the same methods, so both render paths skip
the same data and show the same sums.
"""

from __future__ import annotations

import logging
import math
from collections import Counter as _Tally
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from redis_stats._core import fields
from redis_stats._core.liveness import STALE_FIELD, Liveness
from redis_stats._core.merge import (
    Chunk,
    EngineChunks,
    Generations,
    Group,
    Kept,
    Layout,
    Parsed,
    merge_groups,
)
from redis_stats._core.values import (
    gauge_parts,
    histogram_numbers,
    histogram_parts,
    number_text,
    roll_up,
)
from redis_stats.catalog import COUNTER, HISTOGRAM, Catalog, MetricSpec
from redis_stats.errors import CatalogError, SchemaMismatch
from redis_stats.keys import SCHEMA_VERSION, Keys

__all__ = [
    "EngineHash",
    "EngineKey",
    "EngineSnapshot",
    "HistogramValue",
    "SeriesKey",
    "Skipped",
    "Snapshot",
    "SnapshotDecoder",
    "SplitKey",
    "WriterInfo",
    "gauge_parts",
    "histogram_numbers",
    "histogram_parts",
    "number_text",
]

log = logging.getLogger("redis_stats.reader")

SeriesKey = tuple[str, tuple[str, ...]]
_INF = math.inf
# JSON has no infinities or NaN (``json.dumps`` would write ``Infinity``, which strict parsers
# refuse): such a value is written as the string Prometheus and OpenMetrics use for it.
_NON_FINITE = {_INF: "+Inf", -_INF: "-Inf"}
# Series fields and chunk fields a read keeps the parse of at most; past it, parsed at each read.
_FIELD_CACHE_LIMIT = 1_000_000
# Names fields a read keeps at most (engines of one model share one, unless their series differ,
# e.g. LoRA adapter sets); past it, the others are parsed again at each read.
_LAYOUT_CACHE_LIMIT = 10_000
_SKIPPED_NAMED = 50  # keys/fields a Skipped names; the counts go on past it


class Skipped(_Tally[str]):
    """What one read skipped: a count by reason (a ``Counter``), and ``where``, the first
    ``(reason, key, field)`` it met (``field`` is ``""`` for a whole key), to name them."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.where: list[tuple[str, str, str]] = []

    def note(self, reason: str, key: EngineKey, field: str = "", value: Any = None) -> None:
        """Count one skipped field (or key) and, while there is room, say which: *key* is the key
        it came from, or the :class:`SplitKey` of an engine's hash read from several shards
        (then the part holding *field*, with *value* if given, is named)."""
        self[reason] += 1
        if len(self.where) < _SKIPPED_NAMED:
            self.where.append((reason, key if isinstance(key, str) else key.of(field, value), field))


class SplitKey:
    """The keys of an engine's hash read from several shards and put together by the reader (only
    after K changed: data written with K = 1 for engine 4 is in shard 0, with K = 3 in shard 1),
    with each part as read: names the key a skipped field came from. Asked only for what is
    skipped (and named), so it costs a read nothing. Also the ``engines`` sets of the shards
    listing one engine (each part ``[engine, score]``): names those listing a bad engine name."""

    __slots__ = ("parts",)

    def __init__(self, parts: Iterable[tuple[str, list[Any]]]) -> None:
        self.parts = tuple(parts)
        """``(key, flat hash)`` of each shard's part, in the order they were put together."""

    def __str__(self) -> str:
        return " + ".join(key for key, _ in self.parts)

    def __repr__(self) -> str:
        return f"SplitKey({str(self)!r})"

    def of(self, field: Any, value: Any = None) -> str:
        """The key of the part holding *field* (with *value*, when given) as a field of its own
        (a base field, a chunk's field) or as a line of a chunk (a series field); the keys of
        every part that may hold it, joined by ``or``, when that is not one."""
        held = [key for key, flat in self.parts if _holds(flat, field, value)]
        if not held and value is not None:
            held = [key for key, flat in self.parts if _holds(flat, field, None)]
        return " or ".join(held or [key for key, _ in self.parts])


def _holds(flat: list[Any], field: Any, value: Any) -> bool:
    """Whether the hash *flat* holds *field* (with *value* unless it is None): as a field, or as
    a line of one of its chunks' names fields (then *value* is the line of the chunk's values)."""
    held = dict(_pairs(flat))
    if field in held and (value is None or held[field] == value):
        return True
    suffix = fields.NAMES_SUFFIX
    for name, names in held.items():
        if not (name.__class__ is str and name.startswith(fields.CHUNK_PREFIX) and name.endswith(suffix)):
            continue
        lines = names.split("\n") if names.__class__ is str else []
        if field not in lines:
            continue
        if value is None:
            return True
        values = held.get(name[: -len(suffix)])
        found = values.split("\n") if values.__class__ is str else []
        if any(line == field and i < len(found) and found[i] == value for i, line in enumerate(lines)):
            return True
    return False


EngineKey = str | SplitKey
"""The key of an engine's hash: its name, or the keys of the parts of one read from several shards."""


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
            value = self.quantile(x)
            return None if math.isnan(value) else _json_number(value)

        return {
            "buckets": [[_json_number(b), _json_number(c)] for b, c in zip(self.bounds, self.cumulative)],
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
    skipped: _Tally[str] = field(default_factory=Skipped)
    """Fields and keys skipped, by reason; a :class:`Skipped` also names the first few."""

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
    """The bucket-layout tag a histogram's fields carry (see fields.bucket_layout)."""
    tag = _LAYOUTS.get(spec.buckets)
    if tag is None:
        tag = _LAYOUTS[spec.buckets] = fields.bucket_layout((*spec.buckets, _INF))
    return tag


def parse_histogram(spec: MetricSpec, raw: str) -> HistogramValue | None:
    """``"<sum> <c0> ... <cN>"`` (cumulative counts) as a HistogramValue, None if malformed
    (see :func:`histogram_parts`)."""
    bounds = (*spec.buckets, _INF)
    parts = histogram_parts(raw, len(bounds))
    if parts is None:
        return None
    return HistogramValue(bounds, tuple(float(c) for c in parts[1]), float(parts[0]))


def _pairs(flat: list[Any]) -> Iterable[tuple[Any, Any]]:
    it = iter(flat)
    return zip(it, it)


def unreadable(part: Any) -> str | None:
    """Why a part of a read reply that should hold a key's contents (a list) does not: the key
    has the wrong type (``wrong_type``) or the read of it failed (``unreadable``); None if it is
    fine. One command of the read failing costs that key only."""
    if part.__class__ is list:
        return None
    if isinstance(part, Exception) and str(part).startswith("WRONGTYPE"):
        return "wrong_type"
    return "unreadable"


# A writer's stats hash (WriterStats.as_fields): fields holding text; every other known field
# holds a number. Unknown fields (a newer writer's) are kept as they are: nothing reads them.
_WRITER_TEXT_FIELDS = frozenset({"engines", "owner"})
_WRITER_NUMBER_FIELDS = frozenset(
    {"flushes", "duplicates", "failed_fields", "conflicts", "pending", "dur_sum", "last_ok_ms", STALE_FIELD}
)


class EngineHash(NamedTuple):
    """One engine's hash as a read returned it, with the engine's snapshot to fill (liveness
    decoded, no series yet): what :meth:`SnapshotDecoder.decode_shell` hands the render paths."""

    engine: str
    """The engine, as the engine index names it (``"3"``)."""
    snapshot: EngineSnapshot
    fields: list[Any]
    """The hash as a flat list ``[field, value, field, value, ...]`` (empty if unreadable)."""
    key: EngineKey
    """The key it was read from (in its shard: ``rs:{NS#1.3042}:v2:e:4:c`` for engine 4 of
    shard 1), which names what is skipped of it; a :class:`SplitKey` when it was read from
    several shards (after K changed) and put together."""
    live: set[str]
    """The writers whose gauges in it count: those live in the reply (one shard), or in the
    shard(s) this hash was read from (a merged reply's: a writer live in another shard only is
    cut off from this one, its values here frozen)."""


class SnapshotDecoder:
    """Turns replies of ``read.lua`` into :class:`Snapshot` objects.

    Keeps what does not change between reads: the catalogue stored in Redis (re-read only when
    its version changes), the parse of every series field and chunk field of the last read, the
    :class:`Layout` of every chunk names field of the last read, and the parses of the chunks of
    the last read with their text (an unchanged chunk is not parsed again). Each cache holds what
    the last read used (a :class:`~redis_stats._core.merge.Generations`, shared by reads at once),
    up to :data:`~redis_stats._core.merge.KEPT_CEILING` parses, ``_LAYOUT_CACHE_LIMIT`` names
    fields and ``_FIELD_CACHE_LIMIT`` fields, and belongs to this decoder, so to one namespace.
    Safe to share between threads: the caches hold only immutable entries, one dictionary store
    each, the field and layout ones tagged with the catalogue they were made from, so a thread
    still decoding with the previous catalogue never reads or leaves a wrong entry.
    *keys* names the keys of what is skipped (default: a namespace called ``?``).
    """

    def __init__(
        self, catalog: Catalog | None = None, *, stale_after: float = 30.0, keys: Keys | None = None
    ) -> None:
        self.local = catalog if catalog is not None else Catalog()
        self.stale_after_ms = stale_after * 1000.0
        self.meta_version = ""
        self.catalog = self.local
        self.keys = keys if keys is not None else Keys("?")
        # field -> (catalogue it was parsed with, (spec, label values, suffix) or reason), and a
        # chunk's values field -> (its writer or None,): those the last read used
        self._fields = Generations()
        self._writers_of = Generations()
        # names field (text) -> its Layout (tagged with its catalogue); the names fields of an
        # engine's groups -> whether no series is in two of them. Per decoder: per namespace;
        # those the last read used (as the chunk parses), up to _LAYOUT_CACHE_LIMIT each.
        self._layouts = Generations()
        self._disjoint = Generations()
        # (engine, chunk field, layout) -> (values text, its parse): the parses of the last
        # read, reused while the chunk is unchanged (an idle writer's)
        self._kept = Kept()
        # Begun and ended with every read (reads at once share them, see Generations).
        self._per_read = (self._kept, self._layouts, self._disjoint, self._fields, self._writers_of)

    # Local specs that conflict with the stored ones (names), counted in every read's ``skipped``.
    _conflicting: tuple[str, ...] = ()

    def _update_meta(self, version: str, flat: list[Any], skipped: Skipped) -> None:
        """Merge the catalogue stored in Redis (*flat*, at *version*) with the local one.

        The stored definition wins (it is the first one written, see docs/key-schema.md): stored
        series are always read with the labels they were written with. A local spec that conflicts
        with it (kind, labels, buckets, mode) is not used, and is counted in every read as
        ``skipped["catalog_conflict"]``; local specs Redis does not hold are used as they are.
        """
        if version != self.meta_version:
            stored: dict[str, MetricSpec] = {}
            for name, value in _pairs(flat):
                if name == "schema":
                    self._check_schema(value)
                if not name.startswith("m:"):
                    continue
                try:
                    stored[name[2:]] = MetricSpec.from_json(name[2:], value)
                except (ValueError, TypeError):
                    skipped.note("bad_spec", self.keys.meta, name)
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
                    skipped.note("name_clash", self.keys.meta, "m:" + spec.name)

            # A stored spec whose samples would repeat another's (written by an older or foreign
            # writer) is left out, for the same reason.
            def clash(spec: MetricSpec, why: str) -> None:
                skipped.note("name_clash", self.keys.meta, "m:" + spec.name)

            self.catalog = base.merged(stored.values(), clash)
            self._conflicting = tuple(conflicting)
            self.meta_version = version
            # (fields and layouts are tagged with their catalogue: made again)
        if self._conflicting:
            skipped["catalog_conflict"] += len(self._conflicting)

    def _check_schema(self, stored: Any) -> None:
        """Raise :class:`SchemaMismatch` when the namespace was written in another format than
        this reader's: reading it as ours would miscount or drop series without a word."""
        if stored == SCHEMA_VERSION:
            return
        known = {
            "1": "schema 1: deltas merged into one field per series by the flush script, gauges in "
            "rs:{NS}:e:<engine>:g; written by redis_stats before issue 15",
        }
        what = known.get(str(stored), f"schema {stored!r}, which this version does not know (a newer one?)")
        raise SchemaMismatch(
            f"namespace {self.keys.namespace!r}: {self.keys.meta} says its data is in {what}; this "
            f"reader reads schema {SCHEMA_VERSION}. Read it with the redis_stats version that wrote it, "
            "or run every writer and reader of the namespace at one version (a new namespace starts "
            "afresh); nothing was read"
        )

    def _parse(self, name: str, catalog: Catalog) -> tuple[MetricSpec, tuple[str, ...], str] | str:
        """(spec, label values, suffix) of a series field, or the reason it is skipped. Only a
        histogram's field has a suffix: its bucket layout."""
        if name.__class__ is not str:
            return "bad_field"
        try:
            parts = fields.decode(name)
        except ValueError:
            return "bad_field"
        spec = catalog.get(parts[0])
        if spec is None:
            return "unknown_metric"
        extra = 1 if spec.kind == HISTOGRAM else 0
        if len(parts) != 1 + len(spec.labels) + extra:
            return "bad_field"
        if spec.kind == HISTOGRAM and parts[-1] != layout_of(spec):
            return "unknown_bucket"  # written with other bucket bounds than the catalogue's
        return spec, tuple(parts[1 : 1 + len(spec.labels)]), parts[-1] if extra else ""

    def series_field(self, name: str, catalog: Catalog) -> Parsed | str:
        """A series field (of a base field or of a chunk line): (spec, label values, suffix), or
        the reason it is skipped. Both render paths ask this."""
        entry: tuple[Catalog, Parsed | str] | None = self._fields.get(name)
        if entry is not None and entry[0] is catalog:
            return entry[1]
        parsed = self._parse(name, catalog)
        if len(self._fields.now) < _FIELD_CACHE_LIMIT:
            self._fields.now[name] = (catalog, parsed)  # one store of an immutable pair: thread-safe
        return parsed

    def layout(self, names: str, catalog: Catalog) -> Layout:
        """What a chunk's names field (its text) means for *catalog*: the series fields, parsed,
        and where each kind's lines are. Kept by the text: a names field changes only when its
        writer adds a series, and the engines serving one model share it."""
        entry: Layout | None = self._layouts.get(names)
        if entry is not None and entry.catalog is catalog:
            return entry
        lines = tuple(names.split("\n")) if names else ()
        layout = Layout(catalog, lines, tuple(self.series_field(line, catalog) for line in lines))
        if len(self._layouts.now) < _LAYOUT_CACHE_LIMIT:
            self._layouts.now[names] = layout  # one store of an immutable object: thread-safe
        return layout

    def engine_chunks(
        self,
        engine: str,
        flat: list[Any],
        catalog: Catalog,
        skipped: Skipped,
        key: EngineKey | None = None,
    ) -> EngineChunks:
        """One engine's hash (*flat*, as read from *key*, :attr:`EngineHash.key`; default: shard
        0's key of the engine): its base fields (departed writers folded in by gc) and every
        writer's chunk (docs/key-schema.md). Both render paths start here, so they see the same
        values.

        A chunk whose names field is missing or does not match its values line for line, or
        whose field is malformed, is skipped and counted (``bad_chunk``): it costs that chunk only.
        """
        base: list[tuple[Any, Any, None]] = []
        chunks: dict[str, Any] = {}
        it = iter(flat)
        for name, raw in zip(it, it):
            if name.__class__ is str and name.startswith(fields.CHUNK_PREFIX):
                chunks[name] = raw
            else:
                base.append((name, raw, None))
        found: list[Chunk] = []
        if not chunks:
            return EngineChunks(base, found)
        if key is None:
            key = self.keys.counters(engine)
        suffix = fields.NAMES_SUFFIX
        for name, values in chunks.items():
            if name.endswith(suffix):
                if name[: -len(suffix)] not in chunks:
                    skipped.note("bad_chunk", key, name)  # names without values
                continue
            writer = self._chunk_writer(name)
            names = chunks.get(name + suffix)
            if writer is None or names.__class__ is not str or values.__class__ is not str:
                skipped.note("bad_chunk", key, name)
                continue
            layout = self.layout(names, catalog)
            value_list = values.split("\n") if values else []
            if len(layout.fields) != len(value_list):
                skipped.note("bad_chunk", key, name)
                continue
            found.append(Chunk(writer, name, names, layout, values, value_list))
        return EngineChunks(base, found)

    def merge(
        self, engine: str, chunks: EngineChunks, live: Container[str], up: bool, *, numbers: bool
    ) -> list[Group] | None:
        """The engine's values added up over its writers, group by group (chunks with the same
        names field, read column by column: :mod:`redis_stats._core.merge`), as sample text or,
        with *numbers*, as floats; gauges rolled up over the *live* writers when the engine is
        *up*. None when the engine must be read line by line (:meth:`EngineChunks.entries`): it
        has base fields, a series in two groups, or data the bulk checks do not take (garbage,
        infinities). Both paths give the same values."""
        layouts = {c.names: c.layout for c in chunks.chunks}
        disjoint = True
        if len(layouts) > 1:  # several names fields (a writer's second chunk, or other series)
            distinct = tuple(layouts)
            known: bool | None = self._disjoint.get(distinct)
            if known is None:
                seen: set[str] = set()
                for layout in layouts.values():
                    seen.update(layout.fields)
                known = len(seen) == sum(len(x.fields) for x in layouts.values())
                if len(self._disjoint.now) < _LAYOUT_CACHE_LIMIT:
                    self._disjoint.now[distinct] = known
            disjoint = known
        return merge_groups(engine, chunks, disjoint, live, up, numbers, self._kept)

    def _chunk_writer(self, name: str) -> str | None:
        found: tuple[str | None] | None = self._writers_of.get(name)
        if found is None:
            found = (fields.chunk_writer(name),)
            if len(self._writers_of.now) < _FIELD_CACHE_LIMIT:
                self._writers_of.now[name] = found  # one store of an immutable tuple: thread-safe
        return found[0]

    def decode_shell(self, reply: list[Any], skipped: _Tally[str]) -> tuple[Snapshot, list[EngineHash]]:
        """The snapshot of a reply without its series (catalogue, writers, engines and their
        liveness), and each engine's hash as read, for the caller to fill it from (this
        decoder's :meth:`decode`, or the text renderer: :meth:`engine_chunks`, then
        :meth:`merge`). A key of the wrong type (or whose read failed) is skipped and counted:
        it costs that key only. A read: the caller calls :meth:`read_done` when it is over,
        whether it succeeded or not (reads running at once share what they keep)."""
        for kept in self._per_read:
            kept.begin()  # a read: what is kept is what it will use
        if not isinstance(skipped, Skipped):
            skipped = Skipped(skipped)
        keys = self.keys
        now_ms = float(reply[0])
        version, meta = reply[3] or "", reply[4] or []
        why = unreadable(version) if version.__class__ is not str else unreadable(meta) if meta else None
        if why is not None:  # the catalogue hash itself: only the code's own catalogue is left
            skipped.note(why, keys.meta)
            version, meta = "", []
        if version == self.meta_version or meta or version == "":
            self._update_meta(version, meta, skipped)
        # else: a read planned against an older catalogue version by another thread, without
        # the catalogue itself: keep the one we hold (at least as new) rather than drop it.
        catalog = self.catalog
        writer_flat = self._readable(reply[2], keys.writers, skipped)
        scores = {wid: float(score) for wid, score in _pairs(writer_flat)}
        # A reply merged from several shards names the key each hash, engine, writer's
        # self-metrics and conflict was read from (ReaderCore.merge): what it holds of shard
        # s >= 1 is not under shard 0's keys. Unsharded, none: shard 0's keys, as always.
        hash_keys: list[EngineKey] | None = getattr(reply, "hash_keys", None)
        engine_keys: list[EngineKey] | None = getattr(reply, "engine_keys", None)
        writer_keys: list[str] | None = getattr(reply, "writer_keys", None)
        engine_pairs = list(_pairs(self._readable(reply[1], keys.engines, skipped)))
        stats_of: dict[str, dict[str, str]] = {}
        for idx, (stats, wid) in enumerate(zip(reply[6 + len(engine_pairs) :], scores)):
            stats_key = keys.writer_stats(wid) if writer_keys is None else writer_keys[idx]
            stats_of[wid] = self._writer_stats(stats_key, self._readable(stats, stats_key, skipped), skipped)
        # Liveness by what the writers stored, never by this reader's settings (issue 24): every
        # reader of the namespace gives the same answer at the same moment.
        rule = Liveness.of(now_ms, stats_of, self.stale_after_ms, judge_owners=unreadable(reply[2]) is None)
        writers = {
            wid: WriterInfo(abs(score) / 1000.0, rule.age(score), score < 0, rule.writer_live(wid, score))
            for wid, score in scores.items()
        }
        for wid, stats in stats_of.items():
            writers[wid].stats = stats
        conflict_flat = self._readable(reply[5], keys.conflicts, skipped)
        conflicts = self._conflicts(
            conflict_flat, now_ms, rule.fallback_ms, skipped, getattr(reply, "conflict_keys", None)
        )
        engines: dict[int, EngineSnapshot] = {}
        # A merged reply (several shards): the writers live in each shard, by their heartbeats
        # there, for the gauges of the engines read from it (see EngineHash.live).
        engine_shards: list[tuple[int, ...]] = getattr(reply, "engine_shards", None) or []
        shard_live: list[set[str]] = (
            [rule.live_in(flat) for flat in getattr(reply, "shard_writers", ())] if engine_shards else []
        )
        reply_live = {wid for wid, info in writers.items() if info.live}
        hashes = reply[6 : 6 + len(engine_pairs)]
        shell = Snapshot(now_ms / 1000.0, engines, writers, catalog, skipped)
        hashes_read: list[EngineHash] = []
        for idx, (engine_text, score) in enumerate(engine_pairs):
            try:
                engine = int(engine_text)
            except (ValueError, TypeError):
                engine = None
            if engine is None or str(engine) != engine_text:  # "+3" or " 3" would be a second 3
                listed = keys.engines if engine_keys is None else engine_keys[idx]
                skipped.note("bad_engine", listed, str(engine_text))
                continue
            key = keys.counters(engine_text) if hash_keys is None else hash_keys[idx]
            flat = self._readable(hashes[idx], key, skipped)
            live = reply_live
            if engine_shards:
                parts = [shard_live[at] for at in engine_shards[idx]]
                live = parts[0] if len(parts) == 1 else set().union(*parts)
            beat = float(score)
            owners = {
                w
                for name in flat[0::2]
                if name.__class__ is str
                and name.startswith(fields.CHUNK_PREFIX)
                and not name.endswith(fields.NAMES_SUFFIX)
                and (w := self._chunk_writer(name))
            }
            snap = EngineSnapshot(engine, beat / 1000.0, rule.age(beat), rule.engine_up(beat, owners, live))
            snap.conflict = conflicts.get(engine_text, ())
            engines[engine] = snap
            hashes_read.append(EngineHash(engine_text, snap, flat, key, live))
        return shell, hashes_read

    @staticmethod
    def _readable(part: Any, key: EngineKey, skipped: Skipped) -> list[Any]:
        """*part* (a key's contents) if it was read, else an empty list and the key counted."""
        why = unreadable(part)
        if why is None:
            return part  # type: ignore[no-any-return]
        skipped.note(why, key)
        return []

    def _writer_stats(self, key: str, flat: list[Any], skipped: Skipped) -> dict[str, str]:
        """A writer's stats hash (*flat*, as read from *key*, its ``w:<id>`` in the shard it was
        read from), its malformed fields dropped and counted (the self-metrics built from it must
        not fail a scrape)."""
        out: dict[str, str] = {}
        bounds: set[float] = set()
        for name, value in _pairs(flat):
            if name in _WRITER_TEXT_FIELDS or not isinstance(name, str):
                out[name] = value
                continue
            prefix = name[: name.find(":") + 1]
            if name not in _WRITER_NUMBER_FIELDS and prefix not in ("err:", "shards_err:", "drop:", "dur:"):
                out[name] = value  # unknown: a newer writer's field, read by nothing here
                continue
            if prefix == "dur:":
                bound = number_text(name[4:])
                if bound is None or float(bound) in bounds:
                    skipped.note("bad_field", key, name)
                    continue
                bounds.add(float(bound))
            text = number_text(value)
            if text is None or (prefix == "dur:" and float(text) < 0):
                skipped.note("bad_value", key, name)
                continue
            out[name] = text
        return out

    def decode(self, reply: list[Any]) -> Snapshot:
        """Build a snapshot from ``{now, engines, writers, version, meta, conflicts, hash per
        engine, stats per writer}``."""
        skipped = Skipped()
        try:
            shell, hashes = self.decode_shell(reply, skipped)
            for engine in hashes:
                self._decode_engine(engine, shell.catalog, skipped)
        finally:
            self.read_done()
        return shell

    def read_done(self) -> None:
        """A read's engines are all merged (or it failed): the chunk parses it did not reuse are
        dropped once no other read runs (the renderer calls this at the end of its read, as
        :meth:`decode` does)."""
        for kept in self._per_read:
            kept.end()

    def _conflicts(
        self,
        flat: list[Any],
        now_ms: float,
        window_ms: float,
        skipped: Skipped,
        keys: list[str] | None = None,
    ) -> dict[str, tuple[str, ...]]:
        """Engines claimed by two live owners within *window_ms* (the namespace's stale_after):
        engine -> (owner a, owner b).
        *keys*: the conflicts hash each pair of *flat* was read from (a merged reply's; default:
        shard 0's). An engine with an entry in two shards (K changed: its old shard and its new
        one) shows the newer."""
        out: dict[str, tuple[str, ...]] = {}
        seen_ms: dict[str, float] = {}
        for at, (engine, text) in enumerate(_pairs(flat)):
            parts = str(text).split("|")
            if len(parts) < 3 or number_text(parts[-1]) is None:
                skipped.note("bad_value", self.keys.conflicts if keys is None else keys[at], str(engine))
                continue
            ms = float(parts[-1])
            if now_ms - ms <= window_ms and ms >= seen_ms.get(engine, -_INF):
                out[engine] = tuple(parts[:-1])
                seen_ms[engine] = ms
        return out

    def _decode_engine(self, read: EngineHash, catalog: Catalog, skipped: Skipped) -> None:
        """One engine's series: counters and histograms added up over the writers' chunks and
        the base fields; gauges rolled up over the live writers (:attr:`EngineHash.live`) of an
        engine that is up."""
        snap, live = read.snapshot, read.live
        chunks = self.engine_chunks(read.engine, read.fields, catalog, skipped, read.key)
        groups = self.merge(read.engine, chunks, live, snap.up, numbers=True)
        if groups is not None:
            counters, histograms, gauges = snap.counters, snap.histograms, snap.gauges
            for group in groups:
                layout = group.layout
                keys = layout.keys
                for i, value in zip(layout.counters, group.counters):
                    counters[keys[i]] = value
                counts = group.counts
                for i, bounds, where, total in zip(
                    layout.histograms, layout.bounds, layout.count_slices, group.sums
                ):
                    histograms[keys[i]] = HistogramValue(bounds, tuple(counts[where]), total)
                for i, value in zip(layout.gauges, group.gauges):
                    if value is not None:
                        gauges[keys[i]] = value
            return
        self._decode_lines(snap, read.key, chunks, live, catalog, skipped)

    def _decode_lines(
        self,
        snap: EngineSnapshot,
        key: EngineKey,
        chunks: EngineChunks,
        live: set[str],
        catalog: Catalog,
        skipped: Skipped,
    ) -> None:
        """:meth:`_decode_engine` line by line: what is bad is skipped and counted (under *key*,
        the engine's hash)."""
        readings: dict[SeriesKey, tuple[str, list[tuple[float, float, str]]]] = {}
        counters, histograms = snap.counters, snap.histograms
        for name, raw, writer in chunks.entries():
            parsed = self.series_field(name, catalog)
            if isinstance(parsed, str):
                skipped.note(parsed, key, str(name), raw)
                continue
            spec, labels, _ = parsed
            series = (spec.name, labels)
            if spec.kind == COUNTER:
                text = number_text(raw)
                if text is None:
                    skipped.note("bad_value", key, name, raw)
                    continue
                counters[series] = counters.get(series, 0.0) + float(text)
            elif spec.kind == HISTOGRAM:
                hist = parse_histogram(spec, raw)
                if hist is None:
                    skipped.note("bad_value", key, name, raw)
                    continue
                before = histograms.get(series)
                histograms[series] = hist if before is None else before.plus(hist)
            elif writer is None:
                skipped.note("bad_field", key, name, raw)  # a gauge has no base field
            elif snap.up:
                if writer not in live:
                    continue  # not current: a stale, closed or removed writer's value
                value = gauge_parts(raw)
                if value is None:
                    skipped.note("bad_value", key, name, raw)
                    continue
                readings.setdefault(series, (spec.mode, []))[1].append(value)
        for series, (mode, found) in readings.items():
            snap.gauges[series] = roll_up(mode, found)[0]
