"""Who is up: the one rule every reader and gc apply, from what the writers stored in Redis.

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

What Redis holds is checked as the writer's own config is (:func:`declared_ms`): a stored value
that is not a number, or outside what ``StatsConfig`` accepts for ``stale_after``
(:data:`~redis_stats.config.MIN_STALE_AFTER` to :data:`~redis_stats.config.MAX_STALE_AFTER`), is
not used; a writer without a usable value (garbage, an older version, its stats hash lost) is
judged by :data:`DEFAULT_MS`, ``stale_after``'s default — never by another writer's value
(:func:`judged_ms`). gc (``ops/retention.py``, gc.lua) judges each writer by the same function,
so gc never removes a writer a reader calls live. An engine none of whose writers is known (the
writers' list unreadable) is judged by the largest usable value of the read, or the reader's own
setting when there is none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from redis_stats.config import DEFAULT_STALE_AFTER, MAX_STALE_AFTER, MIN_STALE_AFTER

STALE_FIELD = "stale_ms"
"""The field of a writer's stats hash that holds its ``stale_after`` in milliseconds."""

MIN_MS = MIN_STALE_AFTER * 1000
MAX_MS = MAX_STALE_AFTER * 1000
DEFAULT_MS = DEFAULT_STALE_AFTER * 1000
"""What a writer without a usable ``stale_ms`` is judged by (ms)."""


def declared_ms(text: str | None) -> float | None:
    """A writer's ``stale_ms`` field as every reader and gc take it: a number of milliseconds
    within :data:`MIN_MS`..:data:`MAX_MS` (what ``StatsConfig`` accepts for ``stale_after``), else
    None (the writer declared nothing usable)."""
    if text is None:
        return None
    try:
        ms = float(text)
    except ValueError:
        return None
    return ms if math.isfinite(ms) and MIN_MS <= ms <= MAX_MS else None


def judged_ms(declared: float | None) -> float:
    """How long (ms) a writer may stay silent and still be live, given what it declared
    (:func:`declared_ms` of its stored ``stale_ms``; None: nothing usable): that, else
    :data:`DEFAULT_MS`. Readers (:meth:`Liveness.stale_ms`) and gc
    (:func:`redis_stats.ops.namespaces.judged_stale`) both judge every writer by this."""
    return DEFAULT_MS if declared is None else declared


class Liveness:
    """The rule of the module docstring for one read: its server time (ms), the usable
    ``stale_ms`` each writer declared, and the fallback for engines none of whose writers is
    known. Immutable: a read builds its own, so reads that run at once in several threads share
    nothing."""

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
        hash); *default_ms* (the reader's own setting) applies only to engines none of whose
        writers is known, when no writer declared a usable ``stale_ms``."""
        declared: dict[str, float] = {}
        for wid, st in stats.items():
            ms = declared_ms(st.get(STALE_FIELD))
            if ms is not None:
                declared[wid] = ms
        return cls(now_ms, declared, max(declared.values(), default=default_ms), judge_owners=judge_owners)

    def stale_ms(self, writer: str) -> float:
        """How long *writer* may stay silent and still be live (:func:`judged_ms`)."""
        return judged_ms(self.declared.get(writer))

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
        limit = max(map(self.stale_ms, owners))
        return self.age(score) * 1000.0 <= limit and not owners.isdisjoint(live)
