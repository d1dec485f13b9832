"""One scraped ``/metrics`` body, parsed and checked: families with their specs and series.

The parsing is prometheus_client's (``prometheus_client.parser`` for the 0.0.4 text,
``prometheus_client.openmetrics.parser`` for OpenMetrics), chosen by the response's
Content-Type. What comes out is checked whole before anything is recorded: a body that does not
parse, ends mid-line, holds a series twice, a counter that is not a finite number >= 0, a
histogram whose buckets are not cumulative integers ending at ``+Inf``, or an engine label that
is not an index raises :class:`BodyError` and nothing of it is used.

Kinds map onto the store's three: counter -> counter, histogram -> histogram; gauge, unknown
(untyped), info (as its ``<name>_info`` gauge) and stateset -> gauge. Summaries and gauge or
native histograms have no kind in the store: they are left out (:attr:`Body.skipped`), as are
families named ``redis_stats_*`` (redis_stats' own) and the ``<family>_created`` gauges the text
format prints beside counters and histograms (the store keeps no creation time). Without
*include* patterns, the :data:`PROCESS_FAMILIES` (what the served process says of itself) are
left out too; patterns that match them store them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM, RESERVED_PREFIX, CatalogError, MetricSpec

__all__ = ["PROCESS_FAMILIES", "Body", "BodyError", "Family", "parse_body", "parser_for"]

OPENMETRICS = "application/openmetrics-text"
TEXT = "text/plain"

# The families that describe the process serving /metrics rather than what it serves: what the
# client libraries LLM servers use add to every registry by default. prometheus_client (vLLM,
# SGLang, trtllm-serve, in a single process): process_* (CPU seconds, memory, fds, start time),
# python_info, python_gc_*. client_golang: process_* (and process_network_*), go_* (runtime,
# go_info, go_gc_duration_seconds), promhttp_metric_handler_* (the scrapes it served). Stored by
# default they would name one engine's server after the bridge's sources, and clash with the
# exporter's own process_* and python_* (its /metrics then not a valid exposition: promtool's
# "second HELP line", OpenMetrics' "Clashing name"). Left out unless --family asks for them.
PROCESS_FAMILIES = ("process_*", "python_*", "go_*", "promhttp_*")

# A float that is an integer and exactly representable as one: stored as an int (exact sums).
_EXACT_INT = 2.0**53


class BodyError(ValueError):
    """A body refused whole: *reason* is a stable word (the ``reason`` of the error counts),
    the message says what was wrong and where."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Family:
    """One family of a body: its spec (as the source defines it) and its series.

    ``series`` maps ``(engine, label values in spec order)`` to a counter's or gauge's value, or
    to a histogram's ``(sum, per-bucket counts)`` (non-cumulative, the ``+Inf`` bucket last).
    """

    spec: MetricSpec
    series: dict[tuple[int, tuple[str, ...]], Any] = field(default_factory=dict)


@dataclass
class Body:
    """A parsed body: its families by name, and the families left out with the reason."""

    families: dict[str, Family] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    start_time: float | None = None
    """``process_start_time_seconds`` when the body has exactly one (a new value: a restart)."""

    def engines(self) -> set[int]:
        """Every engine index a series of this body belongs to (before the offset)."""
        return {engine for fam in self.families.values() for engine, _ in fam.series}


def parser_for(content_type: str | None) -> str:
    """Which format a response's Content-Type names: ``"openmetrics"`` or ``"text"``;
    :class:`BodyError` (``content_type``) for anything else. No header: the 0.0.4 text."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == OPENMETRICS:
        return "openmetrics"
    if media in (TEXT, ""):
        return "text"
    given = (content_type or "")[:80]
    raise BodyError(
        "content_type",
        f"Content-Type {given!r} is neither {OPENMETRICS} nor {TEXT}: is the URL "
        "the server's metrics endpoint?",
    )


def _number(value: float) -> int | float:
    """An integral float as an int (its sums stay exact), any other value as it is."""
    if value.is_integer() and -_EXACT_INT <= value <= _EXACT_INT:
        return int(value)
    return value


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def parse_body(
    data: bytes,
    content_type: str | None,
    *,
    engine_label: str | None = None,
    include: tuple[str, ...] = (),
) -> Body:
    """Parse and check one body (see the module docstring); *include* are shell-style patterns
    of family names to keep (empty: every family but the :data:`PROCESS_FAMILIES`)."""
    _refuse_json(data, content_type)
    fmt = parser_for(content_type)
    text = _decode(data)
    _check_whole(text, fmt)
    try:
        parsed = list((parse_openmetrics if fmt == "openmetrics" else parse_text)(text))
    except Exception as exc:  # the parsers raise ValueError, TypeError, IndexError, ...
        raise BodyError("garbage", f"the {fmt} body does not parse: {_short(exc)}") from None
    body = Body()
    names = {m.name for m in parsed}
    if fmt == "openmetrics":
        _check_escaping(parsed, names)
    for metric in parsed:
        _add_family(body, metric, names, engine_label, include)
    return body


def _refuse_json(data: bytes, content_type: str | None) -> None:
    """Refuse a JSON body (``json``): its Content-Type says so, or a body of no other type starts
    as JSON does (no Prometheus text or OpenMetrics line starts with ``{`` or ``[``)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        given = f"Content-Type {media}"
    elif media in (TEXT, "") and data.lstrip()[:1] in (b"{", b"["):
        given = f"Content-Type {media or 'none'}, but it starts as JSON does"
    else:
        return
    raise BodyError(
        "json",
        f"answered JSON ({given}), not Prometheus text or OpenMetrics: nothing of it is stored. "
        "TensorRT-LLM's trtllm-serve answers /metrics so: a queue of iteration stats that each "
        "read takes away (this scrape consumed them, and every retry consumes more); its "
        "Prometheus text is at /prometheus/metrics (served when it runs with "
        "return_perf_metrics: true): give that URL as the source",
    )


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError("garbage", f"the body is not UTF-8 (byte {exc.start})") from None


def _check_whole(text: str, fmt: str) -> None:
    """Refuse a body that was cut short (its last number may be cut too: a counter that seems
    to have dropped)."""
    if fmt == "text" and text and not text.endswith("\n"):
        # The 0.0.4 text ends every line with a newline: without one the body was cut.
        raise BodyError("truncated", "the body does not end with a newline (cut short?)")
    if fmt == "openmetrics" and not text.rstrip("\n").endswith("# EOF"):
        # Cut short if what came is OpenMetrics up to its last whole line; else not OpenMetrics.
        try:
            list(parse_openmetrics(text[: text.rfind("\n") + 1] + "# EOF\n"))
        except Exception as exc:
            raise BodyError("garbage", f"the openmetrics body does not parse: {_short(exc)}") from None
        raise BodyError("truncated", "the OpenMetrics body does not end with '# EOF' (cut short?)")


def _add_family(
    body: Body, metric: Any, names: set[str], engine_label: str | None, include: tuple[str, ...]
) -> None:
    name = metric.name + "_info" if metric.type == "info" else metric.name
    _note_start_time(body, metric, name)
    if include and not any(fnmatchcase(name, pattern) for pattern in include):
        return
    if name in body.families or name in body.skipped:
        raise BodyError("garbage", f"family {name!r} appears twice in the body")
    if _is_created_gauge(metric, name, names):
        return  # the creation time the text format prints beside a counter or histogram
    reason = _skip_reason(metric, name, include)
    if reason is not None:
        body.skipped[name] = reason
    elif metric.type == "histogram":
        _histogram(body, metric, name, engine_label)
    else:
        _scalar(body, metric, name, COUNTER if metric.type == "counter" else GAUGE, engine_label)


def _note_start_time(body: Body, metric: Any, name: str) -> None:
    """Keep ``process_start_time_seconds`` when the body has exactly one (a restart's sign)."""
    if name == "process_start_time_seconds" and _is_gauge(metric) and len(metric.samples) == 1:
        body.start_time = float(metric.samples[0].value)


def _is_gauge(metric: Any) -> bool:
    return metric.type in ("gauge", "unknown")


def _is_created_gauge(metric: Any, name: str, names: set[str]) -> bool:
    return _is_gauge(metric) and name.endswith("_created") and name[: -len("_created")] in names


def _skip_reason(metric: Any, name: str, include: tuple[str, ...]) -> str | None:
    """Why a family is left out, or None when the store has a kind for it."""
    if name.startswith(RESERVED_PREFIX):
        return f"names starting with {RESERVED_PREFIX!r} are redis_stats' own"
    if not include and any(fnmatchcase(name, pattern) for pattern in PROCESS_FAMILIES):
        return "it describes the source's own process, not what it serves (--family stores it)"
    if metric.type in ("summary", "gaugehistogram") or any(s.native_histogram for s in metric.samples):
        return f"a {metric.type} has no kind in the store (counters, gauges, histograms)"
    return None


def _check_escaping(parsed: list[Any], names: set[str]) -> None:
    """Refuse a body whose samples were renamed apart from their TYPE line (see fetch.ACCEPT)."""
    for metric in parsed:
        if metric.type != "unknown" and not metric.samples and ":" in metric.name:
            escaped = metric.name.replace(":", "_")
            if any(other.startswith(escaped) for other in names if other != metric.name):
                raise BodyError(
                    "garbage",
                    f"family {metric.name!r} has no samples but {escaped!r}... has: the server "
                    "escaped ':' in sample names only (prometheus_client's OpenMetrics without "
                    "escaping=allow-utf-8); scrape it with --format text",
                )


def _engine_of(labels: dict[str, str], engine_label: str | None, family: str) -> int:
    if engine_label is None or engine_label not in labels:
        return 0
    raw = labels.pop(engine_label)
    if not raw.isdigit() or not raw.isascii():
        raise BodyError(
            "engine_label",
            f"family {family!r}: label {engine_label}={raw[:40]!r} is not an engine index (an "
            "integer >= 0); pass --engine-label for the label that holds it, or none",
        )
    return int(raw)


def _label_names(label_sets: list[dict[str, str]], drop: tuple[str, ...]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for labels in label_sets:
        for label in labels:
            if label not in drop:
                seen.setdefault(label, None)
    return tuple(seen)


def _spec(
    name: str, kind: str, help_text: str, labels: tuple[str, ...], buckets: tuple[float, ...] = ()
) -> MetricSpec:
    try:
        return MetricSpec(name, kind, help_text, labels, buckets=buckets)
    except CatalogError as exc:
        raise BodyError("garbage", f"family {name!r} cannot be stored: {exc}") from None


def _series_key(
    labels: dict[str, str], engine_label: str | None, family: str, label_names: tuple[str, ...]
) -> tuple[int, tuple[str, ...]]:
    """A series' key in :attr:`Family.series`: its engine and its label values in spec order."""
    engine = _engine_of(labels, engine_label, family)
    return engine, tuple(labels.get(label, "") for label in label_names)


def _scalar(body: Body, metric: Any, name: str, kind: str, engine_label: str | None) -> None:
    # The samples of the family's own value: a counter's _total (OpenMetrics also has _created).
    wanted = {f"{metric.name}_total"} if kind == COUNTER else {name, metric.name}
    samples = [s for s in metric.samples if s.name in wanted]
    label_sets = [dict(s.labels) for s in samples]
    drop = (engine_label,) if engine_label else ()
    spec = _spec(name, kind, metric.documentation, _label_names(label_sets, drop))
    if not samples:
        return  # declared without a series yet: nothing to store
    fam = Family(spec)
    for sample, labels in zip(samples, label_sets):
        key = _series_key(labels, engine_label, name, spec.labels)
        if key in fam.series:
            raise BodyError("garbage", f"family {name!r}: series {dict(sample.labels)} appears twice")
        value = float(sample.value)
        if kind == COUNTER and not 0 <= value < math.inf:
            # One series the store cannot take costs that series, never the body (issue 32).
            body.skipped[f"{name}{dict(sample.labels)}"] = f"a counter at {value!r}, not a finite number >= 0"
            continue
        fam.series[key] = _number(value)
    body.families[name] = fam


@dataclass
class _Samples:
    """One histogram series as its samples give it: ``{le: cumulative count}``, _sum, _count."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float | None = None
    count: float | None = None


_LabelItems = tuple[tuple[str, str], ...]


def _histogram(body: Body, metric: Any, name: str, engine_label: str | None) -> None:
    groups = _group_samples(metric, name)
    _leave_out_unfit_sums(body, name, groups)
    drop = ("le", engine_label) if engine_label else ("le",)
    label_names = _label_names([dict(k) for k in groups], drop)
    bounds, series = _histogram_series(groups, name, engine_label, label_names)
    if bounds is None:
        return  # declared, never observed: nothing to store yet, and no buckets to define it with
    if not bounds:
        body.skipped[name] = "a histogram with only the +Inf bucket has no bounds to store"
        return
    fam = Family(_spec(name, HISTOGRAM, metric.documentation, label_names, bounds), series)
    body.families[name] = fam


def _group_samples(metric: Any, name: str) -> dict[_LabelItems, _Samples]:
    """A histogram family's samples by series (its labels but ``le``)."""
    groups: dict[_LabelItems, _Samples] = {}
    for s in metric.samples:
        labels = dict(s.labels)
        is_bucket = s.name == f"{name}_bucket"
        le = labels.pop("le", None) if is_bucket else None
        group = groups.setdefault(tuple(sorted(labels.items())), _Samples())
        if is_bucket:
            _add_bucket(group, le, s, name)
        elif s.name == f"{name}_sum":
            group.total = float(s.value)
        elif s.name == f"{name}_count":
            group.count = float(s.value)
    return groups


def _add_bucket(group: _Samples, le: str | None, sample: Any, name: str) -> None:
    if le is None:
        raise BodyError("garbage", f"histogram {name!r}: a bucket without 'le'")
    try:
        bound = float(le)
    except ValueError:
        raise BodyError("garbage", f"histogram {name!r}: le={le[:40]!r} is not a number") from None
    if bound in group.buckets:
        raise BodyError("garbage", f"histogram {name!r}{dict(sample.labels)}: bucket appears twice")
    group.buckets[bound] = float(sample.value)


def _histogram_series(
    groups: dict[_LabelItems, _Samples], name: str, engine_label: str | None, label_names: tuple[str, ...]
) -> tuple[tuple[float, ...] | None, dict[tuple[int, tuple[str, ...]], Any]]:
    """The family's finite bounds (None without a series) and its series' values, every series
    checked: the same bounds as the first, whole cumulative counts, a _count and _sum that fit."""
    bounds: tuple[float, ...] | None = None
    series: dict[tuple[int, tuple[str, ...]], Any] = {}
    for key, group in groups.items():
        where = f"histogram {name!r}{dict(key)}"
        finite = _finite_bounds(group, where)
        if bounds is None:
            bounds = finite
        elif finite != bounds:
            raise BodyError("garbage", f"{where}: its buckets differ from the family's first series")
        value = _histogram_value(group, where)
        skey = _series_key(dict(key), engine_label, name, label_names)
        if skey in series:
            raise BodyError("garbage", f"{where}: series appears twice")
        series[skey] = value
    return bounds, series


def _leave_out_unfit_sums(body: Body, name: str, groups: dict[_LabelItems, _Samples]) -> None:
    """Leave out the series whose _sum is not finite (a NaN or an infinity observed: the store's
    histograms add finite sums): one series the store cannot take costs that series, never the
    body, nor is it shown at 0 (issue 32)."""
    for key, group in list(groups.items()):
        if group.total is not None and not math.isfinite(group.total):
            body.skipped[f"{name}{dict(key)}"] = f"a histogram whose _sum is {group.total!r}"
            del groups[key]


def _finite_bounds(group: _Samples, where: str) -> tuple[float, ...]:
    bounds = sorted(group.buckets)
    if not bounds or bounds[-1] != math.inf:
        raise BodyError("garbage", f"{where}: no +Inf bucket")
    return tuple(bounds[:-1])


def _histogram_value(group: _Samples, where: str) -> tuple[float, list[int]]:
    """A series' ``(sum, per-bucket counts)`` from its cumulative buckets (sorted by bound)."""
    cumulative = [group.buckets[b] for b in sorted(group.buckets)]
    counts: list[int] = []
    previous = 0.0
    for c in cumulative:
        if not (c.is_integer() and previous <= c < _EXACT_INT):
            raise BodyError("garbage", f"{where}: bucket counts {cumulative} are not cumulative integers")
        counts.append(int(c - previous))
        previous = c
    if group.count is not None and group.count != cumulative[-1]:
        raise BodyError(
            "garbage", f"{where}: _count {group.count!r} is not the +Inf bucket {cumulative[-1]!r}"
        )
    total = group.total if group.total is not None else 0.0
    if math.isnan(total):
        raise BodyError("garbage", f"{where}: _sum is NaN")
    return total, counts
