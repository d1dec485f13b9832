"""What a valid stored value is, and how several writers' values of one series add up: one
decision for both render paths (:mod:`redis_stats._core.snapshot` and the text renderer,
:mod:`redis_stats.prometheus.exposition`), so both skip the same data and print the same sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from math import inf as _INF
from math import isnan
from operator import add
from typing import Any

from prometheus_client.utils import floatToGoString

__all__ = [
    "MAX_DIGITS",
    "NUMBER_CHARS",
    "gauge_parts",
    "go_floats",
    "histogram_numbers",
    "histogram_parts",
    "number_text",
    "roll_up",
    "sum_counter_texts",
    "sum_histograms",
]

# -- what a valid stored value is: one decision for both render paths ---------------------------
#
# A number as Prometheus' text format and Redis' own HINCRBYFLOAT write it: what float() takes,
# but with no spaces, no "_" and no NaN (float() accepts all three; a NaN is no sample); the
# infinities come out as +Inf / -Inf. Checked with str methods, not a regex: this runs per sample.
NUMBER_CHARS = "0123456789.+-eE"
_INFINITIES = {"inf": "+Inf", "+inf": "+Inf", "-inf": "-Inf", "infinity": "+Inf", "+infinity": "+Inf"}
_INFINITIES["-infinity"] = "-Inf"
# An integer of more digits is not a count or a total: garbage. Python's int() refuses more than
# 4,300 digits by default (sys.set_int_max_str_digits, which may lower it to 640): without a
# bound, one such value in Redis would fail every read.
MAX_DIGITS = 600


def number_text(raw: Any) -> str | None:
    """*raw* (a stored counter or gauge value) as sample text, or None when it is not a number.

    Numbers come back unchanged (what the flush script writes, so the text renderer prints them
    as they are); ``inf`` forms as ``+Inf``/``-Inf``; anything else (NaN, spaces, ``1_000``,
    words) is None: the value is skipped and counted as ``bad_value``.
    """
    if raw.__class__ is not str:
        return None
    if raw.isdigit() and raw.isascii():
        return raw if len(raw) <= MAX_DIGITS else None
    if raw.strip(NUMBER_CHARS):  # letters, spaces, "_", other digits: only an infinity passes
        return _INFINITIES.get(raw.lower())
    try:
        float(raw)
    except ValueError:  # "", "1.2.3", "--1"
        return None
    return raw


def gauge_parts(raw: Any) -> tuple[float, float, str] | None:
    """A stored gauge value ``"<wall ms>|<value>"`` as (stamp, value, value as sample text), or
    None when either part is not a number (the value by :func:`number_text`'s rule, inlined:
    this runs for every gauge of every scrape)."""
    if raw.__class__ is not str:
        return None
    stamp_text, sep, value_text = raw.partition("|")
    try:
        stamp, value = float(stamp_text), float(value_text)
    except ValueError:
        return None
    if not sep or stamp != stamp or value != value:
        return None
    if value_text.strip(NUMBER_CHARS):  # float() took spaces, "_" or a word: only infinities
        text = _INFINITIES.get(value_text.lower())
        return None if text is None else (stamp, value, text)
    return stamp, value, value_text


def histogram_parts(raw: Any, size: int) -> tuple[str, list[str]] | None:
    """A stored histogram value ``"<sum> <c0> ... <cN>"`` (*size* cumulative counts, ``+Inf``
    last) as (sum text, count texts), or None when it is malformed: a wrong number of parts, a
    part that is not a number, a negative count or counts that go down."""
    found = histogram_numbers(raw, size)
    return None if found is None else (found[0], found[1])


def histogram_numbers(raw: Any, size: int) -> tuple[str, list[str], list[int] | list[float]] | None:
    """:func:`histogram_parts` and the counts as numbers (ints when they are all integers, as
    the writers store them), for adding up several writers' parts of a series."""
    if raw.__class__ is not str:
        return None
    parts = raw.split(" ")
    if len(parts) != size + 1:
        return None
    total = parts[0]
    if total.strip(NUMBER_CHARS):  # number_text's rule, inlined: this runs per series per scrape
        total = _INFINITIES.get(total.lower())  # type: ignore[assignment]
        if total is None:
            return None
    else:
        try:
            float(total)
        except ValueError:
            return None
    counts = parts[1:]
    joined = "".join(counts)
    if joined.isdigit() and joined.isascii() and all(counts):  # integers: what the flush writes
        if len(joined) > MAX_DIGITS and max(map(len, counts)) > MAX_DIGITS:
            return None
        ints = [*map(int, counts)]
        if ints != sorted(ints):
            return None
        return total, counts, ints
    texts = [number_text(c) for c in counts]
    if None in texts:
        return None
    values = [float(t) for t in texts]  # type: ignore[arg-type]
    if values[0] < 0 or any(b < a for a, b in pairwise(values)):
        return None
    return total, [_count_text(v) for v in values], values


def _count_text(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else floatToGoString(value)


def roll_up(mode: str, readings: Sequence[tuple[float, float, str]]) -> tuple[float, str | None]:
    """A gauge series' value over its live writers' *readings* ``(stamp, value, value text)``
    (as :func:`gauge_parts` gives them, in the order the writers' chunks were read), by the
    gauge's *mode*: ``mostrecent`` the reading with the newest stamp (the first of equals), with
    its text; ``sum``, ``max``, ``min`` the roll-up of the values, text None (format it with
    ``floatToGoString`` where text is wanted). The one roll-up both render paths use."""
    if mode == "mostrecent":
        best = readings[0]
        for reading in readings:
            if reading[0] > best[0]:
                best = reading
        return best[1], best[2]
    values = [reading[1] for reading in readings]
    return (sum(values) if mode == "sum" else max(values) if mode == "max" else min(values)), None


def sum_counter_texts(texts: Sequence[str]) -> str:
    """Sample text of the sum of a counter's values (valid sample texts, as :func:`number_text`
    gives them, one per writer), added in order: exact while they are all integers."""
    if all(t.isdigit() for t in texts):
        return str(sum(map(int, texts)))
    total = 0.0
    for t in texts:
        total += float(t)
    return str(floatToGoString(total))  # untyped in prometheus_client


def sum_histograms(found: Sequence[tuple[str, list[str], list[int] | list[float]]]) -> tuple[str, list[str]]:
    """(sum text, count texts) of two or more writers' parts of a histogram series (as
    :func:`histogram_numbers` gives them), added bucket by bucket, in order."""
    total = 0.0
    for parsed in found:
        total += float(parsed[0])
    sums: list[Any] = found[0][2]
    for parsed in found[1:]:
        sums = [*map(add, sums, parsed[2])]
    if all(type(parsed[2][0]) is int for parsed in found):  # integers, as writers store them
        return floatToGoString(total), [*map(str, sums)]
    return floatToGoString(total), [
        str(int(x)) if x.is_integer() and abs(x) < 1e15 else floatToGoString(x) for x in map(float, sums)
    ]


def go_floats(values: list[float]) -> list[str]:
    """``floatToGoString`` of each of *values*, with ``repr`` (one pass in C) where the two
    agree: finite values below 1e6 (Go switches to an exponent from there on; ``repr`` later)."""
    if values and -_INF < min(values) and max(values) < 1e6 and not any(map(isnan, values)):
        return [*map(repr, values)]
    return [floatToGoString(v) for v in values]
