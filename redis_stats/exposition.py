"""TextRenderer: one read of Redis straight to Prometheus text, for the exporter's /metrics.

prometheus_client's ``generate_latest`` builds a Python object per sample and formats every
label on every scrape: about 10 us per sample, so 80 ms for 64 engines of the vLLM catalogue.
Between two scrapes almost nothing but the numbers changes, so this renderer caches, per hash
field, everything else: the decoded series and its rendered line prefix
(``vllm:prompt_tokens_total{engine="3",model_name="m"} ``). A scrape then costs a dictionary
lookup, a number check and a string join per field. The semantics are the decoder's
(:mod:`redis_stats.snapshot`): cumulative buckets with ``+Inf``, gauges of live writers only,
rolled up by mode, gauges of stale engines hidden, undecodable fields skipped and counted; a test
parses both outputs with prometheus_client's parser and compares them.
"""

from __future__ import annotations

import math
from collections import Counter as _Tally
from itertools import pairwise
from typing import Any

from prometheus_client.utils import floatToGoString

from .catalog import COUNTER, ENGINE_LABEL, GAUGE, HISTOGRAM, MetricSpec
from .snapshot import Snapshot, SnapshotDecoder

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


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else floatToGoString(value)


class _Family:
    """Header and the lines of one metric in one scrape."""

    __slots__ = ("header", "lines")

    def __init__(self, spec: MetricSpec) -> None:
        # As prometheus_client's text format: a counter's HELP/TYPE name ends in _total.
        name = spec.name + "_total" if spec.kind == COUNTER else spec.name
        self.header = f"# HELP {name} {_escape_help(spec.help)}\n# TYPE {name} {spec.kind}\n"
        self.lines: list[str] = []


def _labels(engine: str, spec: MetricSpec, values: tuple[str, ...]) -> str:
    pairs = [f'{ENGINE_LABEL}="{escape_label_value(engine)}"']
    pairs += [f'{n}="{escape_label_value(v)}"' for n, v in zip(spec.labels, values)]
    return ",".join(pairs)


class _Histogram:
    """One histogram series of one engine: its lines as one template, filled from its field."""

    __slots__ = ("size", "template")

    def __init__(self, engine: str, spec: MetricSpec, values: tuple[str, ...]) -> None:
        labels = _labels(engine, spec, values)
        bounds = (*spec.buckets, _INF)
        lines = [f'{spec.name}_bucket{{{labels},le="{floatToGoString(b)}"}} %s\n' for b in bounds]
        lines += [f"{spec.name}_count{{{labels}}} %s\n", f"{spec.name}_sum{{{labels}}} %s\n"]
        self.template = "".join(lines)
        self.size = len(bounds)

    def render(self, raw: str) -> str | None:
        """The series' lines from ``"<sum> <c0> ... <cN>"`` (cumulative, as stored), or None if
        the value is malformed."""
        parts = raw.split()
        if len(parts) != self.size + 1:
            return None
        counts = parts[1:]
        if not "".join(counts).isdigit():  # integers, as the flush script writes them
            try:
                values = [float(c) for c in counts]
            except ValueError:
                return None
            if any(b < a for a, b in pairwise(values)):
                return None
            counts = [_number(v) for v in values]
        try:
            total = float(parts[0])
        except ValueError:
            return None
        if total != total:
            return None
        # The sum as stored, unless Lua wrote an overflowed sum 'inf': Prometheus writes +Inf.
        text = parts[0] if total - total == 0 else floatToGoString(total)
        return self.template % (*counts, counts[-1], text)


class _Gauge:
    """One gauge series of one engine: its line prefix and this scrape's values by writer."""

    __slots__ = ("best", "mode", "prefix", "values")

    def __init__(self, engine: str, spec: MetricSpec, values: tuple[str, ...]) -> None:
        self.prefix = f"{spec.name}{{{_labels(engine, spec, values)}}} "
        self.mode = spec.mode
        self.values: list[float] = []
        self.best: tuple[float, str] | None = None  # (wall-clock stamp, value as written)

    def render(self, out: list[str]) -> None:
        if self.mode == "mostrecent":
            if self.best is not None:
                text = self.best[1]  # the writer's repr(); 'inf'/'-inf' are written as Prometheus does
                out.append(f"{self.prefix}{text if text[-1].isdigit() else floatToGoString(float(text))}\n")
        elif self.values:
            rollup = sum if self.mode == "sum" else max if self.mode == "max" else min
            out.append(f"{self.prefix}{floatToGoString(rollup(self.values))}\n")
        self.values = []
        self.best = None


class TextRenderer:
    """Renders replies of a reader (``StatsReader.read``) as Prometheus text.

    Shares the reader's :class:`~redis_stats.snapshot.SnapshotDecoder` for the catalogue, field
    parsing and liveness, and keeps its own per-field cache of rendered prefixes.
    """

    def __init__(self, decoder: SnapshotDecoder) -> None:
        self.decoder = decoder
        self._catalog: Any = None
        self._families: dict[str, _Family] = {}
        # engine -> field -> plan: ("c", family, line prefix), ("h", family, histogram lines),
        # (family, gauge, writer), or the reason to skip the field.
        self._counter_plans: dict[str, dict[str, Any]] = {}
        self._gauge_plans: dict[str, dict[str, Any]] = {}
        self._series: dict[tuple[str, str, tuple[str, ...]], Any] = {}

    def _reset_if_catalog_changed(self) -> None:
        catalog = self.decoder.catalog
        if catalog is not self._catalog or len(self._series) > _CACHE_LIMIT:
            self._catalog = catalog
            self._families = {spec.name: _Family(spec) for spec in catalog}
            self._counter_plans.clear()
            self._gauge_plans.clear()
            self._series.clear()

    def _series_of(self, kind: type, engine: str, spec: MetricSpec, values: tuple[str, ...]) -> Any:
        key = (engine, spec.name, values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = kind(engine, spec, values)
        return series

    def _plan_counter_field(self, engine: str, name: str) -> Any:
        parsed = self.decoder._field(name)
        if isinstance(parsed, str):
            return parsed  # the reason to skip it
        spec, values, _ = parsed
        family = self._families[spec.name]
        if spec.kind == COUNTER:
            return ("c", family, f"{spec.name}_total{{{_labels(engine, spec, values)}}} ")
        if spec.kind == HISTOGRAM:
            return ("h", family, _Histogram(engine, spec, values))
        return "bad_field"  # a gauge's field in the counters' hash

    def _plan_gauge_field(self, engine: str, name: str) -> Any:
        parsed = self.decoder._field(name)
        if isinstance(parsed, str):
            return parsed
        spec, values, writer = parsed
        if spec.kind != GAUGE:
            return "bad_field"
        return (self._families[spec.name], self._series_of(_Gauge, engine, spec, values), writer)

    def render(self, reply: list[Any]) -> tuple[str, Snapshot]:
        """(text of every family, the snapshot without series) for one read reply.

        The snapshot carries the engines' and writers' liveness and what was skipped, for the
        self-metrics that follow the data.
        """
        skipped: _Tally[str] = _Tally()
        shell = self.decoder.decode_shell(reply, skipped)
        self._reset_if_catalog_changed()
        gauges: list[tuple[_Family, _Gauge]] = []
        live = {wid for wid, info in shell.writers.items() if info.live}
        for engine_text, snap, c_flat, g_flat in shell.engine_hashes:
            self._counters(engine_text, c_flat, skipped)
            if snap.up:
                self._gauges(engine_text, g_flat, live, gauges, skipped)
        for family, gauge in gauges:
            gauge.render(family.lines)
        out: list[str] = []
        for family in self._families.values():
            out.append(family.header)
            out += family.lines
            family.lines = []
        shell.engine_hashes = []
        return "".join(out), shell

    def _counters(self, engine: str, flat: list[Any], skipped: _Tally[str]) -> None:
        plans = self._counter_plans.setdefault(engine, {})
        it = iter(flat)
        for name, raw in zip(it, it):
            plan = plans.get(name)
            if plan is None:
                plan = plans[name] = self._plan_counter_field(engine, name)
            if plan.__class__ is str:
                skipped[plan] += 1
                continue
            if plan[0] == "c":
                try:
                    value = float(raw)
                except ValueError:
                    value = math.nan
                if value != value:
                    skipped["bad_value"] += 1
                    continue
                plan[1].lines.append(f"{plan[2]}{raw}\n")
            else:
                block = plan[2].render(raw)
                if block is None:
                    skipped["bad_value"] += 1
                    continue
                plan[1].lines.append(block)

    def _gauges(
        self,
        engine: str,
        flat: list[Any],
        live: set[str],
        gauges: list[Any],
        skipped: _Tally[str],
    ) -> None:
        plans = self._gauge_plans.setdefault(engine, {})
        it = iter(flat)
        for name, raw in zip(it, it):
            plan = plans.get(name)
            if plan is None:
                plan = plans[name] = self._plan_gauge_field(engine, name)
            if plan.__class__ is str:
                skipped[plan] += 1
                continue
            family, gauge, writer = plan
            if writer not in live:
                continue  # not current: a stale, closed or removed writer's value
            stamp_text, _, value_text = raw.partition("|")
            try:
                stamp, value = float(stamp_text), float(value_text)
            except ValueError:
                skipped["bad_value"] += 1
                continue
            if value != value:
                skipped["bad_value"] += 1
                continue
            if gauge.best is None and not gauge.values:
                gauges.append((family, gauge))
            if gauge.mode == "mostrecent":
                if gauge.best is None or stamp > gauge.best[0]:
                    gauge.best = (stamp, value_text)  # the writer's repr(): valid sample text
            else:
                gauge.values.append(value)


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
