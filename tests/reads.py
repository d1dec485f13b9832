"""What the read tests compare: a text without what changes from one scrape to the next, each
sample's number exactly, and a snapshot's series per engine."""

from __future__ import annotations

from typing import Any


def stable(text: str) -> list[str]:
    """*text*'s lines but those of durations and ages (they change from one scrape to the next)."""
    return [x for x in text.splitlines() if "duration" not in x and "age_seconds" not in x]


def texts(found: dict[Any, float]) -> dict[Any, str]:
    """Each sample's number, exactly (repr: NaN equals NaN; the parser gives "0" as an int, and
    an integer beyond a float as an int: its float is inf, as Prometheus reads it)."""
    return {k: repr(float(str(v))) for k, v in found.items()}


def series(snap: Any) -> dict[int, Any]:
    """A snapshot's counters, gauges and histograms per engine, sorted."""
    return {
        e: [sorted(d.items()) for d in (s.counters, s.gauges, s.histograms)] for e, s in snap.engines.items()
    }
