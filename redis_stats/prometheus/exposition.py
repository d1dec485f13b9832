"""TextRenderer: one read of Redis straight to Prometheus text, for the exporter's /metrics.

prometheus_client's ``generate_latest`` builds a Python object per sample and formats every
label on every scrape: about 10 us per sample, so 80 ms for 64 engines of the vLLM catalogue.
Between two scrapes almost nothing but the numbers changes, so this renderer caches, per series
field, everything else: the decoded series and its rendered line prefix
(``vllm:prompt_tokens_total{engine="3",model_name="m"} ``), and per engine and chunk layout
the plans of the layout's lines. The renderer is fed by the decoder's public interface
(:meth:`~redis_stats._core.snapshot.SnapshotDecoder.decode_shell`, ``engine_chunks``, ``merge``):
the writers' values come added up, group by group, as sample text (schema 2, docs/key-schema.md,
"Reading schema 2"), so a scrape costs a template fill or a string join per series; an engine the
decoder does not take in bulk (garbage) is rendered line by line here, with the decoder's rules.
The semantics are the decoder's (:mod:`redis_stats._core.snapshot`), whose functions decide which
fields and values are valid:
cumulative buckets with ``+Inf``, gauges of live writers only, rolled up by mode, gauges of stale
engines hidden, undecodable fields and wrong-typed keys skipped and counted; tests parse both
outputs with prometheus_client's parser and compare them, on garbage too.

The caches hold only what never changes for a catalogue (prefixes, templates, field and layout
plans), in one :class:`_Plan` swapped whole when the catalogue changes: concurrent scrapes share it and
keep every per-scrape line and gauge value in locals. Of the per-engine plans, it keeps those the
last read used (as the decoder keeps chunk parses): an engine removed by gc, or a names field no
writer holds any more, leaves nothing behind.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.utils import floatToGoString

from redis_stats._core.merge import EngineChunks, Generations, Layout
from redis_stats._core.snapshot import EngineHash, EngineKey, Skipped, Snapshot, SnapshotDecoder
from redis_stats._core.values import (
    MAX_DIGITS,
    gauge_parts,
    histogram_numbers,
    histogram_parts,
    number_text,
    roll_up,
    sum_counter_texts,
    sum_histograms,
)
from redis_stats.catalog import COUNTER, ENGINE_LABEL, HISTOGRAM, Catalog, MetricSpec

__all__ = ["TextRenderer", "escape_label_value"]

# Plans one renderer keeps at most (engines and their groups: 20,000 engines x 2 names fields, as
# merge.KEPT_CEILING; ~35 KB each for a vLLM engine). Past it, the rest are planned at each read.
PLAN_CEILING = 40_000
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


class _Histogram:
    """One histogram series of one engine: its lines as one template (immutable), filled with
    the cumulative counts, the count (the last of them) and the sum."""

    __slots__ = ("size", "template")

    def __init__(self, engine: str, spec: MetricSpec, values: tuple[str, ...]) -> None:
        labels = _labels(engine, spec, values)
        bounds = (*spec.buckets, _INF)
        lines = [f'{spec.name}_bucket{{{labels},le="{floatToGoString(b)}"}} %s\n' for b in bounds]
        lines += [f"{spec.name}_count{{{labels}}} %s\n", f"{spec.name}_sum{{{labels}}} %s\n"]
        self.template = "".join(lines)
        self.size = len(bounds)


class _Plan:
    """What the renderer knows for one catalogue: each family's header, and per engine how to
    render it. Shared by concurrent scrapes, so it holds no per-scrape state: the plans are
    immutable, one dict store each (safe under the GIL), and a new catalogue replaces the whole
    plan (``TextRenderer._plan``) while older scrapes finish with the one they hold.

    The per-engine plans kept are those the last read used (:class:`Generations`, as the
    decoder keeps chunk parses): an engine gc removed, or a names field no writer holds any
    more, leaves nothing behind."""

    __slots__ = ("catalog", "headers", "index", "kept")

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        specs = list(catalog)
        self.headers = tuple(_header(spec) for spec in specs)
        self.index = {spec.name: i for i, spec in enumerate(specs)}
        # (engine, chunk layout) -> its lines' plans, for a group read in bulk; engine -> its
        # series fields' plans, for an engine read line by line: series field ->
        # ("c", family index, line prefix), ("h", family index, _Histogram), ("g", family
        # index, line prefix, roll-up mode), or the reason to skip it
        self.kept = Generations()


class TextRenderer:
    """Renders replies of a reader (``StatsReader.read``) as Prometheus text.

    Shares the reader's :class:`~redis_stats._core.snapshot.SnapshotDecoder` for the catalogue, field
    parsing, value validation and liveness, and keeps its own per-field cache of rendered
    prefixes. Safe to call from several threads at once (the exporter serves each request on
    its own thread): every scrape's lines and gauge roll-ups live in locals of :meth:`render`.
    """

    def __init__(self, decoder: SnapshotDecoder) -> None:
        self.decoder = decoder
        self._plan = _Plan(decoder.catalog)

    def _plan_for(self, catalog: Catalog) -> _Plan:
        plan = self._plan
        if plan.catalog is not catalog:
            plan = self._plan = _Plan(catalog)  # one atomic swap; others keep the plan they hold
        return plan

    def _plan_field(self, plan: _Plan, engine: str, name: str) -> Any:
        parsed = self.decoder.series_field(name, plan.catalog)
        if isinstance(parsed, str):
            return parsed  # the reason to skip it
        spec, values, _ = parsed
        family = plan.index[spec.name]
        if spec.kind == COUNTER:
            return ("c", family, f"{spec.name}_total{{{_labels(engine, spec, values)}}} ")
        if spec.kind == HISTOGRAM:
            return ("h", family, _Histogram(engine, spec, values))
        return ("g", family, f"{spec.name}{{{_labels(engine, spec, values)}}} ", spec.mode)

    def render(self, reply: list[Any]) -> tuple[str, Snapshot]:
        """(text of every family, the snapshot without series) for one read reply.

        The snapshot carries the engines' and writers' liveness and what was skipped, for the
        self-metrics that follow the data.
        """
        skipped = Skipped()
        try:
            shell, hashes = self.decoder.decode_shell(reply, skipped)
            plan = self._plan_for(shell.catalog)
            lines: list[list[str]] = [[] for _ in plan.headers]
            plan.kept.begin()
            try:
                for read in hashes:
                    self._engine(plan, read, lines, skipped)
            finally:
                plan.kept.end()
        finally:
            self.decoder.read_done()
        out: list[str] = []
        for header, family_lines in zip(plan.headers, lines):
            out.append(header)
            out += family_lines
        return "".join(out), shell

    def _engine(self, plan: _Plan, read: EngineHash, lines: list[list[str]], skipped: Skipped) -> None:
        decoder = self.decoder
        engine, live = read.engine, read.live
        chunks = decoder.engine_chunks(engine, read.fields, plan.catalog, skipped, read.key)
        groups = decoder.merge(engine, chunks, live, read.snapshot.up, numbers=False)
        if groups is None:
            self._lines(plan, engine, chunks, read.snapshot.up, live, lines, skipped, read.key)
            return
        kept = plan.kept
        for group in groups:
            layout_plan = kept.get((engine, group.layout))
            if layout_plan is None:
                layout_plan = self._plan_layout(plan, engine, group.layout)
                if len(kept.now) < PLAN_CEILING:
                    kept.now[engine, group.layout] = layout_plan
            counter_plans, histogram_plans, gauge_plans = layout_plan
            for (family, prefix), text in zip(counter_plans, group.counters):
                lines[family].append(f"{prefix}{text}\n")
            counts = group.counts
            for (family, template, start, stop), total in zip(histogram_plans, group.sums):
                found = counts[start:stop]
                lines[family].append(template % (*found, found[-1], total))
            for (family, prefix), text in zip(gauge_plans, group.gauges):
                if text is not None:
                    lines[family].append(f"{prefix}{text}\n")

    def _plan_layout(self, plan: _Plan, engine: str, layout: Layout) -> Any:
        """How to render a group of *layout* in *engine*: (family, line prefix) per counter,
        (family, template, where its counts start and stop) per histogram, (family, prefix)
        per gauge."""
        fields = layout.fields
        planned = [self._plan_field(plan, engine, fields[i]) for i in range(len(fields))]
        return (
            tuple((planned[i][1], planned[i][2]) for i in layout.counters),
            tuple(
                (planned[i][1], planned[i][2].template, where.start, where.stop)
                for i, where in zip(layout.histograms, layout.count_slices)
            ),
            tuple((planned[i][1], planned[i][2]) for i in layout.gauges),
        )

    def _lines(
        self,
        plan: _Plan,
        engine: str,
        chunks: EngineChunks,
        up: bool,
        live: set[str],
        lines: list[list[str]],
        skipped: Skipped,
        key: EngineKey,
    ) -> None:
        """One engine line by line (what :meth:`SnapshotDecoder.merge` does not take in bulk):
        what is bad is skipped and counted, under *key* (:attr:`EngineHash.key`, the engine's
        hash in its shard)."""
        # The engine's field plans of the last read; those of this read are kept for the next.
        before: dict[str, Any] = plan.kept.get(engine) or {}
        plans: dict[str, Any] = {}
        # series field -> [plan, value, value, ...]: one value per writer (and the base field)
        held: dict[str, list[Any]] = {}
        # gauge line prefix -> (family, mode, live writers' readings), in order of first sight
        gauges: dict[str, tuple[int, str, list[tuple[float, float, str]]]] = {}
        for name, raw, writer in chunks.entries():
            field_plan = plans.get(name)
            if field_plan is None:
                field_plan = before.get(name)
                if field_plan is None:
                    field_plan = self._plan_field(plan, engine, name)
                plans[name] = field_plan
            if field_plan.__class__ is str:
                skipped.note(field_plan, key, str(name), raw)
            elif field_plan[0] != "g":
                entry = held.get(name)
                if entry is None:
                    held[name] = [field_plan, raw]
                else:
                    entry.append(raw)
            elif writer is None:
                skipped.note("bad_field", key, name, raw)  # a gauge has no base field
            elif up and writer in live:  # else not current: a stale, closed or removed writer's
                parts = gauge_parts(raw)
                if parts is None:
                    skipped.note("bad_value", key, name, raw)
                    continue
                _, family, prefix, mode = field_plan
                gauges.setdefault(prefix, (family, mode, []))[2].append(parts)
        if len(plan.kept.now) < PLAN_CEILING:
            plan.kept.now[engine] = plans
        # Shown in the order the writers' chunks hold the series, then series only the base
        # fields hold (as the bulk read shows them); base values were added first.
        order = [name for chunk in chunks.chunks for name in chunk.layout.fields if name in held]
        if chunks.base:
            order += [name for name, _, _ in chunks.base if name in held]
        for name in dict.fromkeys(order):
            entry = held[name]
            field_plan = entry[0]
            if field_plan[0] == "c":
                if len(entry) == 2:
                    raw = entry[1]
                    text = (
                        raw
                        if raw.__class__ is str and raw.isdigit() and raw.isascii() and len(raw) <= MAX_DIGITS
                        else number_text(raw)
                    )
                else:
                    text = _sum_text(name, entry, skipped, key)
                if text is None:
                    if len(entry) == 2:
                        skipped.note("bad_value", key, name, entry[1])
                    continue
                lines[field_plan[1]].append(f"{field_plan[2]}{text}\n")
                continue
            hist = field_plan[2]
            if len(entry) == 2:
                found = histogram_parts(entry[1], hist.size)  # the decoder's rule
                if found is None:
                    skipped.note("bad_value", key, name, entry[1])
                    continue
            else:
                found = _sum_histograms(name, entry, hist.size, skipped, key)
                if found is None:
                    continue
            counts = found[1]
            lines[field_plan[1]].append(hist.template % (*counts, counts[-1], found[0]))
        for prefix, (family, mode, readings) in gauges.items():
            value, text = roll_up(mode, readings)
            lines[family].append(f"{prefix}{floatToGoString(value) if text is None else text}\n")


def _sum_text(name: str, entry: list[Any], skipped: Skipped, key: EngineKey) -> str | None:
    """Sample text of the sum of a counter's values (``entry[1:]``, one per writer), added in
    order as the decoder adds them: exact while they are all integers. A value that is not a
    number is skipped and counted; None if none is left."""
    raws = entry[1:]
    if all(
        raw.__class__ is str and raw.isdigit() and raw.isascii() and len(raw) <= MAX_DIGITS for raw in raws
    ):
        return str(sum(map(int, raws)))  # integers, as writers store them: exact
    texts = []
    for raw in raws:
        text = number_text(raw)
        if text is None:
            skipped.note("bad_value", key, name, raw)
        else:
            texts.append(text)
    return sum_counter_texts(texts) if texts else None


def _sum_histograms(
    name: str, entry: list[Any], size: int, skipped: Skipped, key: EngineKey
) -> tuple[str, list[str]] | None:
    """(sum text, count texts) of a histogram's values (``entry[1:]``, one per writer) added
    bucket by bucket, in order, as :meth:`~redis_stats._core.snapshot.HistogramValue.plus` adds them.
    A malformed value is skipped and counted; None if none is left."""
    found = []
    for raw in entry[1:]:
        parsed = histogram_numbers(raw, size)
        if parsed is None:
            skipped.note("bad_value", key, name, raw)
        else:
            found.append(parsed)
    if len(found) < 2:
        return (found[0][0], found[0][1]) if found else None
    return sum_histograms(found)


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
