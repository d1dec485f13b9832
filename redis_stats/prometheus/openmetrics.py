"""OpenMetrics for ``/metrics``: which format a request gets, and OpenMetrics 1.0 from the text.

The format is chosen from ``Accept`` by prometheus_client's ``choose_encoder``, as its own server
does (:func:`negotiate`, hardened against headers it cannot parse). OpenMetrics 1.0, what
Prometheus asks for first by default, is the fast renderer's Prometheus text rewritten by
:func:`openmetrics_from_text` (the same samples; a few metadata lines differ).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

from redis_stats.prometheus.exposition import line_starts

__all__ = ["OMITTED", "OPENMETRICS_1_0", "negotiate", "openmetrics_from_text"]

OPENMETRICS_1_0 = "application/openmetrics-text; version=1.0.0; charset=utf-8"

# A version prometheus_client may echo back into Content-Type: digits only (ASCII), three parts.
_VERSION = re.compile(r"version=([^;]*)")
_SAFE_VERSION = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", re.ASCII)


def negotiate(accept: str) -> tuple[Callable[[Any], bytes], str]:
    """(encoder, Content-Type) for an ``Accept`` header, as ``choose_encoder`` picks them, except
    that a header it cannot parse gets the Prometheus text format instead of an exception.

    ``choose_encoder`` raises on a version that is not numbers (``version=abc``, ``1.x``) and
    echoes whatever parses (``1.0.0.\\x01``) into the answer's Content-Type; any client could
    then make every request a 500 and a traceback in the log. A version that is not three ASCII
    numbers is treated as no OpenMetrics request at all.
    """
    try:
        encoder, content_type = choose_encoder(accept)
    except (TypeError, ValueError):
        return generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    if content_type != CONTENT_TYPE_PLAIN_0_0_4:
        version = _VERSION.search(content_type)
        if version is None or not _SAFE_VERSION.fullmatch(version.group(1)):
            return generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    return encoder, content_type


OMITTED = "redis_stats_openmetrics_samples_omitted"
OMITTED_HELP = (
    "Samples of this scrape left out of OpenMetrics, which cannot carry them: a counter's or a "
    "histogram's value below 0 or NaN (a histogram's sum after negative observations)."
)


def openmetrics_from_text(text: str) -> str:
    """OpenMetrics 1.0 from Prometheus text 0.0.4, as prometheus_client writes both.

    The samples are the same; the metadata differs in three ways: a counter's ``# HELP``/``# TYPE``
    name has no ``_total`` (its samples keep it), ``"`` is escaped in ``# HELP`` text, and the
    body ends with ``# EOF``. Only the ``#`` lines are touched (found with ``str.find``: a few
    hundred in a multi-megabyte body), so this costs a small fraction of a render, where
    prometheus_client's OpenMetrics writer over ``collect()`` costs several renders.

    One more difference: OpenMetrics holds a counter's and a histogram's samples to be counters,
    never below 0 nor NaN, and a parser refuses the whole body for one of them (a histogram's
    ``_sum`` after negative observations, or with +Inf and -Inf summed over writers). Such a
    sample is left out (the text format carries it) and counted in
    ``redis_stats_openmetrics_samples_omitted``, written when it is not 0.
    """
    lines = _comment_lines(text)
    counters = _counter_names(text, lines)
    edits = [(start, end, _openmetrics_comment(text[start:end], counters)) for start, end in lines]
    unfit = _unfit_samples(text, counters, _histogram_names(text, lines))
    edits += [(start, end, "") for start, end in unfit]
    out = []
    done = 0
    for start, end, line in sorted(edits, key=lambda edit: edit[0]):
        if line is None:
            continue
        out.append(text[done:start])
        out.append(line)
        done = end
    out.append(text[done:])
    if text and not text.endswith("\n"):
        out.append("\n")
    if unfit:
        out.append(f"# HELP {OMITTED} {OMITTED_HELP}\n# TYPE {OMITTED} gauge\n{OMITTED} {len(unfit)}.0\n")
    out.append("# EOF\n")
    return "".join(out)


def _histogram_names(text: str, lines: list[tuple[int, int]]) -> set[str]:
    """The histograms' names, from their ``# TYPE`` lines."""
    names = set()
    for start, end in lines:
        line = text[start:end]
        if line.startswith("# TYPE ") and line.endswith(" histogram"):
            names.add(line[7 : -len(" histogram")])
    return names


_COUNTER_LIKE = ("_sum", "_count", "_bucket")


def _unfit(value: str) -> bool:
    """A sample value below 0 or NaN (``-0.0`` is neither)."""
    try:
        number = float(value)
    except ValueError:
        return False
    return number != number or number < 0


def _count_before(text: str, start: int, base: str, labels: str) -> list[tuple[int, int]]:
    """The ``_count`` line of histogram *base* with *labels* just before *start*, if it is there."""
    before = text.rfind("\n", 0, max(start - 1, 0)) + 1
    prefix = f"{base}_count{labels} "
    return [(before, start)] if start and text.startswith(prefix, before) else []


def _unfit_samples(text: str, counters: set[str], histograms: set[str]) -> list[tuple[int, int]]:
    """Where the sample lines OpenMetrics cannot carry are (start, end with the newline): a
    counter's ``_total``, a histogram's ``_sum``, ``_count`` or ``_bucket`` whose value is below 0
    or NaN. Found with ``str.find`` on the value's first characters: rare (a gauge below 0 is the
    usual find, looked at and kept)."""
    found = []
    for marker in (" -", " NaN"):
        i = text.find(marker)
        while i != -1:
            end = text.find("\n", i)
            end = len(text) if end == -1 else end
            start = text.rfind("\n", 0, i) + 1
            # The value is a sample line's last field (a label value holds no newline, and a
            # space in one comes before the value's): anything else is not a value.
            if " " not in text[i + 1 : end] and not text.startswith("#", start) and _unfit(text[i + 1 : end]):
                brace = text.find("{", start, i)
                name = text[start : i if brace == -1 else brace]
                base, _, suffix = name.rpartition("_")
                if (suffix == "total" and base in counters) or (
                    "_" + suffix in _COUNTER_LIKE and base in histograms
                ):
                    found.append((start, min(end + 1, len(text))))
                    if suffix == "sum":  # a _count needs its _sum: the line before, as written
                        labels = text[start + len(name) : i]
                        found += _count_before(text, start, base, labels)
            i = text.find(marker, end)
    return found


def _comment_lines(text: str) -> list[tuple[int, int]]:
    """Where each ``#`` line of *text* starts and ends (its newline not included)."""
    lines = []
    for start in line_starts(text, "#"):
        end = text.find("\n", start)
        lines.append((start, len(text) if end == -1 else end))
    return lines


def _counter_names(text: str, lines: list[tuple[int, int]]) -> set[str]:
    """The counters' names without ``_total``, from their ``# TYPE`` lines."""
    counters = set()
    for start, end in lines:
        line = text[start:end]
        if line.startswith("# TYPE ") and line.endswith("_total counter"):
            counters.add(line[7 : -len("_total counter")])
    return counters


def _openmetrics_comment(line: str, counters: set[str]) -> str | None:
    """A ``# HELP`` or ``# TYPE`` line as OpenMetrics writes it; None for any other comment."""
    kind, _, rest = line[2:].partition(" ")
    name, _, tail = rest.partition(" ")
    if kind not in ("HELP", "TYPE"):
        return None
    if name.endswith("_total") and name[:-6] in counters:
        name = name[:-6]
    if kind == "HELP":
        tail = tail.replace('"', '\\"')
    return f"# {kind} {name} {tail}"
