"""The arithmetic of a read: a gauge's roll-up over writers, sums and means that never raise, and
numbers as Prometheus writes them. (What a stored text means is :mod:`redis_stats.codec`'s.)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from math import fsum, isnan, nan
from math import inf as _INF
from operator import add

from prometheus_client.utils import floatToGoString


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


def go_floats(values: list[float]) -> list[str]:
    """``floatToGoString`` of each of *values*, with ``repr`` (one pass in C) where the two
    agree: finite values below 1e6 (Go switches to an exponent from there on; ``repr`` later)."""
    if values and -_INF < min(values) and max(values) < 1e6 and not any(map(isnan, values)):
        return [*map(repr, values)]
    return [floatToGoString(v) for v in values]
