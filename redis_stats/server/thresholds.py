"""The live page's warning thresholds: what an operator sets (``--page-threshold``), checked once.

The page colours an engine's queue, KV cache, TTFT p99 or ITL p99 past its threshold and ranks
the engines that pass them first. A threshold is a number the operator sets (the same on every
poll, and shown on the page as set), its default when not set, or ``relative``: twice the median
of the up engines (KV: halfway from their median to full), never below the default, recomputed
at every poll (so that a fleet whose every engine is slow is not all flagged; the value then
moves with the fleet, and the page says so).

Grammar (``--page-threshold queue=10,ttft_p99=2s,kv=0.9``, the option repeatable)::

    queue     requests waiting, a number >= 0           queue=10
    kv        share of the KV cache used, 0 to 1         kv=0.9  kv=90%
    ttft_p99  seconds (s or ms; a bare number: s)        ttft_p99=2s  ttft_p99=500ms
    itl_p99   seconds                                    itl_p99=0.1  itl_p99=100ms
    any       relative                                   ttft_p99=relative
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "DEFAULTS",
    "RELATIVE",
    "Threshold",
    "page_thresholds",
    "parse_thresholds",
    "threshold_problems",
]

RELATIVE = "relative"

Threshold = float | str
"""A set value (in the figure's unit: requests, a share, seconds), or :data:`RELATIVE`."""

DEFAULTS: dict[str, float] = {"queue": 10.0, "kv": 0.9, "ttft_p99": 1.0, "itl_p99": 0.1}
"""Each threshold's name and its value when not set."""

_WHAT = {
    "queue": "a number of requests waiting >= 0 (queue=10)",
    "kv": "a share of the KV cache used, above 0 and at most 1 (kv=0.9, or kv=90%)",
    "ttft_p99": "a number of seconds above 0 (ttft_p99=2s, ttft_p99=500ms, or ttft_p99=2)",
    "itl_p99": "a number of seconds above 0 (itl_p99=0.1, itl_p99=100ms)",
}


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _value(name: str, text: str) -> float | None:
    """*text* as *name*'s value in its unit, None when it is none."""
    text = text.strip()
    if name == "kv" and text.endswith("%"):
        number = _number(text[:-1])
        return None if number is None else number / 100
    if name in ("ttft_p99", "itl_p99"):
        for suffix, scale in (("ms", 1e-3), ("s", 1.0)):
            if text.endswith(suffix):
                number = _number(text[: -len(suffix)])
                return None if number is None else number * scale
    return _number(text)


def _in_range(name: str, value: float) -> bool:
    if name == "queue":
        return value >= 0
    if name == "kv":
        return 0 < value <= 1
    return value > 0


# Names an operator may reach for first: the hint names the threshold they mean.
_MEANT = {
    "waiting": "queue",
    "requests_waiting": "queue",
    "ttft": "ttft_p99",
    "itl": "itl_p99",
    "kv_cache": "kv",
}


def _unknown(name: str) -> str:
    close = [_MEANT[name]] if name in _MEANT else difflib.get_close_matches(name, list(DEFAULTS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown threshold {name!r}{hint}: one of {', '.join(DEFAULTS)}"


def parse_thresholds(texts: Iterable[str]) -> dict[str, Threshold]:
    """``["queue=10,ttft_p99=2s", "kv=90%"]`` -> ``{"queue": 10.0, "ttft_p99": 2.0, "kv": 0.9}``.

    Raises ValueError naming the part that is wrong, why, and what to write instead.
    """
    out: dict[str, Threshold] = {}
    for text in texts:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, raw = part.partition("=")
            name = name.strip()
            if not sep or not raw.strip():
                raise ValueError(f"{part!r}: write NAME=VALUE, e.g. queue=10,ttft_p99=2s,kv=0.9")
            if name not in DEFAULTS:
                raise ValueError(f"{part!r}: {_unknown(name)}")
            if name in out:
                raise ValueError(f"{part!r}: {name} is given twice; give it once")
            if raw.strip() == RELATIVE:
                out[name] = RELATIVE
                continue
            value = _value(name, raw)
            if value is None or not _in_range(name, value):
                raise ValueError(f"{part!r}: {raw.strip()!r} is not {_WHAT[name]}, nor 'relative'")
            out[name] = value
    return out


def threshold_problems(thresholds: Mapping[str, Any]) -> list[str]:
    """What is wrong with a thresholds mapping given to the exporter (empty when usable)."""
    problems = []
    for name, value in thresholds.items():
        if name not in DEFAULTS:
            problems.append(f"page_thresholds: {_unknown(name)}")
        elif value != RELATIVE and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not _in_range(name, float(value))
        ):
            problems.append(f"page_thresholds {name}={value!r}: not {_WHAT[name]}, nor 'relative'")
    return problems


def page_thresholds(thresholds: Mapping[str, Threshold]) -> dict[str, dict[str, Any]]:
    """Every threshold as the page shows it: ``{"value": the set value or the default (the floor
    of a relative one), "relative": bool, "set": whether the operator gave it}``."""
    out = {}
    for name, default in DEFAULTS.items():
        given = thresholds.get(name)
        relative = given == RELATIVE
        value = default if given is None or relative else float(given)
        out[name] = {"value": value, "relative": relative, "set": given is not None}
    return out
