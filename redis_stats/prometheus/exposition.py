"""TextRenderer: the decoded form of a read (:class:`~redis_stats._core.read.decoder.Decoded`) as
Prometheus text, for the exporter's ``/metrics``.

prometheus_client's ``generate_latest`` builds a Python object per sample and formats every
label on every scrape: about 10 us per sample, so 80 ms for 64 engines of the vLLM catalogue.
Between two scrapes nothing but the numbers changes, so this formatter keeps the text around the
numbers and, per scrape, only joins: each group of the read gives its numbers' sample texts
(:func:`sample_texts`: a list, in its layout's order), the read's lists are put end to end, an
``itemgetter`` picks them in the order of the text, one slice assignment puts them in the holes
of a copy of the kept text, and one ``str.join`` makes the body: each step one call of C over
the whole read. No number or label value is ever put through a format string: a label
value is text the kept heads hold as they are (with the text format's escapes), whatever it holds.

What it keeps depends only on the catalogue (one :class:`_Plan` per catalogue, swapped whole when
it changes), on the names fields the engines hold and on which gauges have a value: per (engine,
names field, gauges shown) each line's head and tail (:class:`_Piece`: a histogram's buckets
share one head, and take their tails from one string per bound), and for the last read's
sequence of those, the read's text with its holes and their places. What a read did not use is
dropped when it ends (an engine gc removed, a names field no writer holds any more). Concurrent
scrapes share it: every entry is immutable, one dict store each, and every per-scrape list is a
local.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from prometheus_client.utils import floatToGoString

from redis_stats._core.read.decoder import Decoded
from redis_stats._core.read.groups import Group, Layout
from redis_stats._core.read.values import go_floats
from redis_stats.catalog import COUNTER, ENGINE_LABEL, Catalog, MetricSpec

__all__ = [
    "TextRenderer",
    "escape_label_value",
    "format_families",
    "label_pairs",
    "merge_texts",
    "sample_texts",
]

_INF = math.inf
_READ_PLANS = 1  # reads' plans kept: the last read's (each one is as large as the read's text)


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it (backslash, double quote, newline escaped)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _header(spec: MetricSpec) -> str:
    """A family's HELP and TYPE lines, without the last newline (each sample line starts with
    one, and the family ends with one). As prometheus_client: a counter's name ends in _total."""
    name = spec.name + "_total" if spec.kind == COUNTER else spec.name
    return "# HELP " + name + " " + _escape_help(spec.help) + "\n# TYPE " + name + " " + spec.kind


def _labels(leading: str, engine: str, spec: MetricSpec, values: tuple[str, ...]) -> str:
    pairs = [leading] if leading else []
    pairs.append(ENGINE_LABEL + '="' + escape_label_value(engine) + '"')
    pairs += [n + '="' + escape_label_value(v) + '"' for n, v in zip(spec.labels, values)]
    return ",".join(pairs)


def _number_text(value: Any) -> str:
    """A counter's or a count's sample text: an int as it is (exact), a float as Go writes it."""
    return str(value) if value.__class__ is int else str(floatToGoString(value))


def sample_texts(group: Group, out: list[str]) -> tuple[int, ...] | None:
    """Put on *out* what a group prints, in its layout's order: its counters' texts, its
    histogram tokens' (each series' sum, then its cumulative counts), its histogram sums', then
    its gauges' that have a value; and say which gauges those are (None: all). A group one
    writer holds prints its stored texts; else an int as it is (exact), a float as Go writes it."""
    layout = group.layout
    if group.texts is not None:
        out += group.texts[0]
        if layout.histograms:
            tokens = group.texts[1].split(" ")
            out += tokens
            out += layout.pick_sums(tokens)
    else:
        out += map(str, group.counters) if group.counter_ints else map(_number_text, group.counters)
        if layout.histograms:
            out += map(str, group.counts) if group.count_ints else map(_number_text, group.counts)
            out += go_floats([*group.sums])
    gauges = group.gauges
    if None in gauges:
        shown = tuple(i for i, v in enumerate(gauges) if v is not None)
        out += go_floats([gauges[i] for i in shown])  # type: ignore[misc]
        return shown
    out += go_floats([*gauges])  # type: ignore[list-item]
    return None


def _line(layout: Layout, i: int) -> tuple[MetricSpec, tuple[str, ...]]:
    """The spec and label values of line *i* of *layout* (a group's lines are all series)."""
    spec, key = layout.specs[i], layout.keys[i]
    if spec is None or key is None:
        raise ValueError(f"line {i} of a group's layout is not a series")  # (never: groups are clean)
    return spec, key[1]


_CLOSE = "} "  # the tail of every line but a bucket's: the label set closed, then the number


@functools.lru_cache(maxsize=4096)
def _le_tail(bound: float) -> str:
    """A bucket line's tail, the same object for every series of that bound (a histogram's
    twenty-odd lines share their head and take their tails from here: no string per line)."""
    return ',le="' + str(floatToGoString(bound)) + '"} '


class _Piece:
    """The lines of one group (of one engine, one layout, these gauges shown): per family, each
    of its lines' head (``"\\n<name>{<labels>"``) and tail (``"} "``, a bucket's
    ``',le="<bound>"} '``), flat, and where its number is in the group's :func:`sample_texts`."""

    __slots__ = ("families", "size")

    def __init__(
        self, index: dict[str, int], leading: str, engine: str, layout: Layout, shown: tuple[int, ...] | None
    ) -> None:
        lines: dict[int, tuple[list[str], list[int]]] = {}

        def add(spec: MetricSpec, head: str, tail: str, at: int) -> None:
            parts, places = lines.setdefault(index[spec.name], ([], []))
            parts += (head, tail)
            places.append(at)

        n_counters, n_tokens = len(layout.counters), sum(layout.spaces) + len(layout.histograms)
        for at, i in enumerate(layout.counters):
            spec, values = _line(layout, i)
            add(spec, "\n" + spec.name + "_total{" + _labels(leading, engine, spec, values), _CLOSE, at)
        for k, (i, where) in enumerate(zip(layout.histograms, layout.count_slices)):
            spec, values = _line(layout, i)
            labels = _labels(leading, engine, spec, values)
            head = "\n" + spec.name + "_bucket{" + labels  # one string for all the series' buckets
            for bound, at in zip((*spec.buckets, _INF), range(where.start, where.stop)):
                add(spec, head, _le_tail(bound), n_counters + at)
            add(spec, "\n" + spec.name + "_count{" + labels, _CLOSE, n_counters + where.stop - 1)
            add(spec, "\n" + spec.name + "_sum{" + labels, _CLOSE, n_counters + n_tokens + k)
        first = n_counters + n_tokens + len(layout.histograms)
        gauges = layout.gauges if shown is None else [layout.gauges[j] for j in shown]
        for at, i in enumerate(gauges, first):
            spec, values = _line(layout, i)
            add(spec, "\n" + spec.name + "{" + _labels(leading, engine, spec, values), _CLOSE, at)
        self.families = tuple((f, tuple(p), tuple(a)) for f, (p, a) in lines.items())
        self.size = first + len(gauges)


def _picker(places: Sequence[int]) -> Any:
    """A function picking *places* out of a list, as a tuple (itemgetter, in C)."""
    if len(places) > 1:
        return itemgetter(*places)
    if places:
        only = places[0]
        return lambda seq: (seq[only],)
    return lambda seq: ()


class _Plan:
    """What the renderer knows for one catalogue: each family's header, the pieces of the
    groups it rendered, and per read (its sequence of pieces) the read's text with a hole for
    each number, and the picker of the numbers out of the read's sample texts. Holds no
    per-scrape state (see the module docstring)."""

    __slots__ = ("catalog", "headers", "index", "leading", "pieces", "reads")

    def __init__(self, catalog: Catalog, leading: str = "") -> None:
        self.catalog = catalog
        self.leading = leading  # labels first on every line (their text)
        specs = list(catalog)
        self.headers = tuple(_header(spec) for spec in specs)
        self.index = {spec.name: i for i, spec in enumerate(specs)}
        self.pieces: dict[tuple[str, Layout, tuple[int, ...] | None], _Piece] = {}
        self.reads: dict[tuple[Any, ...], tuple[list[Any], Any]] = {}

    def of(self, read: tuple[Any, ...]) -> tuple[list[Any], Any]:
        """For a read of these groups: the text of every family of the catalogue as a list,
        ``[head, tail, hole, head, tail, hole, ..., text]`` (each family's header and newline
        with its first head), and the picker of the holes' numbers, in order, out of the read's
        sample texts put end to end."""
        found = self.reads.get(read)
        if found is not None:
            return found
        pieces, kept = self.pieces, {}
        parts: list[list[str]] = [[] for _ in self.headers]
        places: list[list[int]] = [[] for _ in self.headers]
        offset = 0
        for key in read:
            piece = pieces.get(key) or _Piece(self.index, self.leading, *key)
            kept[key] = piece
            for f, p, a in piece.families:
                parts[f] += p
                places[f] += map(offset.__add__, a)  # (in C: a read that changed builds this again)
            offset += piece.size
        self.pieces = kept  # those of this read: an engine gc removed, a names field gone, go
        text: list[Any] = []
        pending = ""  # what comes before the next line's head: a newline, headers
        for header, family_parts in zip(self.headers, parts):
            pending += header
            if family_parts:
                block: list[Any] = [None] * (len(family_parts) * 3 // 2)  # [head, tail, hole, ...]
                block[0::3] = family_parts[0::2]
                block[1::3] = family_parts[1::2]
                block[0] = pending + block[0]
                text += block
                pending = ""
            pending += "\n"
        text.append(pending)
        found = (text, _picker([*chain.from_iterable(places)]))
        reads = self.reads if len(self.reads) < _READ_PLANS else {}
        reads[read] = found
        self.reads = reads
        return found


class TextRenderer:
    """Renders decoded reads as Prometheus text. Safe to call from several threads at once (the
    exporter serves each request on its own thread): every scrape's lines live in locals.

    *labels* (name -> value) go first on every line, before ``engine``: an exporter of several
    namespaces gives each namespace's lines its ``redis_stats_namespace``. They are part of the
    kept prefixes, so they cost a scrape nothing."""

    def __init__(self, labels: dict[str, str] | None = None) -> None:
        self._plan: _Plan | None = None
        self.labels = dict(labels or {})
        self._leading = label_pairs(self.labels)

    def render(self, decoded: Decoded) -> str:
        """The text of every family of the catalogue, with the series of *decoded*: the read's
        text with its holes filled (a copy of the kept list, the numbers put in by one slice
        assignment, one join: every step one call of C over the whole read)."""
        plan = self._plan
        if plan is None or plan.catalog is not decoded.shell.catalog:
            plan = self._plan = _Plan(decoded.shell.catalog, self._leading)  # one swap; others keep theirs
        texts: list[str] = []
        read = [
            (engine.engine, group.layout, sample_texts(group, texts))
            for engine in decoded.engines
            for group in engine.groups
        ]
        text, pick = plan.of(tuple(read))
        out = text.copy()
        out[2::3] = pick(texts)
        return "".join(out)


def label_pairs(labels: dict[str, str]) -> str:
    """``a="x",b="y"``: *labels* as the text format writes them inside braces ("" for none)."""
    out = []
    for name, value in labels.items():
        out.append(name + '="' + escape_label_value(value) + '"')
    return ",".join(out)


def format_families(families: Any, labels: dict[str, str] | None = None) -> str:
    """prometheus_client metric families as text (for the few self-metrics after the data), with
    *labels* first on every sample (a sample's own label of the same name wins)."""
    out: list[str] = []
    for fam in families:
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out.append(
            "# HELP "
            + name
            + " "
            + _escape_help(fam.documentation)
            + "\n# TYPE "
            + name
            + " "
            + fam.type
            + "\n"
        )
        for sample in fam.samples:
            merged = {**labels, **sample.labels} if labels else sample.labels
            pairs = []
            for k, v in merged.items():
                pairs.append(k + '="' + escape_label_value(str(v)) + '"')
            text = "{" + ",".join(pairs) + "}" if pairs else ""
            out.append(sample.name + text + " " + floatToGoString(sample.value) + "\n")
    return "".join(out)


def line_starts(text: str, prefix: str) -> list[int]:
    """Where each line of *text* that starts with *prefix* starts (found with ``str.find``: a
    few hundred in a multi-megabyte body)."""
    starts = [0] if text.startswith(prefix) else []
    at = text.find("\n" + prefix)
    while at != -1:
        starts.append(at + 1)
        at = text.find("\n" + prefix, at + 1)
    return starts


def _family_blocks(text: str) -> list[tuple[str, str, str, str]]:
    """(name, type, header, samples) of each family of a text of the text format: its header the
    ``# HELP`` and ``# TYPE`` lines, its samples the lines after them (each with its newline). A
    family starts at each ``# HELP`` line: no HELP text nor label value holds a raw newline."""
    starts = line_starts(text, "# HELP ")
    blocks = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(text)
        help_end = text.find("\n", start, end)
        type_end = text.find("\n", help_end + 1, end) if help_end != -1 else -1
        if type_end == -1:  # (never in our texts) a family without its TYPE line: kept as it is
            type_end = end - 1
        name_end = text.find(" ", start + 7, help_end if help_end != -1 else end)
        name = text[start + 7 : name_end if name_end != -1 else help_end]
        kind = text[text.rfind(" ", help_end, type_end) + 1 : type_end]
        blocks.append((name, kind, text[start : type_end + 1], text[type_end + 1 : end]))
    return blocks


def _merged(
    families: dict[str, tuple[str, str, list[str]]], key: str, family: tuple[str, str, list[str]]
) -> bool:
    """Add one text's *family* to *families*: False when a family of another type is left out
    (this one, or a bare declaration of the other type that it replaces)."""
    found = families.get(key)
    if found is None:
        families[key] = family
        return True
    if found[0] == family[0]:
        found[2].extend(family[2])
        return True
    if any(family[2]) and not any(found[2]):  # a bare declaration: the type with series wins
        families[key] = family
    return False


def merge_texts(texts: Sequence[str]) -> tuple[str, list[str]]:
    """Several texts of the text format as one, each family once: the first text's ``# HELP`` and
    ``# TYPE`` lines, then its samples from every text in turn (two texts' families of one name
    would otherwise be a second TYPE line, which Prometheus refuses for the whole scrape).

    Also the names of the families left out of a text because it declares them with another type
    than the first text that has them (the two would be one family of two types; a counter
    ``x_total`` and a gauge ``x`` too, one name in OpenMetrics): a namespace's bridged server
    naming a family as another's. A declaration without series never hides another text's
    series of the family: the first text *with series* gives the type (the declarations before
    it are the ones left out). Text before a text's first ``# HELP`` (none in
    what the renderer writes) is kept, first."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    loose: list[str] = []
    clashes: list[str] = []
    for text in texts:
        blocks = _family_blocks(text)
        head = text[: len(text) - sum(len(h) + len(s) for _, _, h, s in blocks)]
        if head:
            loose.append(head)
        for name, kind, header, samples in blocks:
            # A family by its OpenMetrics name (a counter's without _total): a counter tokens_total
            # and a gauge tokens would be one family of two types there.
            key = name[:-6] if kind == "counter" and name.endswith("_total") else name
            if not _merged(families, key, (kind, header, [samples])):
                clashes.append(key)
    return "".join(loose) + "".join(h + "".join(s) for _, h, s in families.values()), clashes
