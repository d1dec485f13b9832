"""TextRenderer: the decoded form of a read (:class:`~redis_stats._core.decoder.Decoded`) as
Prometheus text, for the exporter's ``/metrics``.

prometheus_client's ``generate_latest`` builds a Python object per sample and formats every
label on every scrape: about 10 us per sample, so 80 ms for 64 engines of the vLLM catalogue.
Between two scrapes nothing but the numbers changes, so this formatter keeps, per engine and
names field (a :class:`~redis_stats._core.groups.Layout`), the text around the numbers: each
line's prefix (``vllm:prompt_tokens_total{engine="3",model_name="m"} ``) and each histogram's
text with a slot per number. A scrape is then a string join per counter and gauge and a slot
fill per histogram. No text of a label is ever part of a format string (a ``%`` in a label value
once took the whole view dark, issue 32): lines are joined, and the one ``%`` format (a
histogram whose counts are ints) is made of ``%s`` alone, the label texts its arguments. It
reads only the decoded form (the writers already added up, what was skipped already counted),
so it prints what the snapshot holds.

What it keeps depends only on the catalogue (one :class:`_Plan` per catalogue, swapped whole when
it changes) and on the names fields the engines hold: what a render did not use is dropped when
it ends (an engine gc removed, a names field no writer holds any more). Concurrent scrapes share
it and keep every per-scrape line in locals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from prometheus_client.utils import floatToGoString

from redis_stats._core.decoder import Decoded
from redis_stats._core.groups import Group, Layout
from redis_stats._core.values import go_floats
from redis_stats.catalog import COUNTER, ENGINE_LABEL, Catalog, MetricSpec

__all__ = ["TextRenderer", "escape_label_value", "format_families"]

_INF = math.inf


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it (backslash, double quote, newline escaped)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _header(spec: MetricSpec) -> str:
    # As prometheus_client's text format: a counter's HELP/TYPE name ends in _total.
    name = spec.name + "_total" if spec.kind == COUNTER else spec.name
    return f"# HELP {name} {_escape_help(spec.help)}\n# TYPE {name} {spec.kind}\n"


def _labels(engine: str, spec: MetricSpec, values: tuple[str, ...]) -> str:
    pairs = [f'{ENGINE_LABEL}="{escape_label_value(engine)}"']
    pairs += [f'{n}="{escape_label_value(v)}"' for n, v in zip(spec.labels, values)]
    return ",".join(pairs)


def _histogram_blank(engine: str, spec: MetricSpec, values: tuple[str, ...]) -> tuple[str | None, ...]:
    """One histogram series' text with a ``None`` where each number goes (its cumulative
    counts, its count, its sum): what a scrape copies, fills and joins. Never a format string:
    a label value is data, and a ``%`` or ``{`` in it must print as it is (issue 32)."""
    labels = _labels(engine, spec, values)
    prefixes = [f'{spec.name}_bucket{{{labels},le="{floatToGoString(b)}"}} ' for b in (*spec.buckets, _INF)]
    prefixes += [f"{spec.name}_count{{{labels}}} ", f"{spec.name}_sum{{{labels}}} "]
    blank: list[str | None] = [prefixes[0]]
    for prefix in prefixes[1:]:
        blank += (None, "\n" + prefix)
    return (*blank, None, "\n")


def _number_text(value: Any) -> str:
    """A counter's or a count's sample text: an int as it is (exact), a float as Go writes it."""
    return str(value) if value.__class__ is int else str(floatToGoString(value))


def _line(layout: Layout, i: int) -> tuple[MetricSpec, tuple[str, ...]]:
    """The spec and label values of line *i* of *layout* (a group's lines are all series)."""
    spec, key = layout.specs[i], layout.keys[i]
    if spec is None or key is None:
        raise ValueError(f"line {i} of a group's layout is not a series")  # (never: groups are clean)
    return spec, key[1]


class _Plan:
    """What the renderer knows for one catalogue: each family's header, and per (engine,
    layout) the text around each of its numbers. Holds no per-scrape state: its entries are
    immutable, one dict store each (safe under the GIL), and a new catalogue replaces the whole
    plan while older scrapes finish with the one they hold."""

    __slots__ = ("catalog", "headers", "index", "layouts")

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        specs = list(catalog)
        self.headers = tuple(_header(spec) for spec in specs)
        self.index = {spec.name: i for i, spec in enumerate(specs)}
        self.layouts: dict[tuple[str, Layout], Any] = {}

    def of(self, engine: str, layout: Layout) -> Any:
        """How to render a group of *layout* in *engine*: (family, line prefix) per counter,
        (family, its text with a slot per number, a format of as many ``%s`` (no text of its own),
        where its counts start and stop) per histogram, (family, prefix)
        per gauge."""
        found = self.layouts.get((engine, layout))
        if found is not None:
            return found
        index = self.index
        counters = [_line(layout, i) for i in layout.counters]
        histograms = [_line(layout, i) for i in layout.histograms]
        gauges = [_line(layout, i) for i in layout.gauges]
        found = (
            tuple((index[s.name], f"{s.name}_total{{{_labels(engine, s, v)}}} ") for s, v in counters),
            tuple(
                (index[s.name], blank, "%s" * len(blank), w.start, w.stop)
                for (s, v), w in zip(histograms, layout.count_slices)
                for blank in (_histogram_blank(engine, s, v),)
            ),
            tuple((index[s.name], f"{s.name}{{{_labels(engine, s, v)}}} ") for s, v in gauges),
        )
        self.layouts[engine, layout] = found
        return found


class TextRenderer:
    """Renders decoded reads as Prometheus text. Safe to call from several threads at once (the
    exporter serves each request on its own thread): every scrape's lines live in locals."""

    def __init__(self) -> None:
        self._plan: _Plan | None = None

    def _plan_for(self, catalog: Catalog) -> _Plan:
        plan = self._plan
        if plan is None or plan.catalog is not catalog:
            plan = self._plan = _Plan(catalog)  # one atomic swap; others keep the plan they hold
        return plan

    def render(self, decoded: Decoded) -> str:
        """The text of every family of the catalogue, with the series of *decoded*."""
        plan = self._plan_for(decoded.shell.catalog)
        lines: list[list[str]] = [[] for _ in plan.headers]
        used: list[tuple[str, Layout]] = []
        for engine in decoded.engines:
            for group in engine.groups:
                _group(plan.of(engine.engine, group.layout), group, lines)
                used.append((engine.engine, group.layout))
        kept = plan.layouts
        if len(kept) > len(used):  # engines gc removed, names fields no writer holds any more
            plan.layouts = {k: kept[k] for k in used if k in kept}
        out: list[str] = []
        for header, family_lines in zip(plan.headers, lines):
            out.append(header)
            out += family_lines
        return "".join(out)


def _group(layout_plan: Any, group: Group, lines: list[list[str]]) -> None:
    """One group's lines, each appended to its family's."""
    counter_plans, histogram_plans, gauge_plans = layout_plan
    for (family, prefix), text in zip(counter_plans, _counter_texts(group)):
        lines[family].append(f"{prefix}{text}\n")
    if histogram_plans:
        counts, sums = _histogram_texts(group)
        joined = group.texts is not None or not group.count_ints  # texts only: joined as they are
        for (family, blank, fill, start, stop), total in zip(histogram_plans, sums):
            # The numbers go into the blank's slots (odd places): its buckets, then the count
            # (the +Inf bucket's) and the sum.
            filled = [*blank]
            filled[1:-4:2] = counts[start:stop]
            filled[-4] = counts[stop - 1]
            filled[-2] = total
            if joined:
                lines[family].append("".join(filled))
            else:
                lines[family].append(fill % tuple(filled))  # "%s" only: the ints printed in C
    if gauge_plans:
        shown = [(plan, v) for plan, v in zip(gauge_plans, group.gauges) if v is not None]
        for ((family, prefix), _), text in zip(shown, go_floats([v for _, v in shown])):
            lines[family].append(f"{prefix}{text}\n")


def _counter_texts(group: Group) -> Sequence[Any]:
    """What to print of a group's counters: the stored texts of one writer's, ints as they are
    (``%s`` and f-strings print them), floats as Go writes them."""
    if group.texts is not None:
        return group.texts[0]
    return group.counters if group.counter_ints else [*map(_number_text, group.counters)]


def _histogram_texts(group: Group) -> tuple[Sequence[Any], Sequence[str]]:
    """What to print of a group's histograms: the tokens (``counts[count_slices[j]]``: texts, or
    ints while exact) and the sums (texts), as :func:`_counter_texts` prints counters."""
    if group.texts is not None:
        tokens = group.texts[1].split(" ")
        return tokens, group.layout.pick_sums(tokens)
    counts = group.counts if group.count_ints else [*map(_number_text, group.counts)]
    return counts, go_floats([*group.sums])


def format_families(families: Any) -> str:
    """prometheus_client metric families as text (for the few self-metrics after the data)."""
    out: list[str] = []
    for fam in families:
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out.append(f"# HELP {name} {_escape_help(fam.documentation)}\n# TYPE {name} {fam.type}\n")
        for sample in fam.samples:
            if sample.labels:
                labels = ",".join(f'{k}="{escape_label_value(str(v))}"' for k, v in sample.labels.items())
                out.append(f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}\n")
            else:
                out.append(f"{sample.name} {floatToGoString(sample.value)}\n")
    return "".join(out)
