"""A writer's absolute state per engine, kept in chunks (schema 2, see docs/key-schema.md).

The record path still counts deltas (cheap, under one lock); at each take the collector adds them
here, into totals that only it touches, and sends the chunks that changed: per engine,
``@|<writer>|<k>`` holds the values of up to :data:`~redis_stats.codec.CHUNK_SIZE` series, one
per line, and ``@|<writer>|<k>|n`` their series fields, one per line, sent only when they changed.
The flush script just sets those fields: absolute values make a repeated flush harmless, and no
Lua parses or formats a number (issue 15: that was 90 % of a flush's Redis time).

What the store holds for this writer is what was last *confirmed* (applied, or found already
applied): the texts of each chunk it sent. That is what gc folds into the base fields if it
removes the writer, so :meth:`Totals.rebase` takes it off every total before the writer continues
under a new id.

**What a flush allocates** (issue 28: a flush's allocations push the host's garbage collector into
full collections, which pause the host). A take of N changed series keeps no container per
series: each series' total is updated in place (a counter's number, a histogram's lists), its
value text is one string, a chunk's names text is built once (when its series change) and its
values text once per take; what the batch in flight needs to be confirmed is those two strings on
the chunk. The only containers a take makes are a few per shard (the list of chunks taken per
engine), whatever N.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from operator import attrgetter
from typing import Any, NamedTuple

from redis_stats import codec
from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM
from redis_stats.codec import (
    chunk_lines,
    chunk_text,
    counter_text,
    counter_total,
    decode,
    histogram_counts,
    histogram_text,
)

_MAX = 1.7976931348623157e308
_INDEX = attrgetter("index")
# A take gives the GIL away every this many chunks (256 series, as the record loop does).
_YIELD_EVERY = 4

# What a take costs a flush call, in words (keys and arguments: flush.lua's header counts them):
# an engine block is its key and three arguments (engine, held, count), a field set two (the
# field, its value: a chunk's values, and its names when sent), an engine checked only its key
# and three (engine, held, beat ms). A take keeps within the room it is given (Taken.cut).
BLOCK_WORDS, CHUNK_WORDS, CHECK_WORDS = 4, 2, 4
UNBOUNDED = 1 << 62


class Total:
    """One series of one engine as this writer holds it: its field, its total (a counter's number,
    a histogram's ``[sum, per-bucket counts]``; a gauge has only its text), its value text and its
    chunk (None until a take gives it its place, :meth:`Totals.adopt`).

    The children that record series (:mod:`redis_stats._core.write.series`) are Total objects themselves, so
    a take makes no object per series (issue 32: a first flush of 100,000 new series made 100,000
    objects the cyclic collector tracks, enough to start a full collection of the host's heap,
    130 ms with the GIL held, in the second that flush ran).
    """

    __slots__ = ("chunk", "field", "kind", "taken", "text", "total")

    chunk: Chunk  # None until adopted (see unbind)

    def __init__(self, field: str, kind: str) -> None:
        self.field = field
        self.kind = kind
        self.unbind()

    def unbind(self) -> None:
        """No place in any totals: not yet, or again (a forked child's totals start at zero)."""
        self.chunk = None  # type: ignore[assignment]
        self.total: Any = None
        self.text = ""
        self.taken = -1  # the take of its totals that last counted it as changed

    def add_total(self, delta: int | float) -> None:
        """Add a counter's *delta* (a sum beyond the float range is dropped and counted)."""
        total = delta if self.total is None else self.total + delta
        if not -_MAX <= total <= _MAX:  # an int beyond the float range, or an infinite sum
            self.chunk.totals.drop("invalid_value")
            if self.total is not None:
                return
            total = 0
        self.total = total
        self.text = counter_text(total)
        self.chunk.changed(self)

    def add_pending(self, pending: list[float]) -> None:
        """Add a histogram's pending bucket counts and sum (``[c0 .. cN, sum]``), then zero them:
        the list is the recorder's slot, reused (a take allocates no list per histogram)."""
        total = self.total
        n = len(pending) - 1
        if total is None:
            total = self.total = [0.0, [0] * n]
        bucket = total[1]
        if len(bucket) != n:  # cannot happen: a series' bounds are fixed
            pending[:] = [0] * n + [0.0]
            return
        # A sum beyond the float range stays infinite (Prometheus writes +Inf), as in schema 1.
        total[0] += pending[n]
        pending[n] = 0.0
        for i in range(n):
            if pending[i]:
                bucket[i] += pending[i]
                pending[i] = 0
        self.text = histogram_text(total[0], bucket)
        self.chunk.changed(self)

    def set_text(self, text: str) -> None:
        """Set a gauge's stamped value text (``<wall ms>|<value>``)."""
        self.text = text
        self.chunk.changed(self)

    def unfold(self, text: str) -> None:
        """Take the value *text* that gc folded into the base fields off this series' total."""
        if self.kind == COUNTER:
            self.total -= counter_total(text)
            self.text = counter_text(self.total)
        elif self.kind == HISTOGRAM:
            folded_sum, folded = histogram_counts(text)
            total = self.total
            if len(folded) == len(total[1]):
                total[0] -= folded_sum
                total[1] = [a - b for a, b in zip(total[1], folded)]
                self.text = histogram_text(total[0], total[1])


class Chunk:
    """Up to CHUNK_SIZE series of one engine, sent together in one field (names in another).

    A chunk is in at most one unconfirmed batch: a shard takes its totals again only after the
    answer to its batch in flight, so the texts taken (``sent_*``) stay put until then.
    """

    __slots__ = (
        "_names",
        "dirty",
        "engine",
        "index",
        "names_confirmed",
        "names_held",
        "send_names",
        "sent_names",
        "sent_values",
        "series",
        "totals",
        "values_confirmed",
    )

    def __init__(self, totals: Totals, engine: int, index: int) -> None:
        self.totals = totals
        self.engine = engine
        self.index = index
        self.series: list[Total] = []
        self.dirty = False
        self._names: str | None = None  # the names text, built when first needed after a change
        self.sent_names = ""  # the names and values texts of the batch that took it last
        self.sent_values = ""
        self.send_names = True  # whether that batch sends the names (else Redis holds them)
        self.names_held: str | None = None  # the names Redis holds (as far as we know)
        # The texts of the last batch Redis confirmed (what gc folds if it removes the writer).
        self.names_confirmed: str | None = None
        self.values_confirmed: str | None = None

    def names(self) -> str:
        """The chunk's series fields, one per line (built once per change of its series)."""
        names = self._names
        if names is None:
            names = self._names = chunk_text([s.field for s in self.series])
        return names

    def values(self) -> str:
        """The chunk's values, one per line in the order of :meth:`names`."""
        return chunk_text([s.text for s in self.series])

    def changed(self, series: Total) -> None:
        """*series* of this chunk changed: the chunk goes with the next take."""
        totals = self.totals
        if not self.dirty:
            self.dirty = True
            totals.dirty.append(self)
        if series.taken != totals.takes:
            series.taken = totals.takes
            touched = totals.touched
            touched[self.engine] = touched.get(self.engine, 0) + 1

    def _mark(self) -> None:
        self._names = None
        if not self.dirty:
            self.dirty = True
            self.totals.dirty.append(self)


class _Engine:
    __slots__ = ("beat_ms", "chunks", "held", "series")

    def __init__(self) -> None:
        self.series: dict[str, Total] = {}
        self.chunks: list[Chunk] = []
        # How many of its chunks (0 .. held-1) the store holds, both fields, as far as this writer
        # knows (confirmed): the flush script checks they are still there (a key or field can be
        # evicted or deleted alone; names are sent only when they change).
        self.held = 0
        self.beat_ms = 0  # server time of the last batch that heartbeated it (0: none applied)


class Taken(NamedTuple):
    """What one take (:meth:`Totals.take`) moved into a batch."""

    engines: dict[int, int]
    """Engine -> how many of its series changed (0: heartbeated only)."""
    chunks: dict[int, list[Chunk]]
    """Engine -> its chunks taken, in index order."""
    checks: list[int]
    """The engines checked only (see :meth:`Totals._checks`)."""
    cut: bool
    """Whether the room ran out: the rest waits in the totals for the next take."""


class Totals:
    """Every series of one writer (in one shard), by engine and field, with its absolute total
    and its chunk.

    Only the collector touches it (a take and the answer to it are serialized by the flush), so
    it needs no lock. *drop* counts a delta that would push a total beyond the float range.
    """

    def __init__(self, drop: Callable[[str], None]) -> None:
        self.drop = drop
        self._engines: dict[int, _Engine] = {}
        self.dirty: list[Chunk] = []  # the chunks changed since the last take, in that order
        self.touched: dict[int, int] = {}  # engine -> series changed since the last take
        self.takes = 0  # takes so far (a series changed since the last one has .taken == takes)
        self._checked = 0  # where the next take's checks start when not all fit (see _checks)

    def adopt(self, series: Total, engine: int) -> None:
        """Give *series* of *engine* its place: the engine's last chunk (a new one when full).
        Nothing is made per series (it is the child that records it)."""
        state = self._engines.get(engine)
        if state is None:
            state = self._engines[engine] = _Engine()
        # codec.CHUNK_SIZE read here, not bound at import: the stored format's one setting
        if not state.chunks or len(state.chunks[-1].series) >= codec.CHUNK_SIZE:
            state.chunks.append(Chunk(self, engine, len(state.chunks)))
        chunk = series.chunk = state.chunks[-1]
        state.series[series.field] = series
        chunk.series.append(series)
        chunk._mark()

    def touch(self, engine: int) -> None:
        """Make sure *engine* is heartbeated by the next take's batch even without data."""
        self.touched.setdefault(engine, 0)

    def take(self, *, with_names: bool = False, room: int = UNBOUNDED) -> Taken:
        """What changed (or was touched) since the last take, up to *room* words of a flush call
        (:data:`BLOCK_WORDS` per engine block, :data:`CHUNK_WORDS` per field set, :data:`CHECK_WORDS`
        per engine checked): see :class:`Taken`. Each chunk taken holds the texts to send
        (``sent_values``, ``sent_names``; ``send_names`` False when Redis holds those names
        already). *with_names*: the names of every chunk taken, held or not (a batch with specs
        may meet a conflicting definition: the script then takes lines out by name, and what it
        stores is not what this writer sent).

        What does not fit stays for the next take (:attr:`Taken.cut`): whole engines, and of an
        engine cut in two the chunks after the last one taken, in index order — so that the store
        always holds every chunk below the last one confirmed (:meth:`confirm`)."""
        self.takes += 1
        touched, self.touched = self.touched, {}
        dirty, self.dirty = self.dirty, []
        by_engine: dict[int, list[Chunk]] = {}
        for chunk in dirty:
            if not chunk.dirty:
                continue
            found = by_engine.get(chunk.engine)
            if found is None:
                by_engine[chunk.engine] = [chunk]
            else:
                found.append(chunk)
        del dirty
        engines: dict[int, int] = {}
        out: dict[int, list[Chunk]] = {}
        order = list(dict.fromkeys([*touched, *by_engine]))
        done = 0  # chunks taken (the GIL is given away every _YIELD_EVERY)
        cut = False
        for at, engine in enumerate(order):
            chunks = by_engine.get(engine)
            if room < BLOCK_WORDS + (2 * CHUNK_WORDS if chunks else 0):
                cut = True
                self._leave(order[at:], touched, by_engine)
                break
            room -= BLOCK_WORDS
            if engine in touched:
                engines[engine] = touched[engine]
            if not chunks:
                continue
            chunks.sort(key=_INDEX)
            n = 0
            for chunk in chunks:
                names = chunk.names()
                send_names = with_names or names != chunk.names_held
                words = 2 * CHUNK_WORDS if send_names else CHUNK_WORDS
                if words > room:
                    break
                room -= words
                chunk.dirty = False
                chunk.sent_names = names
                chunk.send_names = send_names
                chunk.sent_values = chunk.values()
                n += 1
                done += 1
                if not done % _YIELD_EVERY:
                    time.sleep(0)  # the host's threads get the GIL (see accumulator.take_shards)
            if n:
                out[engine] = chunks if n == len(chunks) else chunks[:n]
            if n < len(chunks):
                cut = True
                self.touched.setdefault(engine, 0)  # its next part heartbeats it again
                self.dirty += chunks[n:]
                self._leave(order[at + 1 :], touched, by_engine)
                break
        return Taken(engines, out, self._checks(room, engines, out), cut)

    def _leave(self, engines: list[int], touched: dict[int, int], chunks: dict[int, list[Chunk]]) -> None:
        """*engines* did not fit in this take: their changes wait for the next one."""
        for engine in engines:
            if engine in touched:
                self.touched[engine] = touched[engine]
            self.dirty += chunks.get(engine, ())

    def _checks(self, room: int, engines: dict[int, int], out: dict[int, list[Chunk]]) -> list[int]:
        """The engines where the store holds this writer's chunks and the take has no block:
        checked by the script (still there?), not heartbeated. At most what *room* holds; when
        more are held, the next takes check the next ones (each is checked within a few flushes,
        never skipped for good)."""
        found = [e for e, state in self._engines.items() if state.held and e not in engines and e not in out]
        fit = max(0, room) // CHECK_WORDS
        if len(found) <= fit:
            return found
        start = self._checked % len(found)
        self._checked = start + fit
        return (found[start:] + found[:start])[:fit]

    def confirm(self, taken: dict[int, list[Chunk]]) -> None:
        """Redis holds the chunks that :meth:`take` returned as *taken* (applied, or applied
        before): what they sent is what the store holds of this writer."""
        for engine, chunks in taken.items():
            for chunk in chunks:
                chunk.names_held = chunk.names_confirmed = chunk.sent_names
                chunk.values_confirmed = chunk.sent_values
            state = self._engines.get(engine)
            if state is not None and chunks:
                # Chunks are sent in index order from 0, each first with the take that made it:
                # the store holds every chunk up to the last one confirmed.
                state.held = max(state.held, chunks[-1].index + 1)

    def held(self) -> dict[int, tuple[int, int]]:
        """Engine -> (how many of this writer's chunks the store holds there as far as it knows,
        the server time its last applied batch heartbeated it): what a flush asks the script to
        check (engines with no chunk held left out)."""
        return {e: (state.held, state.beat_ms) for e, state in self._engines.items() if state.held}

    def beaten(self, engines: list[int], server_ms: int) -> None:
        """A batch heartbeating *engines* was applied at *server_ms*."""
        for engine in engines:
            state = self._engines.get(engine)
            if state is not None:
                state.beat_ms = server_ms

    def resend_all(self) -> None:
        """Send every chunk again, names too (Redis lost them, or the writer has a new id); an
        emptied one too (its metric conflicted), so that chunks 0 .. n-1 are all stored again."""
        self.dirty = []
        for state in self._engines.values():
            state.held = 0
            for chunk in state.chunks:
                chunk.names_held = None
                chunk.dirty = True
                self.dirty.append(chunk)

    def rebase(self) -> None:
        """gc removed this writer and folded what Redis held of it (the confirmed chunks) into
        the base fields: take that off every total, so that the new id holds only the rest."""
        for state in self._engines.values():
            for chunk in state.chunks:
                names, values = chunk.names_confirmed, chunk.values_confirmed
                chunk.names_confirmed = chunk.values_confirmed = None
                if names is None or values is None or not names:
                    continue
                for field, text in zip(chunk_lines(names), chunk_lines(values)):
                    s = state.series.get(field)
                    if s is not None and s.kind != GAUGE:
                        s.unfold(text)
        self.resend_all()

    def forget_metrics(self, names: set[str]) -> None:
        """Stop sending the series of metrics *names* (their definition conflicts with the one
        stored first): they leave their chunks, whose names change and are sent again."""
        for state in self._engines.values():
            for field, s in list(state.series.items()):
                if decode(field)[0] in names:
                    del state.series[field]
                    s.chunk.series.remove(s)
                    s.chunk._mark()

    def reset(self) -> None:
        """Forget everything (a forked child is a new writer: its totals start at zero)."""
        self._engines = {}
        self.dirty = []
        self.touched = {}
