"""TextRenderer: one read of Redis straight to Prometheus text, for the exporter's /metrics.

prometheus_client's ``generate_latest`` builds a Python object per sample and formats every
label on every scrape: about 10 us per sample, so 80 ms for 64 engines of the vLLM catalogue.
Between two scrapes almost nothing but the numbers changes, so this renderer caches, per hash
field, everything else: the decoded series and its rendered line prefix
(``vllm:prompt_tokens_total{engine="3",model_name="m"} ``). A scrape then costs a dictionary
lookup, a number check and a string join per field. The semantics are the decoder's
(:mod:`redis_stats.snapshot`), whose functions decide which fields and values are valid:
cumulative buckets with ``+Inf``, gauges of live writers only, rolled up by mode, gauges of stale
engines hidden, undecodable fields and wrong-typed keys skipped and counted; tests parse both
outputs with prometheus_client's parser and compare them, on garbage too.

The caches hold only what never changes for a catalogue (prefixes, templates, field parses),
in one :class:`_Plan` swapped whole when the catalogue changes: concurrent scrapes share it and
keep every per-scrape line and gauge value in locals.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.utils import floatToGoString

from .catalog import COUNTER, ENGINE_LABEL, Catalog, MetricSpec
from .snapshot import Skipped, Snapshot, SnapshotDecoder, gauge_parts, histogram_parts, number_text

__all__ = ["TextRenderer", "escape_label_value"]

_CACHE_LIMIT = 2_000_000
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
    """What the renderer knows for one catalogue: each family's header, and per engine and hash
    field how to render it. Shared by concurrent scrapes, so it holds no per-scrape state: the
    field plans only gain entries (immutable tuples, one dict store each, safe under the GIL),
    and a reset replaces the whole plan (``TextRenderer._plan``) while older scrapes finish
    with the one they hold."""

    __slots__ = ("catalog", "counter_fields", "gauge_fields", "gauges", "headers", "index", "size")

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        specs = list(catalog)
        self.headers = tuple(_header(spec) for spec in specs)
        self.index = {spec.name: i for i, spec in enumerate(specs)}
        # engine -> field -> ("c", family index, line prefix), ("h", family index, _Histogram),
        # or the reason to skip the field
        self.counter_fields: dict[str, dict[str, Any]] = {}
        # engine -> field -> (family index, series line prefix, roll-up mode, writer), or the reason
        self.gauge_fields: dict[str, dict[str, Any]] = {}
        self.size = 0  # fields planned (approximate under threads: only bounds the memory)


class TextRenderer:
    """Renders replies of a reader (``StatsReader.read``) as Prometheus text.

    Shares the reader's :class:`~redis_stats.snapshot.SnapshotDecoder` for the catalogue, field
    parsing, value validation and liveness, and keeps its own per-field cache of rendered
    prefixes. Safe to call from several threads at once (the exporter serves each request on
    its own thread): every scrape's lines and gauge roll-ups live in locals of :meth:`render`.
    """

    def __init__(self, decoder: SnapshotDecoder) -> None:
        self.decoder = decoder
        self._plan = _Plan(decoder.catalog)

    def _plan_for(self, catalog: Catalog) -> _Plan:
        plan = self._plan
        if plan.catalog is not catalog or plan.size > _CACHE_LIMIT:
            plan = self._plan = _Plan(catalog)  # one atomic swap; others keep the plan they hold
        return plan

    def _plan_counter_field(self, plan: _Plan, engine: str, name: str) -> Any:
        parsed = self.decoder.counter_field(name, plan.catalog)
        if isinstance(parsed, str):
            return parsed  # the reason to skip it
        spec, values, _ = parsed
        family = plan.index[spec.name]
        if spec.kind == COUNTER:
            return ("c", family, f"{spec.name}_total{{{_labels(engine, spec, values)}}} ")
        return ("h", family, _Histogram(engine, spec, values))

    def _plan_gauge_field(self, plan: _Plan, engine: str, name: str) -> Any:
        parsed = self.decoder.gauge_field(name, plan.catalog)
        if isinstance(parsed, str):
            return parsed
        spec, values, writer = parsed
        prefix = f"{spec.name}{{{_labels(engine, spec, values)}}} "
        return (plan.index[spec.name], prefix, spec.mode, writer)

    def render(self, reply: list[Any]) -> tuple[str, Snapshot]:
        """(text of every family, the snapshot without series) for one read reply.

        The snapshot carries the engines' and writers' liveness and what was skipped, for the
        self-metrics that follow the data.
        """
        skipped = Skipped()
        shell = self.decoder.decode_shell(reply, skipped)
        plan = self._plan_for(shell.catalog)
        lines: list[list[str]] = [[] for _ in plan.headers]
        # series line prefix -> [family index, mode, best stamp, best text] (mostrecent) or
        # [family index, mode, value, value, ...] (sum, max, min), in order of first sight
        gauges: dict[str, list[Any]] = {}
        live = {wid for wid, info in shell.writers.items() if info.live}
        keys = self.decoder.keys
        for engine_text, snap, c_flat, g_flat in shell.engine_hashes:
            self._counters(plan, engine_text, c_flat, lines, skipped, keys)
            if snap.up:
                self._gauges(plan, engine_text, g_flat, live, gauges, skipped, keys)
        for prefix, state in gauges.items():
            mode = state[1]
            if mode == "mostrecent":
                text = state[3]
            else:
                rollup = sum if mode == "sum" else max if mode == "max" else min
                text = floatToGoString(rollup(state[2:]))
            lines[state[0]].append(f"{prefix}{text}\n")
        out: list[str] = []
        for header, family_lines in zip(plan.headers, lines):
            out.append(header)
            out += family_lines
        shell.engine_hashes = []
        return "".join(out), shell

    def _counters(
        self, plan: _Plan, engine: str, flat: list[Any], lines: list[list[str]], skipped: Skipped, keys: Any
    ) -> None:
        plans = plan.counter_fields.get(engine)
        if plans is None:
            plans = plan.counter_fields.setdefault(engine, {})
        it = iter(flat)
        for name, raw in zip(it, it):
            field_plan = plans.get(name)
            if field_plan is None:
                field_plan = plans[name] = self._plan_counter_field(plan, engine, name)
                plan.size += 1
            if field_plan.__class__ is str:
                skipped.note(field_plan, keys.counters(engine), str(name))
                continue
            if field_plan[0] == "c":
                text = raw if raw.__class__ is str and raw.isdigit() and raw.isascii() else number_text(raw)
                if text is None:
                    skipped.note("bad_value", keys.counters(engine), name)
                    continue
                lines[field_plan[1]].append(f"{field_plan[2]}{text}\n")
            else:
                hist = field_plan[2]
                parts = histogram_parts(raw, hist.size)  # the decoder's rule, as collect() uses
                if parts is None:
                    skipped.note("bad_value", keys.counters(engine), name)
                    continue
                counts = parts[1]
                lines[field_plan[1]].append(hist.template % (*counts, counts[-1], parts[0]))

    def _gauges(
        self,
        plan: _Plan,
        engine: str,
        flat: list[Any],
        live: set[str],
        gauges: dict[str, list[Any]],
        skipped: Skipped,
        keys: Any,
    ) -> None:
        plans = plan.gauge_fields.get(engine)
        if plans is None:
            plans = plan.gauge_fields.setdefault(engine, {})
        it = iter(flat)
        for name, raw in zip(it, it):
            field_plan = plans.get(name)
            if field_plan is None:
                field_plan = plans[name] = self._plan_gauge_field(plan, engine, name)
                plan.size += 1
            if field_plan.__class__ is str:
                skipped.note(field_plan, keys.gauges(engine), str(name))
                continue
            family, prefix, mode, writer = field_plan
            if writer not in live:
                continue  # not current: a stale, closed or removed writer's value
            parts = gauge_parts(raw)
            if parts is None:
                skipped.note("bad_value", keys.gauges(engine), name)
                continue
            state = gauges.get(prefix)
            if mode == "mostrecent":
                if state is None:
                    gauges[prefix] = [family, mode, parts[0], parts[2]]
                elif parts[0] > state[2]:
                    state[2], state[3] = parts[0], parts[2]
            elif state is None:
                gauges[prefix] = [family, mode, parts[1]]
            else:
                state.append(parts[1])


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
