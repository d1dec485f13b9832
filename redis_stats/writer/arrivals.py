"""Arrivals: the requests a front end holds, counted where they land (``in_flight`` in the load feed).

A router replica sees only the requests it dispatched itself; the engine's own numbers (running,
waiting) show a request once its scheduler took it, a step or more later. The front end in front
of an engine (the vLLM API server: :mod:`redis_stats.integrations.vllm.arrivals`; a bridge or
proxy set-up: this class, called by its own code) sees every request the moment it lands, from
every router. It counts each one here, in the writer of that engine: the writer's load lane stores
the count within ``load_interval`` (at once after a quiet spell), so every reader of the feed
(``/load``, ``/watch``, ``/v1/loads``, ``/get_load``) sees every replica's dispatches in tens of
milliseconds, with no change to the routers::

    arrivals = Arrivals(writer)
    with arrivals.begin(rank=rank, request_id=request_id):   # arrived: counted
        ...serve it...                                        # ended, failed or aborted: not

Exact: a request is counted once (an :class:`Arrival` ends once, however often :meth:`~Arrival.end`
is called, and in a ``finally`` with ``with``); the count is a value of the writer process, stored
absolute with every flush (a Redis that lost it has it back within a flush) and read only while the
writer is live, so a process that dies takes its requests with it (its lease: ``stale_after``).
Where the request carries an id (``X-Request-Id``), the entry that counts it also ends the
routers' booking of it (:mod:`redis_stats.bookings`): the booking ends as the engine's own count
shows the request, never before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Protocol

from redis_stats.writer.loadtracker import LoadTracker

__all__ = ["Arrival", "Arrivals"]


class _Writer(Protocol):
    load: LoadTracker | None
    engines: tuple[int, ...]
    config: Any


class Arrival:
    """One request counted by :class:`Arrivals` (``in_flight`` of :attr:`engine`, a stored index)
    until :meth:`end`; a context manager that ends it on exit, whatever the exit."""

    __slots__ = ("_ended", "_lock", "_tracker", "engine", "request_id")

    def __init__(self, tracker: LoadTracker, engine: int, request_id: str | None) -> None:
        self._tracker = tracker
        self.engine = engine
        self.request_id = request_id
        self._ended = False
        self._lock = threading.Lock()
        tracker.arrive(engine, request_id)

    def end(self) -> None:
        """The request ended (finished, failed, aborted): no longer counted. Only the first call
        counts; later ones do nothing."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._tracker.depart(self.engine)

    @property
    def ended(self) -> bool:
        """Whether :meth:`end` was called."""
        return self._ended

    def __enter__(self) -> Arrival:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()


class Arrivals:
    """Counts the requests a front end holds, per engine, in *writer* (a
    :class:`~redis_stats.writer.StatsWriter` or :class:`~redis_stats.aio.AsyncStatsWriter` given
    a load map: its engines then report ``in_flight``, 0 until a request arrives).

    A request names its engine by *rank* (vllm-router's ``X-data-parallel-rank``: the engine index
    the writer records, before ``engine_offset``); one that names none, or a rank this writer does
    not record, is counted on *default* (default: the writer's lowest engine). With one engine per
    front end (the usual case) every request is that engine's; with several, only the endpoint's
    sum is exact for requests that name no rank (vLLM picks the engine inside)."""

    def __init__(self, writer: _Writer, *, default: int | None = None) -> None:
        tracker = writer.load
        if tracker is None:
            raise ValueError(
                "this writer feeds no load feed (it was given no load map): arrivals are counted in "
                "its load entries; give it one (StatsWriter(..., load=LoadMap(...)); the vLLM plugin's "
                "and the bridge's writers have one)"
            )
        self._tracker = tracker
        self._offset = int(writer.config.engine_offset)
        self.engines: frozenset[int] = frozenset(writer.engines)
        if default is None:
            default = min(writer.engines, default=0)
        if default not in self.engines and self.engines:
            raise ValueError(f"default={default!r} is not an engine of this writer ({sorted(self.engines)})")
        self.default = default
        tracker.count_arrivals(e + self._offset for e in (self.engines or {default}))

    def engine_of(self, rank: Any) -> int:
        """The engine (as the writer records it) a request naming *rank* is counted on: *rank*
        when it is one of the writer's engines (an int, or its decimal text), else the default."""
        if isinstance(rank, str) and rank.isascii() and rank.strip().isdigit():
            rank = int(rank.strip())
        if isinstance(rank, int) and not isinstance(rank, bool) and rank in self.engines:
            return rank
        return self.default

    def begin(self, *, rank: Any = None, request_id: str | None = None) -> Arrival:
        """Count a request that just arrived (:meth:`engine_of` *rank*; *request_id*: its id as
        the routers booked it, ``X-Request-Id``, or None): counted until the :class:`Arrival`
        ends."""
        engine = self.engine_of(rank) + self._offset
        return Arrival(self._tracker, engine, request_id or None)

    def in_flight(self, engines: Iterable[int] | None = None) -> int:
        """Requests counted now over *engines* (default: all), in this process."""
        return self._tracker.in_flight(None if engines is None else [e + self._offset for e in engines])
