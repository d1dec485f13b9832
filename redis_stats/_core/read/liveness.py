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

What Redis holds is checked as the writer's own config is (:func:`declared`): a stored value
that is not a number, or outside what ``StatsConfig`` accepts for ``stale_after``
(:data:`~redis_stats.config.MIN_STALE_AFTER` to :data:`~redis_stats.config.MAX_STALE_AFTER`), is
not used; a writer without a usable value (garbage, an older version, its stats hash lost) is
judged by ``stale_after``'s default (:data:`~redis_stats.config.DEFAULT_STALE_AFTER`) — never by
another writer's value (:func:`judged_ms`). gc (``ops/retention.py``, gc.lua) judges each writer
by the same function, so gc never removes a writer a reader calls live. An engine none of whose
writers is known (the writers' list unreadable) is judged by the largest usable value of the
read, or the reader's own setting when there is none.

A stored ``stale_ms`` below the same writer's stored ``flush_ms`` (its flush interval) is not
usable either (``StatsConfig`` refuses a ``stale_after`` shorter than ``flush_interval``): such a
writer would read down between two of its own flushes, so it is judged by the default.

**One state per engine** (:meth:`Liveness.engine_state`), the same everywhere (``/load``,
``/endpoints``, the endpoint views, ``/snapshot``, the live page, ``top``):

- ``up``: up as above, and its last heartbeat at most ``max(2 x flush, flush + 1 s)`` old,
  *flush* the largest ``flush_ms`` of the writers holding chunks in it (a writer
  that stored none: :data:`DEFAULT_FLUSH_MS`), never more than its stale limit. A heartbeat comes
  with every flush; one missed flush (a slow round trip, a collection, a retry) is still ``up``
  (the 2 x), and a short interval gets a second's slack for a busy host's stalls (the + 1 s);
- ``stale``: still up by the rule above (within ``stale_after``), but its heartbeat older than
  that: at least one flush was missed, so its numbers may be behind; a router should prefer
  other engines;
- ``down``: not up (silent past ``stale_after``, or every writer of it closed).

Each writer also stores the endpoint its engines are served behind (``endpoint``: see
``StatsConfig.endpoint``); an engine's endpoint is that of its live writer with the newest
heartbeat (:meth:`Liveness.endpoint_of`): a pod killed without a close whose engine came back at
once in a new pod under another endpoint is still "live" for its ``stale_after``, and the engine
is served behind the new pod, whatever the two endpoints' order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from redis_stats import config
from redis_stats.codec import ENDPOINT_FIELD, FLUSH_FIELD, STALE_FIELD
from redis_stats.config import MAX_STALE_AFTER, MIN_STALE_AFTER, is_endpoint

UP, STALE, DOWN = "up", "stale", "down"
"""An engine's states (:meth:`Liveness.engine_state`)."""

MIN_MS = MIN_STALE_AFTER * 1000
MAX_MS = MAX_STALE_AFTER * 1000

DEFAULT_FLUSH_MS = 1000.0
"""The flush interval (ms) a writer that stored no usable ``flush_ms`` is taken to flush at
(``flush_interval``'s default): for its engines' ``up`` / ``stale`` only."""

FRESH_SLACK_MS = 1000.0
"""How much older than one flush interval (ms) a heartbeat may be and its engine still ``up``."""


def _number(text: Any) -> float | None:
    if text.__class__ is not str:
        return None
    try:
        ms = float(text)
    except ValueError:
        return None
    return ms if math.isfinite(ms) else None


def declared(stale_text: Any, flush_text: Any) -> tuple[float | None, float | None]:
    """A writer's ``stale_ms`` and ``flush_ms`` fields as every reader and gc take them: the
    flush interval a number of milliseconds above 0 and at most :data:`MAX_MS` (``StatsConfig``
    keeps ``flush_interval`` within ``stale_after``); the stale limit a number of milliseconds
    within :data:`MIN_MS`..:data:`MAX_MS` (what ``StatsConfig`` accepts for ``stale_after``) and
    not below that usable flush interval (``StatsConfig`` refuses a ``stale_after`` shorter than
    ``flush_interval``). Each None where the writer declared nothing usable."""
    flush = _number(flush_text)
    if flush is not None and not 0 < flush <= MAX_MS:
        flush = None
    stale = _number(stale_text)
    if stale is not None and (not MIN_MS <= stale <= MAX_MS or (flush is not None and stale < flush)):
        stale = None
    return stale, flush


def judged_ms(declared: float | None) -> float:
    """How long (ms) a writer may stay silent and still be live, given what it declared
    (:func:`declared` of its stored ``stale_ms``; None: nothing usable): that, else
    ``stale_after``'s default, :data:`~redis_stats.config.DEFAULT_STALE_AFTER` (read here, at each
    judgement: the one setting readers and gc share). Readers (:meth:`Liveness.stale_ms`) and gc
    (:func:`redis_stats.ops.namespaces.judged_stale`) both judge every writer by this."""
    return config.DEFAULT_STALE_AFTER * 1000 if declared is None else declared


class Liveness:
    """The rule of the module docstring for one read: its server time (ms), the usable
    ``stale_ms`` each writer declared, and the fallback for engines none of whose writers is
    known. Immutable: a read builds its own, so reads that run at once in several threads share
    nothing."""

    __slots__ = ("beats", "declared", "endpoints", "fallback_ms", "flush", "judge_owners", "now_ms")

    def __init__(
        self,
        now_ms: float,
        declared: dict[str, float],
        fallback_ms: float,
        *,
        judge_owners: bool = True,
        flush: dict[str, float] | None = None,
        endpoints: dict[str, str] | None = None,
        beats: Mapping[str, float] | None = None,
    ) -> None:
        self.now_ms = now_ms
        self.declared = declared
        self.fallback_ms = fallback_ms
        # False when the writers zset could not be read: no writer is known, so engines are
        # judged by their own heartbeats alone (one bad key must not take every engine down).
        self.judge_owners = judge_owners
        self.flush = flush if flush is not None else {}
        self.endpoints = endpoints if endpoints is not None else {}
        self.beats = beats if beats is not None else {}  # writer -> its heartbeat (ms; < 0: closed)

    def blind(self) -> Liveness:
        """This rule for a shard whose writers zset could not be read (no writer known there)."""
        return Liveness(
            self.now_ms,
            self.declared,
            self.fallback_ms,
            judge_owners=False,
            flush=self.flush,
            endpoints=self.endpoints,
            beats=self.beats,
        )

    @classmethod
    def of(
        cls,
        now_ms: float,
        stats: Mapping[str, Mapping[str, str]],
        default_ms: float,
        *,
        judge_owners: bool = True,
        beats: Mapping[str, float] | None = None,
    ) -> Liveness:
        """The rule for a read at *now_ms* whose writers stored *stats* (writer -> its stats
        hash) and whose heartbeats are *beats* (writer -> its ``writers`` zset score);
        *default_ms* (the reader's own setting) applies only to engines none of whose writers is
        known, when no writer declared a usable ``stale_ms``."""
        stale: dict[str, float] = {}
        flush: dict[str, float] = {}
        endpoints: dict[str, str] = {}
        for wid, st in stats.items():
            ms, every = declared(st.get(STALE_FIELD), st.get(FLUSH_FIELD))
            if ms is not None:
                stale[wid] = ms
            if every is not None:
                flush[wid] = every
            where = st.get(ENDPOINT_FIELD)
            if is_endpoint(where):  # (a config refuses any other: garbage, written by hand)
                endpoints[wid] = where  # type: ignore[assignment]
        return cls(
            now_ms,
            stale,
            max(stale.values(), default=default_ms),
            judge_owners=judge_owners,
            flush=flush,
            endpoints=endpoints,
            beats=beats,
        )

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
        live = set()
        it = iter(flat)
        for wid, score in zip(it, it):
            if self.writer_live(wid, float(score)):
                live.add(wid)
        return live

    def engine_up(self, score: float, owners: Iterable[str], live: set[str]) -> bool:
        """Whether an engine whose heartbeat is *score* is up, given the writers holding chunks
        in it (*owners*) and the writers live where it was read (*live*)."""
        return self.engine_state(score, owners, live) != DOWN

    def engine_state(self, score: float, owners: Iterable[str], live: set[str]) -> str:
        """:data:`UP`, :data:`STALE` or :data:`DOWN` (module docstring) for an engine whose
        heartbeat is *score*, given the writers holding chunks in it (*owners*) and the writers
        live where it was read (*live*)."""
        owners = set(owners)
        age_ms = self.age(score) * 1000.0
        flush = self.flush
        if not owners or not self.judge_owners:
            limit = self.fallback_ms
            every = max(flush.values(), default=DEFAULT_FLUSH_MS)
        else:
            limit = max(map(self.stale_ms, owners))
            if owners.isdisjoint(live):
                return DOWN
            every = 0.0
            for w in owners:
                every = max(every, flush.get(w, DEFAULT_FLUSH_MS))
        if age_ms > limit:
            return DOWN
        # fresh while at most max(2 x flush, flush + 1 s) old (module docstring), within the limit
        return UP if age_ms <= min(max(2.0 * every, every + FRESH_SLACK_MS), limit) else STALE

    def newest_first(self, owners: Iterable[str], live: set[str]) -> tuple[str, ...]:
        """The writers an engine runs in: those of *owners* (holding chunks in it) that are live,
        or all of them when none is (a down engine: where it ran), newest heartbeat first, then by
        id. Their ids are ``host:pid[:role]:random``: the page shows the host (the pod)."""
        chosen = [w for w in owners if w in live] or list(owners)
        beats = self.beats
        return tuple(sorted(chosen, key=lambda w: (-abs(beats.get(w, 0.0)), w)))

    def endpoint_of(self, owners: Iterable[str], live: set[str] | None = None) -> str | None:
        """The endpoint an engine is served behind: that of the writer holding chunks in it
        (*owners*) with the newest heartbeat, among the live ones (*live*) when any stored one
        (several API servers of one pod share one; a dead pod's writer, live until its
        ``stale_after`` passes, has the older heartbeat), the smaller endpoint on a tie; None when
        none stored one."""
        endpoints, beats = self.endpoints, self.beats
        # newest heartbeat first (abs: a closed writer's score is its close, negated), then the id
        found = [
            (-abs(beats.get(w, 0.0)), where)
            for w in owners
            if (where := endpoints.get(w)) is not None and (live is None or w in live)
        ]
        if not found and live is not None and endpoints:
            return self.endpoint_of(owners)
        return min(found)[1] if found else None
