"""Bookings: a router replica's dispatches, seen by every replica before the engine counts them.

Router replicas each see only the requests they dispatched themselves. Between a dispatch and the
engine's count of it (its front end's ``in_flight``: :mod:`redis_stats.writer.arrivals`; else its
running and waiting numbers, a step later) the peers route blind and pile onto the same engine. A
router **books** each dispatch the moment it makes it (one script call, ``book.lua``: a fraction
of a millisecond on a local network), and every replica reads every replica's bookings with the
load feed: ``booked`` per engine in ``/load``, ``StatsReader.load()`` and ``/watch``, beside the
engine's own count, and ``expected_in_flight``, their sum::

    bookings = Bookings(StatsConfig.from_env())          # one per router process: its lease
    booking = bookings.book(engine, request_id)          # send the request with X-Request-Id
    ...
    booking.end()                                        # the response ended (or failed)

A booking ends, whichever comes first:

- when the engine's own count shows the request: its front end, seeing ``X-Request-Id`` arrive,
  deletes the booking with the very entry that counts the request (the load lane's), so a reader
  sees it booked, then counted, never neither;
- when the router ends it (:meth:`Booking.end`: the response came back, or the dispatch failed);
- after its bounded time (*bound*, 2 s by default: for engines whose front end does not count
  arrivals, by then their running and waiting numbers show it);
- with its router's **lease** (*lease*, 2 s, renewed every third of it by a thread): a router
  killed, or cut off from Redis, has its bookings stop counting when its lease ends; a live
  router's booking is never dropped by a timeout shorter than its bound.

Exact across a Redis restart: a router whose lease the store lost (a renewal or a booking finds it
unknown) books its open bookings again. Two replicas booking the same engine at once are two
bookings (a hash field per request id), both counted.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
import weakref
from types import TracebackType
from typing import Any

from redis_stats._scripts import Script, load_script
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, make_client
from redis_stats.errors import error_kind
from redis_stats.keys import Keys, shard_of

__all__ = [
    "BOUND",
    "LEASE",
    "Booking",
    "BookingStore",
    "Bookings",
    "check_engine",
    "check_request_id",
    "check_router",
]

LEASE = 2.0
"""Seconds a router's lease lasts without a renewal: its bookings stop counting that long after
it died."""

BOUND = 2.0
"""Seconds a booking counts at most, unless the engine's count or the router ended it sooner."""

MAX_ID = 256
"""The longest request id booked (bytes of UTF-8): a longer one is refused."""

log = logging.getLogger("redis_stats.bookings")


def _seconds(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a number of seconds")
    if not low <= value <= high:
        raise ValueError(f"{name}={value!r}: give {low} to {high} seconds")
    return float(value)


def check_request_id(request_id: Any) -> str:
    """*request_id* as booked: a non-empty string of at most :data:`MAX_ID` bytes; ValueError
    saying why otherwise."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(
            f"request_id={request_id!r}: give the request's id (X-Request-Id), a non-empty string"
        )
    if len(request_id.encode("utf-8", "surrogatepass")) > MAX_ID:
        raise ValueError(f"request_id of {len(request_id)} characters: at most {MAX_ID} bytes")
    return request_id


def check_engine(engine: Any) -> int:
    """*engine* (an index as stored: an int >= 0); ValueError saying why otherwise."""
    if isinstance(engine, bool) or not isinstance(engine, int) or not 0 <= engine < 10**9:
        raise ValueError(f"engine={engine!r} is not an engine index (an int from 0)")
    return engine


def check_router(router: Any) -> str:
    """*router* (a router's id: printable, without ``|``, at most :data:`MAX_ID` bytes);
    ValueError saying why otherwise."""
    if not isinstance(router, str) or not router or "|" in router or not router.isprintable():
        raise ValueError(f"router={router!r}: give the router's id, printable and without '|'")
    if len(router.encode("utf-8", "surrogatepass")) > MAX_ID:
        raise ValueError(f"router id of {len(router)} characters: at most {MAX_ID} bytes")
    return router


class BookingStore:
    """The store's side of bookings, without state of its own: each call one script or command
    on the shard of the engine (*config*'s namespace and ``shards``), for :class:`Bookings` and
    the exporter's ``POST /bookings`` (routers not in Python) alike."""

    def __init__(self, config: StatsConfig, client: Client) -> None:
        self.config = config
        self.client = client
        self._book = Script(client, load_script("book"))
        self._lease = Script(client, load_script("router_lease"))
        self._keys = Keys(config.namespace)

    def shard_keys(self, engine: int) -> Keys:
        """The keys of *engine*'s shard."""
        k = self.config.shards
        return self._keys.shard(shard_of(engine, k), k)

    def book(self, router: str, lease: float, bound: float, request_id: str, engine: int) -> bool:
        """Book *request_id* on *engine* for *bound* seconds and extend *router*'s lease to
        *lease* seconds; whether the store had lost the lease (or never had it)."""
        keys = self.shard_keys(engine)
        args = [router, int(lease * 1000), max(1, int(bound * 1000)), request_id, engine]
        return bool(int(self._book([keys.bookings, keys.routers], args)[1]))

    def end(self, engine: int, request_id: str) -> bool:
        """End the booking of *request_id* on *engine*; whether it was still stored."""
        return bool(self.client.execute_command("HDEL", self.shard_keys(engine).bookings, request_id))

    def lease(self, router: str, lease: float, op: str) -> bool:
        """Renew (*op* ``renew``) or release (``release``) *router*'s lease in every shard, and
        drop the bookings that no longer count; whether a shard had lost the lease."""
        lost = False
        for shard in range(self.config.shards):
            keys = self._keys.shard(shard, self.config.shards)
            reply = self._lease([keys.bookings, keys.routers], [router, int(lease * 1000), op])
            lost |= bool(int(reply[1]))
        return lost


class Booking:
    """One open booking (:meth:`Bookings.book`): ends with :meth:`end`, or on leaving a ``with``."""

    __slots__ = ("_owner", "booked_at", "engine", "request_id")

    def __init__(self, owner: Bookings, engine: int, request_id: str) -> None:
        self._owner = owner
        self.engine = engine
        self.request_id = request_id
        self.booked_at = time.monotonic()

    def end(self) -> None:
        """The request ended at the router (answered, failed, never sent): the booking no longer
        counts. Idempotent; never raises (a booking not ended here ends by its bound)."""
        self._owner.end(self)

    def __enter__(self) -> Booking:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()


class Bookings:
    """A router process's bookings in the namespace of *config* (its Redis, namespace and
    ``shards``), under one lease (*router*: its id, default host, pid and a random part).

    *lease*, *bound*: seconds (:data:`LEASE`, :data:`BOUND`). *start*: renew the lease in a
    thread of its own (else call :meth:`renew` at least every ``lease / 3`` seconds). Thread-safe."""

    def __init__(
        self,
        config: StatsConfig,
        *,
        router: str | None = None,
        lease: float = LEASE,
        bound: float = BOUND,
        client: Client | None = None,
        start: bool = True,
    ) -> None:
        self.config = config
        self.lease = _seconds("lease", lease, 0.1, 3600.0)
        self.bound = _seconds("bound", bound, 0.01, 3600.0)
        self.router = check_router(router or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
        self.client: Client = client if client is not None else make_client(config)
        self.store = BookingStore(config, self.client)
        self._open: dict[str, Booking] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.errors = 0
        """Calls to Redis that failed (a booking not stored counts nowhere: the router routes on)."""
        self.skipped = 0
        """Bookings not sent: made within a third of a lease after a call failed (a router must
        not wait a timeout per dispatch while Redis cannot be reached); the renewals try on."""
        self._retry_at = 0.0
        self._unsent = False  # a booking skipped or failed: the next renewal that works sends it
        self._thread: threading.Thread | None = None
        self._named = router is not None
        if start:
            self._start()
        _LIVE.add(self)

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="redis_stats-bookings", daemon=True)
        self._thread.start()

    def _forked(self) -> None:
        """In a forked child: a router of its own (the parent's lease and bookings are the
        parent's: it renews and ends them), with a new lock and its own renewal thread."""
        self._lock = threading.Lock()
        self._open = {}
        if not self._named:
            self.router = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        if self._thread is not None and not self._stop.is_set():
            self._start()

    def book(self, engine: int, request_id: str | None = None) -> Booking:
        """Book a request on *engine* (its index as the load feed shows it) now; *request_id*:
        the id the request is sent with (``X-Request-Id``), by which the engine's front end
        ends the booking when it arrives; default a new one (:attr:`Booking.request_id`: send
        it). A failure to reach Redis is counted in :attr:`errors` and logged, never raised: the
        request is routed all the same."""
        engine = check_engine(engine)
        request_id = check_request_id(request_id if request_id is not None else uuid.uuid4().hex)
        booking = Booking(self, engine, request_id)
        with self._lock:
            self._open[request_id] = booking
        if time.monotonic() < self._retry_at:
            self.skipped += 1  # booked by the renewal that finds the store back
            self._unsent = True
            return booking
        try:
            lost = self.store.book(self.router, self.lease, self.bound, request_id, engine)
        except Exception as exc:
            self._failed(exc)
        else:
            if lost and len(self._open) > 1:
                self._rebook()
        return booking

    def end(self, booking: Booking) -> None:
        """End *booking* (:meth:`Booking.end`)."""
        with self._lock:
            if self._open.get(booking.request_id) is not booking:
                return
            del self._open[booking.request_id]
        try:
            self.store.end(booking.engine, booking.request_id)
        except Exception as exc:
            self._failed(exc)

    def open(self) -> list[Booking]:
        """The bookings this router holds (not ended here, not past their bound)."""
        oldest = time.monotonic() - self.bound
        with self._lock:
            for request_id in [r for r, b in self._open.items() if b.booked_at <= oldest]:
                del self._open[request_id]
            return list(self._open.values())

    def renew(self) -> None:
        """Extend the lease (in every shard) and drop the bookings that no longer count; book the
        open ones again where the store lost them, or where some could not be sent (a booking
        the engine's front end ended meanwhile then counts again until it ends here or its
        bound: over, never under). Never raises (counted in :attr:`errors`)."""
        try:
            lost = self.store.lease(self.router, self.lease, "renew")
        except Exception as exc:
            self._failed(exc)
            return
        self._retry_at = 0.0  # the store answers: book again at once
        if lost or self._unsent:
            self._unsent = False
            self._rebook()

    def _rebook(self) -> None:
        """Book every open booking again (the store lost them: restarted empty, flushed, failed
        over to a replica behind), each for what is left of its bound."""
        for booking in self.open():
            left = self.bound - (time.monotonic() - booking.booked_at)
            if left <= 0:
                continue
            try:
                self.store.book(self.router, self.lease, left, booking.request_id, booking.engine)
            except Exception as exc:
                self._failed(exc)
                return

    def _failed(self, exc: BaseException) -> None:
        self._unsent = True
        self.errors += 1
        self._retry_at = time.monotonic() + self.lease / 3
        (log.warning if self.errors == 1 else log.debug)(
            "bookings at %s: %s (%s)", self.config.safe_url, error_kind(exc), exc
        )

    def _run(self) -> None:
        while not self._stop.wait(self.lease / 3):
            self.renew()
            self.open()  # forget the bookings past their bound

    def close(self) -> None:
        """End the lease and every booking of this router at once (call it on shutdown)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease)
        with self._lock:
            self._open.clear()
        try:
            self.store.lease(self.router, self.lease, "release")
        except Exception as exc:
            self._failed(exc)

    def __enter__(self) -> Bookings:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_LIVE: weakref.WeakSet[Bookings] = weakref.WeakSet()


def _after_fork() -> None:
    for bookings in list(_LIVE):
        bookings._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
