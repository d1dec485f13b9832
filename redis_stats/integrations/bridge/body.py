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
format prints beside counters and histograms (the store keeps no creation time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM, RESERVED_PREFIX, CatalogError, MetricSpec

__all__ = ["Body", "BodyError", "Family", "parse_body", "parser_for"]

OPENMETRICS = "application/openmetrics-text"
TEXT = "text/plain"

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
    of family names to keep (empty: every family)."""
    fmt = parser_for(content_type)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError("garbage", f"the body is not UTF-8 (byte {exc.start})") from None
    if fmt == "text" and text and not text.endswith("\n"):
        # The 0.0.4 text ends every line with a newline: without one the body was cut, and its
        # last number may be cut too (a counter that seems to have dropped).
        raise BodyError("truncated", "the body does not end with a newline (cut short?)")
    if fmt == "openmetrics" and not text.rstrip("\n").endswith("# EOF"):
        # Cut short if what came is OpenMetrics up to its last whole line; else not OpenMetrics.
        try:
            list(parse_openmetrics(text[: text.rfind("\n") + 1] + "# EOF\n"))
        except Exception as exc:
            raise BodyError("garbage", f"the openmetrics body does not parse: {_short(exc)}") from None
        raise BodyError("truncated", "the OpenMetrics body does not end with '# EOF' (cut short?)")
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


def _add_family(
    body: Body, metric: Any, names: set[str], engine_label: str | None, include: tuple[str, ...]
) -> None:
    typ, name = metric.type, metric.name
    if typ == "info":
        name += "_info"
    if name == "process_start_time_seconds" and typ in ("gauge", "unknown") and len(metric.samples) == 1:
        body.start_time = float(metric.samples[0].value)
    if include and not any(fnmatchcase(name, pattern) for pattern in include):
        return
    if name in body.families or name in body.skipped:
        raise BodyError("garbage", f"family {name!r} appears twice in the body")
    if typ in ("gauge", "unknown") and name.endswith("_created") and name[: -len("_created")] in names:
        return  # the creation time the text format prints beside a counter or histogram
    if name.startswith(RESERVED_PREFIX):
        body.skipped[name] = f"names starting with {RESERVED_PREFIX!r} are redis_stats' own"
        return
    if typ in ("summary", "gaugehistogram") or any(s.native_histogram for s in metric.samples):
        body.skipped[name] = f"a {typ} has no kind in the store (counters, gauges, histograms)"
        return
    kind = {"counter": COUNTER, "histogram": HISTOGRAM}.get(typ, GAUGE)
    if kind == HISTOGRAM:
        _histogram(body, metric, name, engine_label)
    else:
        _scalar(body, metric, name, kind, engine_label)


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
        engine = _engine_of(labels, engine_label, name)
        key = (engine, tuple(labels.get(label, "") for label in spec.labels))
        if key in fam.series:
            raise BodyError("garbage", f"family {name!r}: series {dict(sample.labels)} appears twice")
        value = float(sample.value)
        if kind == COUNTER and not 0 <= value < math.inf:
            raise BodyError(
                "garbage", f"counter {name!r}{dict(sample.labels)}: {value!r} is not a number >= 0"
            )
        fam.series[key] = _number(value)
    body.families[name] = fam


def _histogram(body: Body, metric: Any, name: str, engine_label: str | None) -> None:
    # Per series (its labels but le): {le: cumulative count}, sum, count.
    groups: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in metric.samples:
        labels = dict(s.labels)
        le = labels.pop("le", None) if s.name == f"{name}_bucket" else None
        group = groups.setdefault(tuple(sorted(labels.items())), {"buckets": {}, "sum": None, "count": None})
        if s.name == f"{name}_bucket":
            if le is None:
                raise BodyError("garbage", f"histogram {name!r}: a bucket without 'le'")
            try:
                bound = float(le)
            except ValueError:
                raise BodyError("garbage", f"histogram {name!r}: le={le[:40]!r} is not a number") from None
            if bound in group["buckets"]:
                raise BodyError("garbage", f"histogram {name!r}{dict(s.labels)}: bucket appears twice")
            group["buckets"][bound] = float(s.value)
        elif s.name == f"{name}_sum":
            group["sum"] = float(s.value)
        elif s.name == f"{name}_count":
            group["count"] = float(s.value)
    drop = ("le", engine_label) if engine_label else ("le",)
    label_names = _label_names([dict(k) for k in groups], drop)
    layout: tuple[float, ...] | None = None
    series: dict[tuple[int, tuple[str, ...]], Any] = {}
    for key, group in groups.items():
        where = f"histogram {name!r}{dict(key)}"
        bounds = sorted(group["buckets"])
        if not bounds or bounds[-1] != math.inf:
            raise BodyError("garbage", f"{where}: no +Inf bucket")
        finite = tuple(bounds[:-1])
        if layout is None:
            layout = finite
        elif finite != layout:
            raise BodyError("garbage", f"{where}: its buckets differ from the family's first series")
        cumulative = [group["buckets"][b] for b in bounds]
        counts: list[int] = []
        previous = 0.0
        for c in cumulative:
            if not (c.is_integer() and previous <= c < _EXACT_INT):
                raise BodyError("garbage", f"{where}: bucket counts {cumulative} are not cumulative integers")
            counts.append(int(c - previous))
            previous = c
        if group["count"] is not None and group["count"] != cumulative[-1]:
            raise BodyError(
                "garbage", f"{where}: _count {group['count']!r} is not the +Inf bucket {cumulative[-1]!r}"
            )
        total = group["sum"] if group["sum"] is not None else 0.0
        if math.isnan(total):
            raise BodyError("garbage", f"{where}: _sum is NaN")
        labels = dict(key)
        engine = _engine_of(labels, engine_label, name)
        skey = (engine, tuple(labels.get(label, "") for label in label_names))
        if skey in series:
            raise BodyError("garbage", f"{where}: series appears twice")
        series[skey] = (total, counts)
    if layout is None:
        return  # declared, never observed: nothing to store yet, and no buckets to define it with
    if not layout:
        body.skipped[name] = "a histogram with only the +Inf bucket has no bounds to store"
        return
    fam = Family(_spec(name, HISTOGRAM, metric.documentation, label_names, layout), series)
    body.families[name] = fam
