"""What a valid stored value is, and what number it stands for: one rule for the bulk read and
the line-by-line read of an engine's hash (:mod:`redis_stats._core.groups`), so both skip the
same data and show the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from itertools import pairwise
from math import fsum, isnan, nan
from math import inf as _INF
from operator import add
from typing import Any

from prometheus_client.utils import floatToGoString

# A number as Prometheus' text format writes it: what float() takes,
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


def histogram_numbers(raw: Any, size: int) -> tuple[str, list[str], list[int] | list[float]] | None:
    """A stored histogram value ``"<sum> <c0> ... <cN>"`` (*size* cumulative counts, ``+Inf``
    last) as (sum text, count texts, counts as numbers: ints when they are all integers, as the
    writers store them), or None when it is malformed: a wrong number of parts, a part that is
    not a number, a negative count or counts that go down."""
    if raw.__class__ is not str:
        return None
    parts = raw.split(" ")
    total = _sum_text(parts[0])
    if len(parts) != size + 1 or total is None:
        return None
    counts = _counts(parts[1:])
    return None if counts is None else (total, counts[0], counts[1])


def _sum_text(text: str) -> str | None:
    """A histogram's sum as sample text, None if it is not a number (:func:`number_text`'s
    rule, but for an integer of any length: a sum is a float)."""
    if text.strip(NUMBER_CHARS):
        return _INFINITIES.get(text.lower())
    try:
        float(text)
    except ValueError:
        return None
    return text


def _counts(texts: list[str]) -> tuple[list[str], list[int] | list[float]] | None:
    """A histogram's cumulative count texts as (texts, numbers), or None when one is not a
    number, is negative or is below the one before it."""
    joined = "".join(texts)
    if joined.isdigit() and joined.isascii() and all(texts):  # integers: what the flush writes
        ints = [] if max(map(len, texts)) > MAX_DIGITS else [*map(int, texts)]
        return (texts, ints) if ints and ints == sorted(ints) else None
    return _float_counts(texts)


def _float_counts(texts: list[str]) -> tuple[list[str], list[float]] | None:
    """:func:`_counts` of counts that are not all plain integers (``5.0``, ``1e5``)."""
    checked = [number_text(c) for c in texts]
    if None in checked:
        return None
    values = [float(t) for t in checked]  # type: ignore[arg-type]
    if values[0] < 0 or any(b < a for a, b in pairwise(values)):
        return None
    return checked, values  # type: ignore[return-value]


def roll_up(mode: str, readings: Sequence[tuple[float, float, str]]) -> float:
    """A gauge series' value over its live writers' *readings* ``(stamp, value, value text)``
    (as :func:`gauge_parts` gives them, in the order the writers' chunks were read), by the
    gauge's *mode*: ``mostrecent`` the value with the newest stamp (the first of equals);
    ``sum``, ``max``, ``min`` the roll-up of the values."""
    if mode == "mostrecent":
        best = readings[0]
        for reading in readings:
            if reading[0] > best[0]:
                best = reading
        return best[1]
    values = [reading[1] for reading in readings]
    # (reduce, not sum(): sum() starts from 0, so one reading of -0.0 would come back as 0.0)
    return reduce(add, values) if mode == "sum" else max(values) if mode == "max" else min(values)


def float_sum(values: Sequence[float]) -> float:
    """The sum of *values*, correctly rounded (``math.fsum``), and never an exception: +-inf when
    it lies beyond the float range (``fsum`` raises OverflowError on the way there, even when
    the sum itself would end in range: two engines at 1.7e308 and a third at -1.7e308), NaN when
    *values* hold both infinities."""
    try:
        return fsum(values)
    except OverflowError:
        # Scaled by a power of two (exact), no partial sum can leave the range; scaled back,
        # the sum is +-inf only when it truly lies beyond it.
        scale = 2.0 ** (len(values).bit_length() + 1)
        return fsum([v / scale for v in values]) * scale
    except ValueError:  # inf + -inf
        return nan


def float_mean(values: Sequence[float], total: float) -> float:
    """The mean of *values* (not empty) whose :func:`float_sum` is *total*: finite whenever
    every value is, also when their sum is not."""
    if total - total == 0:  # finite
        return total / len(values)
    return float_sum([v / len(values) for v in values])


# Below it, float() of an int is float() of its text; from 2**1024 on, float() of an int raises.
_FLOAT_BOUND = 10**308


def counter_number(text: str | None) -> int | float | None:
    """A counter's sample text (as :func:`number_text` gives it; None: not a number) as the
    number a read adds up: an int when it is an integer below 10**308 (exact, however many
    writers), else a float."""
    if text is None:
        return None
    if text.isdigit():
        value = int(text)
        if value < _FLOAT_BOUND:
            return value
    return float(text)


def go_floats(values: list[float]) -> list[str]:
    """``floatToGoString`` of each of *values*, with ``repr`` (one pass in C) where the two
    agree: finite values below 1e6 (Go switches to an exponent from there on; ``repr`` later)."""
    if values and -_INF < min(values) and max(values) < 1e6 and not any(map(isnan, values)):
        return [*map(repr, values)]
    return [floatToGoString(v) for v in values]
