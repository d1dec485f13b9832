"""Who is up: the one rule every reader applies, from what the writers stored in Redis.

A reader must not decide liveness by a setting of its own: ``redis-stats top``, the exporter, a
view inside vLLM, the log line, ``inspect`` and ``/snapshot`` would disagree about the same engine
at the same moment (they did: ``top`` defaulted to 30 s while the demo's writers flush for 10 s).
So each writer stores its own ``stale_after`` (``stale_ms`` in its stats hash, see
docs/key-schema.md) and every reader judges by it, at the server's clock:

- a **writer** is live when it has not closed and its last heartbeat is at most its own
  ``stale_ms`` old;
- an **engine** is up when its last heartbeat is at most the largest ``stale_ms`` of the writers
  holding chunks in it old, and at least one of those writers is live (an engine whose writers all
  closed cleanly is down at once, not ``stale_after`` later).

A writer that stored no ``stale_ms`` (a version before this rule) is judged by the largest value
the other writers of the namespace stored, and only when none did by the reader's own setting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

STALE_FIELD = "stale_ms"
"""The field of a writer's stats hash that holds its ``stale_after`` in milliseconds."""


def declared_ms(text: str | None) -> float | None:
    """A writer's ``stale_ms`` field as every reader and gc take it: a positive finite number of
    milliseconds, else None (the writer declared nothing usable)."""
    if text is None:
        return None
    try:
        ms = float(text)
    except ValueError:
        return None
    return ms if math.isfinite(ms) and ms > 0 else None


def _declared(stats: Mapping[str, str]) -> float | None:
    return declared_ms(stats.get(STALE_FIELD))


class Liveness:
    """The rule of the module docstring for one read: its server time (ms), the ``stale_ms``
    each writer declared, and the fallback for writers that declared none. Immutable: a read
    builds its own, so reads that run at once in several threads share nothing."""

    __slots__ = ("declared", "fallback_ms", "judge_owners", "now_ms")

    def __init__(
        self, now_ms: float, declared: dict[str, float], fallback_ms: float, *, judge_owners: bool = True
    ) -> None:
        self.now_ms = now_ms
        self.declared = declared
        self.fallback_ms = fallback_ms
        # False when the writers zset could not be read: no writer is known, so engines are
        # judged by their own heartbeats alone (one bad key must not take every engine down).
        self.judge_owners = judge_owners

    @classmethod
    def of(
        cls,
        now_ms: float,
        stats: Mapping[str, Mapping[str, str]],
        default_ms: float,
        *,
        judge_owners: bool = True,
    ) -> Liveness:
        """The rule for a read at *now_ms* whose writers stored *stats* (writer -> its stats
        hash); *default_ms* applies only when no writer declared its ``stale_ms``."""
        declared = {wid: ms for wid, st in stats.items() if (ms := _declared(st)) is not None}
        return cls(now_ms, declared, max(declared.values(), default=default_ms), judge_owners=judge_owners)

    def stale_ms(self, writer: str) -> float:
        """How long *writer* may stay silent and still be live."""
        return self.declared.get(writer, self.fallback_ms)

    def age(self, score: float) -> float:
        """Seconds since a heartbeat stored as *score* (ms; negative: closed at ``-score``)."""
        return max(0.0, (self.now_ms - abs(score)) / 1000.0)

    def writer_live(self, writer: str, score: float) -> bool:
        """Whether *writer*, whose entry of a ``writers`` zset is *score*, is live."""
        return score >= 0 and self.age(score) * 1000.0 <= self.stale_ms(writer)

    def live_in(self, flat: Any) -> set[str]:
        """The live writers of one ``writers`` zset read as ``[id, score, ...]`` (none when it
        could not be read: no writer is known to be live there)."""
        if flat.__class__ is not list:
            return set()
        it = iter(flat)
        return {wid for wid, score in zip(it, it) if self.writer_live(wid, float(score))}

    def engine_up(self, score: float, owners: Iterable[str], live: set[str]) -> bool:
        """Whether an engine whose heartbeat is *score* is up, given the writers holding chunks
        in it (*owners*) and the writers live where it was read (*live*)."""
        owners = set(owners)
        if not owners or not self.judge_owners:
            return self.age(score) * 1000.0 <= self.fallback_ms
        limit = max(self.stale_ms(w) for w in owners)
        return self.age(score) * 1000.0 <= limit and not owners.isdisjoint(live)
