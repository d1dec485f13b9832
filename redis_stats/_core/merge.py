"""One engine's hash, read: its writers' chunks grouped, and added up in bulk (schema 2).

Both render paths (the snapshot decoder and the text renderer) are fed from here, through
:meth:`~redis_stats._core.snapshot.SnapshotDecoder.engine_chunks` and
:meth:`~redis_stats._core.snapshot.SnapshotDecoder.merge`.

A reader adds every writer's values of a series up (docs/key-schema.md). Done series by series
(parse each writer's line, add, format) that cost reads with two API servers per engine ~1.8x
what schema 1 cost. But the writers of one engine nearly always hold the same series in the same
order (two API servers of one engine record the same series set), so their chunks have the same
names field, byte for byte. Such chunks form a **group**, read column by column: per writer, the
group's counter lines and histogram lines are picked out together (``operator.itemgetter``),
joined once, checked and read as numbers by one pass of C each (the JSON scanner: a group's
histogram lines are numbers separated by spaces, so with commas for spaces and brackets around
them they are a JSON list), and added up element by element (``map(add, a, b)``); the
per-series Python work left is building what is printed.

What a names field means for a catalogue is parsed once and kept (:class:`Layout`, keyed by the
names field's text: it changes only when a writer adds a series, and engines serving one model
share it), and so is each chunk's values (:class:`Parse`, kept with the chunk's text: an idle
writer's chunk is not parsed again; :class:`Kept` holds exactly the last read's parses). Base
fields (what gc folded in) that are exactly the counters and histograms of whole groups are read
as one more chunk of their group, added first.
The bulk path takes only clean data: a group whose layout has a field it cannot show, a series
in two groups, other base fields, or a value the bulk checks do not pass sends the whole engine
down the line-by-line path (the same rules, :mod:`redis_stats._core.values`), which skips and
counts what is bad. So both ways give the same output for any data (``tests/reader/test_read_cost.py``);
the bulk one is only faster where the data is clean.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Container, Sequence
from json import JSONDecoder
from json.scanner import make_scanner
from math import isnan
from operator import add, itemgetter, methodcaller
from typing import Any, NamedTuple

from redis_stats._core.values import (
    MAX_DIGITS,
    NUMBER_CHARS,
    go_floats,
    number_text,
    roll_up,
    sum_counter_texts,
)
from redis_stats.catalog import COUNTER, HISTOGRAM, MetricSpec

__all__ = [
    "Chunk",
    "EngineChunks",
    "Generations",
    "Group",
    "Kept",
    "Layout",
    "Parse",
    "Parsed",
    "merge_groups",
    "parse_chunk",
]

Parsed = tuple[MetricSpec, tuple[str, ...], str]
"""A series field's parse: (spec, label values, suffix: a histogram's bucket layout)."""

_INF = float("inf")
_Picker = Callable[[Sequence[Any]], tuple[Any, ...]]


def _picker(positions: Sequence[int]) -> _Picker:
    """A function picking *positions* out of a sequence, as a tuple (itemgetter, in C)."""
    if len(positions) > 1:
        return itemgetter(*positions)
    if positions:
        only = positions[0]
        return lambda seq: (seq[only],)
    return lambda seq: ()


class Chunk(NamedTuple):
    """One writer's chunk of an engine, as read: its names field (the text), what that means
    (its :class:`Layout`: the series fields, parsed), and the values, one per series (a chunk
    whose lines do not match its names is skipped before it becomes one)."""

    writer: str
    field: str
    """The chunk's values field (``@|<writer>|<k>``)."""
    names: str
    layout: Layout
    text: str
    """The values field's text."""
    values: list[str]


class EngineChunks(NamedTuple):
    """One engine's hash, sorted: base fields ``(series field, value, None)`` (departed writers,
    folded in by gc) and the writers' well-formed chunks, in the order Redis returned them."""

    base: list[tuple[Any, Any, None]]
    chunks: list[Chunk]

    def entries(self) -> list[tuple[Any, Any, Any]]:
        """Every value of the engine as ``(series field, value, writer)``: base fields (writer
        None), then every line of every chunk. The line-by-line path reads these."""
        out: list[tuple[Any, Any, Any]] = list(self.base)
        for chunk in self.chunks:
            out += zip(chunk.layout.fields, chunk.values, [chunk.writer] * len(chunk.values))
        return out


class Layout:
    """What one names field means for one catalogue: each line's parse, and where the counters,
    histograms and gauges are, for reading a group's values column by column. Immutable (shared
    by concurrent reads and by every engine whose writers hold the same series)."""

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
        "spaces",
        "summed",
    )

    def __init__(self, catalog: object, names: tuple[str, ...], parsed: tuple[Parsed | str, ...]) -> None:
        self.catalog = catalog
        self.fields = names
        # each line's series as the snapshot keys it: (metric name, label values)
        self.keys: tuple[Any, ...] = tuple(None if isinstance(p, str) else (p[0].name, p[1]) for p in parsed)
        # Clean: every line is a series this catalogue shows, each once. Only such a layout is
        # read in bulk (a skipped line must be counted where the line-by-line path counts it).
        self.clean = len(set(names)) == len(names) and not any(p.__class__ is str for p in parsed)
        counters: list[int] = []
        histograms: list[int] = []
        gauges: list[int] = []
        for i, p in enumerate(parsed):
            if p.__class__ is str:
                continue
            kind = p[0].kind  # type: ignore[union-attr]
            (counters if kind == COUNTER else histograms if kind == HISTOGRAM else gauges).append(i)
        specs: list[MetricSpec] = [p[0] for p in parsed if p.__class__ is not str]  # type: ignore[misc]
        spec_of = dict(zip([i for i, p in enumerate(parsed) if p.__class__ is not str], specs))
        self.counters = tuple(counters)
        self.histograms = tuple(histograms)
        self.gauges = tuple(gauges)
        self.summed = tuple(sorted(counters + histograms))  # lines added up over writers
        self.modes = tuple(spec_of[i].mode for i in gauges)
        self.bars = [1] * len(gauges)
        self.bounds = tuple((*spec_of[i].buckets, _INF) for i in histograms)
        sizes = [len(b) for b in self.bounds]
        self.spaces = sizes  # a line "<sum> <c0> ... <cN>" has a space per count
        # A group's histogram lines, joined by " ", are tokens: per series its sum, then its
        # counts. Where the sums are, and where each series' counts are (they must not go down).
        sums: list[int] = []
        slices: list[slice] = []
        pos = 0
        for size in sizes:
            sums.append(pos)
            slices.append(slice(pos + 1, pos + 1 + size))
            pos += size + 1
        self.count_slices = tuple(slices)
        self.pick_sums = _picker(sums)
        self.pick_counters = _picker(counters)
        self.pick_histograms = _picker(histograms)
        self.pick_gauges = _picker(gauges)


class Group(NamedTuple):
    """The values of chunks sharing one layout, added up: ``counters`` (one per counter line of
    the layout), histograms as ``sums`` and ``counts`` (indexed like the histogram tokens:
    series *j*'s counts are ``counts[layout.count_slices[j]]``; what lies at the sums' places
    is not a count), and ``gauges`` (one per gauge line, rolled up over the live writers; None
    when none is live). As sample text (integer counters and counts several writers added up
    may be ints: ``str()`` of them is their text, as the template's ``%s`` and the f-string
    print them) or as numbers (floats, as the snapshot holds them), as asked."""

    layout: Layout
    counters: Sequence[Any]
    sums: Sequence[Any]
    counts: Sequence[Any]
    gauges: Sequence[Any]


class _NotClean(Exception):
    """A value the bulk path does not take: the engine is read line by line instead."""


_spaces = methodcaller("count", " ")
_bars = methodcaller("count", "|")
_HISTOGRAM_CHARS = b"0123456789.+eE "
# Below it, float() of an int the scanner made (the snapshot's numbers) is float() of its text,
# the line-by-line read's. From 2**1024 on, float() of an int raises (OverflowError) where float()
# of the text gives inf: such counts and sums go line by line, such counters are read as text.
_FLOAT_BOUND = 10**308
# The C scanner: (value, end) from a string and an index.
_scan_json: Callable[[str, int], tuple[Any, int]] = make_scanner(JSONDecoder())  # type: ignore[arg-type]


def _all_digits(texts: tuple[str, ...]) -> bool:
    joined = "".join(texts)
    return (
        joined.isdigit()
        and joined.isascii()
        and all(texts)
        and (len(joined) <= MAX_DIGITS or max(map(len, texts)) <= MAX_DIGITS)
    )


class Parse(NamedTuple):
    """One writer's chunk values, checked and converted, for both render paths (immutable: kept
    by the chunk's text, so an unchanged chunk, an idle writer's, is not parsed again). Texts
    are kept joined in one string each; numbers as the lists JSON read them into: packing the
    counts into an ``array`` saved ~2.6 KB a chunk (5.6 KB against 8.2 KB, counts past 256) but
    cost ~6 % of the instructions of a busy fleet's read."""

    counter_texts: str
    """The counters' sample texts, joined by newlines."""
    counter_digits: bool
    """Whether every counter is an integer (as writers store them)."""
    counter_ints: Sequence[int] | None
    """The counters as ints, when every one is an integer written as Python writes it (no
    leading zero) and below 10**308 (a float's range): what adding writers' counters up needs."""
    histogram_tokens: str
    """The histogram lines joined by spaces: per series its sum text, then its count texts."""
    sums: list[float]
    counts: Sequence[Any]
    """The histogram tokens as numbers (each series' sum, then its cumulative counts: series
    *j*'s counts are ``counts[layout.count_slices[j]]``), as JSON read them: one list, not
    picked apart or packed, as every copy costs a busy fleet's reads (issue 15)."""
    gauges: list[tuple[float, float, str]]
    """Each gauge line as ``(stamp, value, value text)``."""


def parse_chunk(layout: Layout, values: list[str]) -> Parse:
    """One writer's chunk of a clean *layout*, checked and converted in bulk; raises
    :class:`_NotClean` where the line-by-line rules must decide (garbage, infinities, negative
    numbers, histogram numbers beyond a float)."""
    counters = layout.pick_counters(values)
    counter_digits = _all_digits(counters) or not counters
    if not counter_digits:
        checked = [number_text(raw) for raw in counters]
        if None in checked:
            raise _NotClean
        counters = tuple(checked)
    counter_ints: Sequence[int] | None = None
    if counter_digits:
        try:
            counter_ints = _scan_json("[" + ",".join(counters) + "]", 0)[0]
        except (ValueError, StopIteration):  # "007": read as text, as the line-by-line read does
            pass
        else:
            if counter_ints and max(counter_ints) >= _FLOAT_BOUND:  # read as text (inf as a float)
                counter_ints = None
    joined = ""
    sums: list[float] = []
    counts: Sequence[Any] = ()
    if layout.histograms:
        lines = layout.pick_histograms(values)
        if [*map(_spaces, lines)] != layout.spaces:  # each line its own number of parts
            raise _NotClean
        joined = " ".join(lines)
        # Only digits, ".", "e", "E", "+" (no "-": a negative sum, rare, or "-0" as a count;
        # no letters: NaN, infinities, JSON's true/null/strings): what JSON then reads as
        # numbers exactly as int() and float() read them, or refuses ("007", "1e", "+1").
        if not joined.isascii() or joined.encode().translate(None, _HISTOGRAM_CHARS):
            raise _NotClean  # (deleting the allowed bytes: ~20x faster than str.strip)
        try:
            # One pass of C over the whole group of lines: ~2x faster than map(int) on the
            # split tokens, the largest cost of reading a busy fleet (issue 15).
            numbers = _scan_json("[" + joined.replace(" ", ",") + "]", 0)[0]
        except (ValueError, StopIteration):  # "", "1e", "007", a count over 4,300 digits
            raise _NotClean from None
        try:
            sums = [*map(float, layout.pick_sums(numbers))]
        except OverflowError:  # a sum of 309+ digits read as an int: float() of its text is inf
            raise _NotClean from None
        series = [*map(numbers.__getitem__, layout.count_slices)]  # a list per series
        if series != [*map(sorted, series)]:  # (sorted() of a sorted list is one pass of C)
            raise _NotClean  # counts that go down
        total = sum(map(sum, series))  # counts are >= 0 here (no "-"): below the bound if the sum is
        if total.__class__ is not int or total >= _FLOAT_BOUND:  # a count with "." or "e", or huge
            raise _NotClean
        counts = numbers
    gauges: list[tuple[float, float, str]] = []
    if layout.gauges:
        lines = layout.pick_gauges(values)
        if [*map(_bars, lines)] != layout.bars:  # each line one "|": "<stamp>|<value>"
            raise _NotClean
        parts = "|".join(lines).split("|")
        value_texts = parts[1::2]
        if "".join(value_texts).strip(NUMBER_CHARS):  # an infinity or garbage: the line-by-line rules
            raise _NotClean
        try:
            stamps = [*map(float, parts[0::2])]
            gauge_values = [*map(float, value_texts)]
        except ValueError:
            raise _NotClean from None
        if any(map(isnan, stamps)):
            raise _NotClean
        gauges = [*zip(stamps, gauge_values, value_texts)]
    return Parse("\n".join(counters), counter_digits, counter_ints, joined, sums, counts, gauges)


def _combine(layout: Layout, parses: list[Parse], live: list[Parse], numbers: bool) -> Group:
    """A group's writers' parses (all of them, and those of *live* writers for the gauges)
    added up, in the order each render path adds them line by line: as sample text, or with
    *numbers* as floats."""
    first = parses[0]
    gauges: list[Any] = [None] * len(layout.gauges)
    if live and layout.gauges:
        rolled: list[tuple[int, float]] = []  # (line, value) of roll-ups still to format
        for i, (mode, readings) in enumerate(zip(layout.modes, zip(*[p.gauges for p in live]))):
            value, text = roll_up(mode, readings)
            if not numbers and text is None:
                rolled.append((i, value))
            gauges[i] = value if numbers else text
        for (i, _), text in zip(rolled, go_floats([value for _, value in rolled])):
            gauges[i] = text
    n = len(layout.counters)
    if numbers:
        counters: Sequence[Any] = [0.0] * n  # as the decoder: 0.0 + each writer's, in order
        for p in parses:
            if n:
                found = p.counter_texts.split("\n") if p.counter_ints is None else p.counter_ints
                counters = [*map(add, counters, map(float, found))]
        sums, counts = first.sums, [*map(float, first.counts)]  # as HistogramValue.plus: a + b + ...
        for p in parses[1:]:
            sums = [*map(add, sums, p.sums)]
            counts = [*map(add, counts, map(float, p.counts))]
        return Group(layout, counters, sums, counts, gauges)
    if len(parses) == 1:
        # One writer: its texts as they are stored (the line-by-line read prints them so).
        tokens = first.histogram_tokens.split(" ")
        return Group(
            layout,
            first.counter_texts.split("\n") if n else (),
            layout.pick_sums(tokens) if layout.histograms else (),
            tokens,
            gauges,
        )
    if not n:
        counters = ()
    elif all(p.counter_ints is not None for p in parses):  # ints: exact (printed by the f-string)
        total: Any = first.counter_ints
        for p in parses[1:]:
            total = map(add, total, p.counter_ints)  # type: ignore[arg-type]
        counters = [*total]
    elif all(p.counter_digits for p in parses):  # integers, as writers store them: exact
        total = map(int, first.counter_texts.split("\n"))
        for p in parses[1:]:
            total = map(add, total, map(int, p.counter_texts.split("\n")))
        counters = [*map(str, total)]
    else:
        counters = [
            sum_counter_texts(column) for column in zip(*[p.counter_texts.split("\n") for p in parses])
        ]
    sum_total: list[float] = [0.0] * len(layout.histograms)  # as the text renderer adds them
    count_total: Any = first.counts
    for p in parses:
        sum_total = [*map(add, sum_total, p.sums)]
    for p in parses[1:]:
        count_total = map(add, count_total, p.counts)  # (the sums' places too: not read)
    # Counts as ints: the template's "%s" formats them, with no list of strings in between.
    return Group(layout, counters, go_floats(sum_total), [*count_total], gauges)


# Chunk parses one reader keeps at most: 20,000 engines x 2 writers. A vLLM engine's chunk parse
# takes ~8 KB once its counts are past 256 (an int object each), ~10 KB with the chunk's text, so
# ~400 MB at the ceiling. Past it a read parses the rest again each time instead of keeping them.
KEPT_CEILING = 40_000


# Reads that may begin while others run and share their generation (see Generations.begin): past
# it the next read begins a new one anyway, so reads that never stop overlapping (scrapers that
# outrun the read) still drop what no read uses any more.
JOIN_LIMIT = 8


class Generations:
    """What reads keep for the next read: exactly what the last read used, as ``now`` (a dict
    filled during a read) and ``last`` (what the reads before it used, looked up while ``now``
    lacks it).

    A read calls :meth:`begin`, then :meth:`end` when done. Reads that run at once (threads:
    a Prometheus HA pair, ``/metrics`` and ``/snapshot``) share one generation: each finds what
    the others stored, and what the read before them used stays until the last of them ends.
    (Each read making a generation of its own lost the one before it to the second read's
    begin and the other read's end: both parsed again what they would have found.) Entries are
    immutable, one dict store each: safe to share between threads. In a forked child, the reads
    the parent was running do not exist: the child's first read begins a generation.
    """

    __slots__ = ("joined", "last", "lock", "now", "pid", "reads")

    def __init__(self) -> None:
        self.last: dict[Any, Any] = {}
        self.now: dict[Any, Any] = {}
        self.reads = 0  # reads begun and not ended
        self.joined = 0  # reads that began while another ran, in this generation
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def _lock(self) -> threading.Lock:
        if self.pid != os.getpid():  # a forked child: no read runs here (the lock may be held)
            self.lock, self.reads, self.joined, self.pid = threading.Lock(), 0, 0, os.getpid()
        return self.lock

    def begin(self) -> None:
        """A read starts: alone, what the previous reads used is what it may reuse; while other
        reads run, it shares their generation."""
        with self._lock():
            if self.reads and self.joined < JOIN_LIMIT:
                self.joined += 1
            else:
                self.last, self.now = self.now, {}
                self.joined = 0
            self.reads += 1

    def end(self) -> None:
        """A read is done: once no other read runs, what the reads did not reuse (changed or
        gone) is dropped now, not held until the next read."""
        with self._lock():
            if self.reads:
                self.reads -= 1
            if not self.reads:
                self.last = {}

    def get(self, key: Any) -> Any:
        """The entry of *key* the reads so far made (None if none), kept for the next read."""
        now = self.now
        found = now.get(key)
        if found is None:
            found = self.last.get(key)
            if found is not None:
                now[key] = found
        return found

    def __len__(self) -> int:
        return len(self.now)


class Kept(Generations):
    """The parses of the chunks of the last read, to reuse while a chunk's text is unchanged.

    Keyed by (engine, chunk field, layout), each with the chunk's text. Each read keeps exactly
    the parses it used, so the cache follows the namespace's size with no stale entries, up to
    :data:`KEPT_CEILING`. An entry is used only when its text is the chunk's.
    """

    __slots__ = ()


def _kept_parse(
    kept: Kept,
    slot: Any,
    layout: Layout,
    text: str,
    values: list[str],
) -> Parse:
    now = kept.now
    found: tuple[str, Parse] | None = now.get(slot) or kept.last.get(slot)
    if found is not None and found[0] == text:
        if len(now) < KEPT_CEILING:
            now[slot] = found
        return found[1]
    parse = parse_chunk(layout, values)
    if len(now) < KEPT_CEILING:
        now[slot] = (text, parse)  # one store of an immutable pair: thread-safe
    return parse


def merge_groups(
    engine: str,
    chunks: EngineChunks,
    disjoint: bool,
    live: Container[str],
    up: bool,
    numbers: bool,
    kept: Kept,
) -> list[Group] | None:
    """The engine's chunks added up group by group (the chunks of one names field, in order of
    first appearance), or None when the engine must be read line by line: a layout that is not
    clean, a series in two groups (*disjoint* False), base fields that are not exactly the
    counters and histograms of some groups, or a value the bulk checks do not take. Base
    fields are added first, as the line-by-line read adds them. Gauges count only *live*
    writers of an engine that is *up*. *kept*: the parses of the last read (by engine and
    chunk field; both paths share it) with their text, reused while the text is the same."""
    if not disjoint:
        return None
    by_names: dict[str, tuple[Layout, list[Parse], list[Parse]]] = {}
    try:
        for chunk in chunks.chunks:
            group = by_names.get(chunk.names)
            if group is None:
                if not chunk.layout.clean:
                    return None
                group = by_names[chunk.names] = (chunk.layout, [], [])
            slot = (engine, chunk.field, chunk.layout)
            parse = _kept_parse(kept, slot, chunk.layout, chunk.text, chunk.values)
            group[1].append(parse)
            if up and chunk.writer in live:
                group[2].append(parse)
        if chunks.base and not _add_base(engine, chunks.base, by_names, kept):
            return None
    except _NotClean:
        return None
    return [
        _combine(layout, parses, live_parses, numbers) for layout, parses, live_parses in by_names.values()
    ]


def _add_base(
    engine: str,
    flat: list[tuple[Any, Any, None]],
    by_names: dict[str, tuple[Layout, list[Parse], list[Parse]]],
    kept: Kept,
) -> bool:
    """Put the base fields (departed writers' totals, folded in by gc) first in the groups
    whose series they are, read as one more chunk per group; False when they are not exactly
    the counters and histograms of whole groups (then the engine is read line by line)."""
    base: dict[str, str] = {}
    for name, raw, _ in flat:
        if name.__class__ is not str or raw.__class__ is not str or name in base:
            return False
        base[name] = raw
    used = 0
    for layout, parses, _ in by_names.values():
        fields = layout.fields
        found = [base.get(fields[i]) for i in layout.summed]
        if None in found:
            if any(x is not None for x in found):
                return False  # a group partly in the base
            continue
        used += len(found)
        values = ["0|0"] * len(fields)  # gauge lines: never read from the base (it has none)
        for i, raw in zip(layout.summed, found):
            values[i] = raw  # type: ignore[assignment]
        text = "\n".join(values)
        if text.count("\n") != len(values) - 1:
            return False  # a base value with a newline: not one line
        parses.insert(0, _kept_parse(kept, (engine, "", layout), layout, text, values))
    return used == len(base)  # else a base field no group holds: a series of departed writers only
