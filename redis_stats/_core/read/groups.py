"""One engine's hash, read: its writers' values added up into groups of numbers, the one decoded
form every view is made from (the snapshot, the collector's families, the ``/metrics`` text).

An engine's hash holds each writer's chunks (``@|<writer>|<k>``: values, one per line;
``@|<writer>|<k>|n``: their series fields) and base fields (departed writers' totals, folded in
by gc): docs/key-schema.md. The writers of one engine nearly always hold the same series in the
same order, so their chunks have the same names field, byte for byte; such chunks form a
**group**, read column by column: per writer, the group's counter and histogram lines are picked
out together (``operator.itemgetter``), checked and read as numbers by one pass of C (the JSON
scanner), and added up element by element (``map(add, a, b)``).

Data the bulk checks do not take (garbage, infinities, a series in two groups, base fields that
are not whole groups) sends the engine down the line-by-line path, :func:`by_lines`, which skips
and counts what is bad and yields **the same form**: one :class:`Group` over the series it kept.
Both read the texts by the codec's rules (:mod:`redis_stats.codec`), and add writers up in the same
order with the same ``+``, so both give the same numbers (``tests/unit/test_read_paths.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Sequence
from math import inf as _INF
from operator import add, itemgetter
from typing import Any, NamedTuple

from redis_stats import codec
from redis_stats._core.read.values import roll_up
from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM, Catalog, MetricSpec
from redis_stats.codec import (
    FLOAT_BOUND,
    NotClean,
    counter_column,
    counter_number,
    gauge_column,
    gauge_parts,
    histogram_column,
    histogram_numbers,
    number_text,
)
from redis_stats.snapshot import SeriesKey, Skipped

Parsed = tuple[MetricSpec, tuple[str, ...], str, int]
"""A series field's parse: (spec, label values, suffix: a histogram's bucket layout, how many of
its label values were replaced for being too long: :func:`short_label`)."""

KEPT_CHARACTERS = 64
"""A replaced label value keeps this many characters of the original."""

_Picker = Callable[[Sequence[Any]], tuple[Any, ...]]


def spec_bucket_tag(spec: MetricSpec) -> str:
    """The bucket tag a histogram's fields end with (see :func:`codec.bucket_tag`)."""
    return codec.bucket_tag((*spec.buckets, _INF))


def short_label(value: str, cap: int) -> str:
    """*value* if at most *cap* characters long, else its first :data:`KEPT_CHARACTERS`
    characters and ``...[sha1:<16 hex of the whole value>]`` (two long values stay apart)."""
    if len(value) <= cap:
        return value
    digest = hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{value[:KEPT_CHARACTERS]}...[sha1:{digest}]"


def _series_parts(name: Any, catalog: Catalog) -> tuple[MetricSpec, list[str]] | str:
    """The spec and decoded parts of a series field, or why it is skipped."""
    if name.__class__ is not str:
        return "bad_field"
    try:
        parts = codec.decode(name)
    except ValueError:
        return "bad_field"
    spec = catalog.get(parts[0])
    if spec is None:
        return "unknown_metric"
    if len(parts) != 1 + len(spec.labels) + (spec.kind == HISTOGRAM):
        return "bad_field"
    return spec, parts


def _capped(values: tuple[str, ...], cap: int) -> tuple[tuple[str, ...], int]:
    """*values* with those longer than *cap* characters replaced (0: no cap), and how many."""
    replaced = sum(len(v) > cap for v in values) if cap else 0
    if replaced:
        values = tuple(short_label(v, cap) for v in values)
    return values, replaced


def parse_field(
    name: Any, catalog: Catalog, tags: dict[tuple[float, ...], str], cap: int = 0
) -> Parsed | str:
    """(spec, label values, suffix, replaced) of a series field for *catalog*, or the reason it
    is skipped (*tags*: the bucket tags made so far, by buckets). Only a histogram's field has a
    suffix. With *cap*, a label value longer than *cap* characters is replaced
    (:func:`short_label`): one stored value of megabytes never reaches a view whole."""
    found = _series_parts(name, catalog)
    if isinstance(found, str):
        return found
    spec, parts = found
    suffix = ""
    if spec.kind == HISTOGRAM:
        suffix = tags.get(spec.buckets) or tags.setdefault(spec.buckets, spec_bucket_tag(spec))
        if parts[-1] != suffix:
            return "unknown_bucket"  # written with other bucket bounds than the catalogue's
    values, replaced = _capped(tuple(parts[1 : 1 + len(spec.labels)]), cap)
    return spec, values, suffix, replaced


def _picker(positions: Sequence[int]) -> _Picker:
    """A function picking *positions* out of a sequence, as a tuple (itemgetter, in C)."""
    if len(positions) > 1:
        return itemgetter(*positions)
    if positions:
        only = positions[0]
        return lambda seq: (seq[only],)
    return lambda seq: ()


def _series_of(
    parsed: Sequence[Parsed | str],
) -> tuple[tuple[MetricSpec | None, ...], tuple[SeriesKey | None, ...]]:
    """Each line's spec and series key (None for a line that is not a series)."""
    specs: list[MetricSpec | None] = []
    keys: list[SeriesKey | None] = []
    for p in parsed:
        spec, key = (None, None) if isinstance(p, str) else (p[0], (p[0].name, p[1]))
        specs.append(spec)
        keys.append(key)
    return tuple(specs), tuple(keys)


def _lines_by_kind(specs: Sequence[MetricSpec | None]) -> tuple[tuple[int, ...], ...]:
    """The lines of counters, of histograms and of gauges."""
    lines: dict[str, list[int]] = {COUNTER: [], HISTOGRAM: [], GAUGE: []}
    for i, spec in enumerate(specs):
        if spec is not None:
            lines[spec.kind].append(i)
    return tuple(lines[COUNTER]), tuple(lines[HISTOGRAM]), tuple(lines[GAUGE])


def _token_places(sizes: list[int]) -> tuple[list[int], tuple[slice, ...]]:
    """A group's histogram lines, joined by " ", are tokens: per series its sum, then its
    counts (*sizes*: how many per series). Where the sums are, and where each series' counts are."""
    sums: list[int] = []
    slices: list[slice] = []
    pos = 0
    for size in sizes:
        sums.append(pos)
        slices.append(slice(pos + 1, pos + 1 + size))
        pos += size + 1
    return sums, tuple(slices)


class Layout:
    """What one list of series fields (a names field) means for one catalogue: each line's
    series, and where the counters, histograms and gauges are, for reading a group's values
    column by column. Immutable (shared by concurrent reads and by every engine whose writers
    hold the same series)."""

    __slots__ = (
        "bars",
        "bounds",
        "catalog",
        "clean",
        "count_slices",
        "counters",
        "fields",
        "gauges",
        "histograms",
        "keys",
        "modes",
        "pick_counters",
        "pick_gauges",
        "pick_histograms",
        "pick_sums",
        "replaced",
        "spaces",
        "specs",
        "summed",
    )

    def __init__(self, catalog: Catalog, names: tuple[str, ...], parsed: Sequence[Parsed | str]) -> None:
        self.catalog = catalog
        self.fields = names
        # each line's spec, and its series as the snapshot keys it: (metric name, label values)
        self.specs, self.keys = _series_of(parsed)
        self.replaced = sum(p[3] for p in parsed if not isinstance(p, str))  # label values shortened
        specs = self.specs
        # Clean: every line is a series this catalogue shows, each once. Only such a layout is
        # read in bulk (a skipped line must be counted where the line-by-line path counts it).
        self.clean = len(set(names)) == len(names) and None not in specs
        self.counters, self.histograms, self.gauges = _lines_by_kind(specs)
        self.summed = tuple(sorted(self.counters + self.histograms))  # lines added up over writers
        self.modes = tuple(specs[i].mode for i in self.gauges)  # type: ignore[union-attr]
        self.bars = [1] * len(self.gauges)
        self.bounds = tuple((*specs[i].buckets, _INF) for i in self.histograms)  # type: ignore[union-attr]
        sizes = [len(b) for b in self.bounds]
        self.spaces = sizes  # a line "<sum> <c0> ... <cN>" has a space per count
        sums, self.count_slices = _token_places(sizes)
        self.pick_sums = _picker(sums)
        self.pick_counters = _picker(self.counters)
        self.pick_histograms = _picker(self.histograms)
        self.pick_gauges = _picker(self.gauges)


class ChunkRead(NamedTuple):
    """One writer's chunk of an engine, as read: its writer, the key it was read from (in its
    shard), what its names field means, and its values, one per line of the names."""

    writer: str
    key: str
    layout: Layout
    values: list[str]


class Base(NamedTuple):
    """A base field of an engine's hash (a departed writer's total, folded in by gc)."""

    field: Any
    value: Any
    key: str


class Group(NamedTuple):
    """Series of one engine, their writers added up: the decoded form.

    Indexed by the :class:`Layout`: ``counters`` (one per counter line; ints while every
    writer's value is an integer, then exact, else floats: *counter_ints*), histograms as
    ``sums`` (floats) and ``counts`` (the histogram tokens: series *j*'s cumulative counts are
    ``counts[layout.count_slices[j]]``; ints when *count_ints*), and ``gauges`` (one per gauge
    line: the roll-up over the live writers, or None when none is live)."""

    layout: Layout
    counters: Sequence[Any]
    counter_ints: bool
    sums: Sequence[float]
    counts: Sequence[Any]
    count_ints: bool
    gauges: Sequence[float | None]
    texts: tuple[Sequence[str], str] | None = None
    """A group one writer holds: its counter lines and its histogram lines (joined by spaces:
    the tokens) as stored, which are these numbers' sample texts, for the text to print as they
    are (formatting the numbers again cost a busy scrape ~9 % more instructions)."""


_VALUE = itemgetter(1)  # of a gauge reading (stamp, value, text)
_NO_GAUGE = codec.gauge_text(0, 0)


class Parse(NamedTuple):
    """One writer's chunk values, checked and converted in bulk."""

    counters: Sequence[Any]
    counter_ints: bool
    sums: list[float]
    counts: Sequence[Any]
    """The histogram tokens as JSON read them (each series' sum, then its cumulative counts)."""
    gauges: list[tuple[float, float, str]]
    texts: tuple[Sequence[str], str]
    """The counter lines' sample texts, and the histogram lines joined by spaces."""


def _histograms(layout: Layout, values: list[str]) -> tuple[list[float], Sequence[Any], str]:
    """A chunk's histogram lines as (sums, tokens, the lines joined) by the codec's column read;
    raises :class:`NotClean` where the line-by-line rules must decide (negative or non-integer
    counts, counts that go down, numbers beyond a float, garbage)."""
    numbers, joined = histogram_column(layout.pick_histograms(values), layout.spaces)
    try:
        sums = [*map(float, layout.pick_sums(numbers))]
    except OverflowError:  # a sum of 309+ digits read as an int: float() of its text is inf
        raise NotClean from None
    series = [*map(numbers.__getitem__, layout.count_slices)]  # a list per series
    if series != [*map(sorted, series)]:  # counts that go down (sorted() of a sorted list: one pass)
        raise NotClean
    total = sum(map(sum, series))  # counts are >= 0 here (no "-"): below the bound if the sum is
    if total.__class__ is not int or total >= FLOAT_BOUND:  # a count with "." or "e", or huge
        raise NotClean
    return sums, numbers, joined


def parse_chunk(layout: Layout, values: list[str]) -> Parse:
    """One writer's chunk of a clean *layout*, checked and converted in bulk; raises
    :class:`NotClean` where the line-by-line rules must decide."""
    counters, counter_ints, counter_texts = counter_column(layout.pick_counters(values))
    sums, counts, joined = _histograms(layout, values) if layout.histograms else ([], [], "")
    gauges = gauge_column(layout.pick_gauges(values), layout.bars) if layout.gauges else []
    return Parse(counters, counter_ints, sums, counts, gauges, (counter_texts, joined))


def _combine(layout: Layout, parses: list[Parse], live: list[Parse]) -> Group:
    """A group's writers' parses added up in order (``a + b``, element by element: what
    :func:`by_lines` does series by series), gauges rolled up over the *live* ones."""
    first = parses[0]
    counters, sums, counts = first.counters, first.sums, first.counts
    ints = first.counter_ints
    for p in parses[1:]:
        counters = [*map(add, counters, p.counters)]
        sums = [*map(add, sums, p.sums)]
        counts = [*map(add, counts, p.counts)]  # (the sums' places too: not read)
        ints = ints and p.counter_ints
    gauges: list[float | None] = [None] * len(layout.gauges)
    if len(live) == 1:
        gauges = [*map(_VALUE, live[0].gauges)]  # one reading each: roll_up gives it back
    elif live and layout.gauges:
        gauges = [*map(roll_up, layout.modes, zip(*[p.gauges for p in live]))]
    texts = first.texts if len(parses) == 1 else None
    return Group(layout, counters, ints, sums, counts, True, gauges, texts)


def in_bulk(chunks: list[ChunkRead], base: list[Base], live: Container[str], up: bool) -> list[Group] | None:
    """The engine's chunks added up group by group (the chunks of one names field, in order of
    first appearance), base fields first, or None when the engine must be read line by line
    (:func:`by_lines`): a layout that is not clean, a series in two groups, base fields that are
    not exactly the counters and histograms of some groups, or a value the bulk checks do not
    take. Gauges count only *live* writers of an engine that is *up*. The caller checks that
    no series is in two groups (:func:`disjoint`)."""
    by_layout: dict[Layout, tuple[list[Parse], list[Parse]]] = {}
    try:
        for chunk in chunks:
            layout = chunk.layout
            group = by_layout.get(layout)
            if group is None:
                if not layout.clean:
                    return None
                group = by_layout[layout] = ([], [])
            parse = parse_chunk(layout, chunk.values)
            group[0].append(parse)
            if up and chunk.writer in live:
                group[1].append(parse)
        if base and not _add_base(base, by_layout):
            return None
    except NotClean:
        return None
    groups = []
    for layout, (parses, live_parses) in by_layout.items():
        groups.append(_combine(layout, parses, live_parses))
    return groups


def disjoint(layouts: Sequence[Layout]) -> bool:
    """Whether no series field is in two of *layouts* (then each group is read on its own)."""
    seen: set[str] = set()
    for layout in layouts:
        seen.update(layout.fields)
    return len(seen) == sum(len(x.fields) for x in layouts)


def _base_values(base: list[Base]) -> dict[str, str] | None:
    """The base fields by series field, or None when one is not text or is there twice."""
    held: dict[str, str] = {}
    for name, raw, _ in base:
        if name.__class__ is not str or raw.__class__ is not str or name in held:
            return None
        held[name] = raw
    return held


def _add_base(base: list[Base], by_layout: dict[Layout, tuple[list[Parse], list[Parse]]]) -> bool:
    """Put the base fields first in the groups whose series they are, read as one more chunk
    per group; False when they are not exactly the counters and histograms of whole groups."""
    held = _base_values(base)
    if held is None:
        return False
    used = 0
    for layout, (parses, _) in by_layout.items():
        names = layout.fields
        found = [held.get(names[i]) for i in layout.summed]
        if None in found:
            if any(x is not None for x in found):
                return False  # a group partly in the base
            continue
        used += len(found)
        values = [_NO_GAUGE] * len(names)  # gauge lines: never read from the base (it has none)
        for i, raw in zip(layout.summed, found):
            if codec.LINES in raw:  # type: ignore[operator]
                return False  # a base value with a newline: not one line
            values[i] = raw  # type: ignore[assignment]
        parses.insert(0, parse_chunk(layout, values))
    return used == len(held)  # else a base field no group holds: a series of departed writers only


class _Series:
    """One series read line by line: its field, parse and values so far."""

    __slots__ = ("field", "parsed", "readings", "total")

    def __init__(self, field: str, parsed: Parsed) -> None:
        self.field = field
        self.parsed = parsed
        self.total: Any = None  # a counter's number, a histogram's [sum, counts]
        self.readings: list[tuple[float, float, str]] = []  # a gauge's live writers'

    def take(self, raw: Any, writer: str | None, current: bool) -> str | None:
        """Add one stored value (of *writer*; None: a base field) to the series: a counter's or
        a histogram's added up, a gauge's kept when *current* (a live writer's, of an engine that
        is up). The reason it is skipped, or None."""
        spec = self.parsed[0]
        if spec.kind not in (COUNTER, HISTOGRAM):
            if writer is None:
                return "bad_field"  # a gauge has no base field
            reading = gauge_parts(raw) if current else None  # else not current: not shown
            if current and reading is None:
                return "bad_value"
            if reading is not None:
                self.readings.append(reading)
            return None
        value = _value(spec, raw)
        if value is None:
            return "bad_value"
        total = self.total
        if total is None:
            self.total = value
        elif spec.kind == COUNTER:
            self.total = total + value
        else:
            self.total = (total[0] + value[0], [*map(add, total[1], value[1])])
        return None


def _entries(chunks: list[ChunkRead], base: list[Base]) -> list[tuple[Any, Any, str | None, str]]:
    """Every value of the engine as ``(series field, value, writer, key)``: base fields (writer
    None) first, then every line of every chunk."""
    out: list[tuple[Any, Any, str | None, str]] = [(b.field, b.value, None, b.key) for b in base]
    for c in chunks:
        out += zip(c.layout.fields, c.values, [c.writer] * len(c.values), [c.key] * len(c.values))
    return out


def _value(spec: MetricSpec, raw: Any) -> Any:
    """A counter's or a histogram's stored value as a number (histogram: ``(sum, counts)``),
    or None when it is not one: the rule of :mod:`redis_stats._core.read.values`."""
    if spec.kind == COUNTER:
        return counter_number(number_text(raw))
    found = histogram_numbers(raw, len(spec.buckets) + 1)
    return None if found is None else (float(found[0]), found[2])


def by_lines(
    chunks: list[ChunkRead],
    base: list[Base],
    live: Container[str],
    up: bool,
    catalog: Catalog,
    skipped: Skipped,
    tags: dict[tuple[float, ...], str],
    cap: int = 0,
) -> list[Group]:
    """The engine line by line (what :func:`in_bulk` does not take): what is bad is skipped and
    counted under the key it was read from; what is kept comes as one :class:`Group`, in the
    order the writers' chunks hold the series, then series only the base fields hold. Values
    are added up base first, then chunk by chunk, as :func:`in_bulk` adds them."""
    found: dict[SeriesKey, _Series] = {}
    chunk_order: dict[SeriesKey, None] = {}
    for name, raw, writer, key in _entries(chunks, base):
        parsed = parse_field(name, catalog, tags, cap)
        if isinstance(parsed, str):
            skipped.note(parsed, key, str(name))
            continue
        series_key = (parsed[0].name, parsed[1])
        series = found.get(series_key)
        if series is None:
            series = found[series_key] = _Series(name, parsed)
        if writer is not None:
            chunk_order[series_key] = None
        why = series.take(raw, writer, up and writer in live)
        if why is not None:
            skipped.note(why, key, name)
    order = [*chunk_order, *(k for k in found if k not in chunk_order)]
    return _one_group([found[k] for k in order], catalog)


def _one_group(series: list[_Series], catalog: Catalog) -> list[Group]:
    """The series :func:`by_lines` kept, as one :class:`Group` (none if it kept none)."""
    kept = [s for s in series if s.total is not None or s.readings]  # a value left of what was read
    if not kept:
        return []
    layout = Layout(catalog, tuple(s.field for s in kept), [s.parsed for s in kept])
    counters = [kept[i].total for i in layout.counters]
    sums, counts, count_ints = _tokens([kept[i].total for i in layout.histograms])
    gauges: list[float | None] = [roll_up(m, kept[i].readings) for i, m in zip(layout.gauges, layout.modes)]
    return [Group(layout, counters, _all_ints(counters), sums, counts, count_ints, gauges)]


def _all_ints(values: Sequence[Any]) -> bool:
    return all(v.__class__ is int for v in values)


def _tokens(histograms: list[tuple[float, list[Any]]]) -> tuple[list[float], list[Any], bool]:
    """Histograms' ``(sum, counts)`` as a group holds them: the sums, the tokens (each series'
    sum, then its counts, as the bulk read's) and whether every count is an int."""
    sums: list[float] = []
    tokens: list[Any] = []
    ints = True
    for total, counts in histograms:
        sums.append(total)
        tokens += (total, *counts)
        ints = ints and all(c.__class__ is int for c in counts)
    return sums, tokens, ints
