"""A writer's absolute state per engine, kept in chunks (schema 2, see docs/key-schema.md).

The record path still counts deltas (cheap, under one lock); the collector adds each batch's
deltas here, into totals that only it touches, and sends the chunks that changed: per engine,
``@|<writer>|<k>`` holds the values of up to :data:`~redis_stats._core.fields.CHUNK_SIZE` series, one
per line, and ``@|<writer>|<k>|n`` their series fields, one per line, sent only when they changed.
The flush script just sets those fields: absolute values make a repeated flush harmless, and no
Lua parses or formats a number (issue 15: that was 90 % of a flush's Redis time).

What the store holds for this writer is what was last *confirmed* (applied, or found already
applied); that is what gc folds into the base fields if it removes the writer, so
:meth:`Totals.rebase` takes it off every total before the writer continues under a new id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import accumulate
from typing import Any

from redis_stats._core.fields import CHUNK_SIZE, decode

__all__ = ["Chunk", "Series", "Totals"]

_MAX = 1.7976931348623157e308
COUNTER, HISTOGRAM, GAUGE = "c", "h", "g"


class Series:
    """One series of one engine as this writer holds it: its field, its total (a counter's number,
    a histogram's ``[sum, per-bucket counts]``, a gauge's stamped text), its value text, and the
    totals last sent and last confirmed."""

    __slots__ = ("chunk", "confirmed", "field", "kind", "sent", "text", "total")

    def __init__(self, field: str, kind: str, chunk: Chunk) -> None:
        self.field = field
        self.kind = kind
        self.chunk = chunk
        self.total: Any = None
        self.text = ""
        self.sent: Any = None
        self.confirmed: Any = None

    def snapshot(self) -> Any:
        """The total as it is now (a copy: the total goes on changing)."""
        if self.kind == HISTOGRAM:
            return (self.total[0], tuple(self.total[1]))
        return self.total

    def render(self) -> None:
        """Set :attr:`text` from the total."""
        if self.kind == COUNTER:
            total = self.total
            self.text = str(total) if total.__class__ is int else repr(total)
        elif self.kind == HISTOGRAM:
            # Stored cumulative (the +Inf bucket last: the count), so a reader prints it as it is.
            self.text = " ".join([repr(self.total[0]), *map(str, accumulate(self.total[1]))])


class Chunk:
    """Up to CHUNK_SIZE series of one engine, sent together in one field (names in another)."""

    __slots__ = ("dirty", "index", "names_confirmed", "series")

    def __init__(self, index: int) -> None:
        self.index = index
        self.series: list[Series] = []
        self.dirty = False
        self.names_confirmed: str | None = None  # the names Redis holds (as far as we know)

    def names(self) -> str:
        """The chunk's series fields, one per line."""
        return "\n".join(s.field for s in self.series)

    def values(self) -> str:
        """The chunk's values, one per line in the order of :meth:`names`."""
        return "\n".join(s.text for s in self.series)


class _Engine:
    __slots__ = ("chunks", "series")

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}
        self.chunks: list[Chunk] = []

    def get(self, field: str, kind: str) -> Series:
        found = self.series.get(field)
        if found is not None:
            return found
        if not self.chunks or len(self.chunks[-1].series) >= CHUNK_SIZE:
            self.chunks.append(Chunk(len(self.chunks)))
        chunk = self.chunks[-1]
        made = self.series[field] = Series(field, kind, chunk)
        chunk.series.append(made)
        return made


class Totals:
    """Every series of one writer, by engine and field, with its absolute total and its chunk.

    Only the collector touches it (a take and the answer to it are serialized by the flush), so
    it needs no lock. *drop* counts a delta that would push a total beyond the float range.
    """

    def __init__(self, drop: Callable[[str], None]) -> None:
        self._drop = drop
        self._engines: dict[int, _Engine] = {}

    def _engine(self, engine: int) -> _Engine:
        found = self._engines.get(engine)
        if found is None:
            found = self._engines[engine] = _Engine()
        return found

    def absorb(
        self, engine: int, counters: Iterable[Any], gauges: Iterable[Any], hists: Iterable[Any]
    ) -> None:
        """Add one engine's deltas of a batch: counters ``(field, delta)``, gauges
        ``(field, "<ms>|<value>")``, histograms ``(field, sum delta, per-bucket increases)``."""
        state = self._engine(engine)
        for field, delta in counters:
            s = state.get(field, COUNTER)
            total = delta if s.total is None else s.total + delta
            if not -_MAX <= total <= _MAX:  # an int beyond the float range, or an infinite sum
                self._drop("invalid_value")
                if s.total is not None:
                    continue
                total = 0
            s.total = total
            s.render()
            s.chunk.dirty = True
        for field, text in gauges:
            s = state.get(field, GAUGE)
            s.total = s.text = text
            s.chunk.dirty = True
        for field, sum_delta, counts in hists:
            s = state.get(field, HISTOGRAM)
            if s.total is None:
                s.total = [0.0, [0] * len(counts)]
            if len(counts) != len(s.total[1]):
                continue  # cannot happen: a series' bounds are fixed
            # A sum beyond the float range stays infinite (Prometheus writes +Inf), as in schema 1.
            s.total[0] += sum_delta
            bucket = s.total[1]
            for i, n in enumerate(counts):
                if n:
                    bucket[i] += n
            s.render()
            s.chunk.dirty = True

    def take(
        self, *, with_names: bool = False
    ) -> tuple[dict[int, list[tuple[int, str | None, str]]], list[Any]]:
        """The chunks that changed since the last take, per engine ``(index, names or None when
        Redis holds them already, values)``, and what confirming them means (for
        :meth:`confirm`). *with_names*: names of every chunk taken, held or not (a batch with
        specs may meet a conflicting definition: the script then takes lines out by name, and
        what it stores is not what this writer sent)."""
        out: dict[int, list[tuple[int, str | None, str]]] = {}
        sent: list[Any] = []
        for engine, state in self._engines.items():
            for chunk in state.chunks:
                if not chunk.dirty:
                    continue
                chunk.dirty = False
                names = chunk.names()
                values = chunk.values()
                out.setdefault(engine, []).append(
                    (
                        chunk.index,
                        None if names == chunk.names_confirmed and not with_names else names,
                        values,
                    )
                )
                members = [(s, s.snapshot()) for s in chunk.series if s.kind != GAUGE]
                sent.append((chunk, names, members))
        return out, sent

    @staticmethod
    def confirm(sent: list[Any]) -> None:
        """Redis holds what :meth:`take` returned *sent* for (applied, or applied before)."""
        for chunk, names, members in sent:
            chunk.names_confirmed = names
            for s, total in members:
                s.confirmed = total

    def resend_all(self) -> None:
        """Send every chunk again, names too (Redis lost them, or the writer has a new id)."""
        for state in self._engines.values():
            for chunk in state.chunks:
                chunk.names_confirmed = None
                chunk.dirty = bool(chunk.series)

    def rebase(self) -> None:
        """gc removed this writer and folded what Redis held of it (the confirmed totals) into
        the base fields: take that off every total, so that the new id holds only the rest."""
        for state in self._engines.values():
            for s in state.series.values():
                if s.kind == COUNTER and s.confirmed is not None:
                    s.total -= s.confirmed
                    s.render()
                elif s.kind == HISTOGRAM and s.confirmed is not None:
                    folded_sum, folded = s.confirmed
                    s.total = [s.total[0] - folded_sum, [a - b for a, b in zip(s.total[1], folded)]]
                    s.render()
                s.confirmed = None
        self.resend_all()

    def forget_metrics(self, names: set[str]) -> None:
        """Stop sending the series of metrics *names* (their definition conflicts with the one
        stored first): they leave their chunks, whose names change and are sent again."""
        for state in self._engines.values():
            for field, s in list(state.series.items()):
                if decode(field)[0] in names:
                    del state.series[field]
                    s.chunk.series.remove(s)
                    s.chunk.dirty = True

    def reset(self) -> None:
        """Forget everything (a forked child is a new writer: its totals start at zero)."""
        self._engines = {}
