"""The load feed: ``/load``'s body, refreshed by one background thread and shared by every request.

A router polls every few tens of milliseconds; a Redis read per request would multiply the
fleet's Redis load by the number of routers and their poll rate. So one thread reads
(:meth:`redis_stats.reader.StatsReader.load`, the load hashes only) every *refresh* seconds, and
a request is answered from the body that read built, already encoded and gzipped: no Redis, no
JSON, no compression per request.

The body changes only when a value or an ``up`` changes (not when only the ages do), and carries
a weak ``ETag`` of those values: a client sending it back in ``If-None-Match`` gets ``304 Not
Modified`` with no body. ``time`` and ``age_seconds`` in a body are as of the refresh that built
it; the ``X-Load-Refreshed`` header of every answer (``200`` or ``304``) is the server time of the
last refresh, which confirmed that the body still holds. Data served is therefore at most
*refresh* seconds older than Redis' (plus the refresh's own read), and Redis' load entries at
most a flush interval (or ``load_interval``) older than the writers'.

The refresher runs only while someone asks: after :data:`IDLE` seconds without a request it
stops, and the next request starts it again, waiting for one fresh read. A view that cannot be
refreshed says so (``503`` with the reason, or with its age once its last successful refresh is
older than :attr:`LoadFeed.max_age`), never serves a frozen ``200``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from redis_stats.background import survive, survived
from redis_stats.config import redact
from redis_stats.errors import error_kind
from redis_stats.load import LoadView
from redis_stats.outage import Outage, shared
from redis_stats.reader import EngineSlice, StatsReader
from redis_stats.routers.vouch import unknown_document
from redis_stats.server.http import GZIP_LEVEL
from redis_stats.server.source import Source

__all__ = ["IDLE", "LoadBody", "LoadFeed", "SliceBody", "feed_of"]

log = logging.getLogger("redis_stats.exporter")


@dataclass(frozen=True)
class LoadBody:
    """One encoded answer of ``/load``: its status, JSON body, gzipped body and ETag."""

    status: int
    body: bytes
    gzipped: bytes
    etag: str
    refreshed: float
    """Server time (s) of the last refresh that confirmed this body (0 when none did)."""


SLICE_BODY_BYTES = 2048
"""What a kept ``/load`` body of a slice holds beyond its bytes (its objects, the kept key)."""


class SliceBody:
    """The kept body of one selection of the view (a ``?slice=``): (generation, body), one store
    each; kept by the server per slice asked (bounded in bytes, dropped when idle)."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: tuple[int, LoadBody] | None = None

    def kept_bytes(self) -> int:
        """Its body's bytes, plain and gzipped, and what holds them (this entry, its LoadBody, the
        server's key: ~1.5 KB measured with tracemalloc)."""
        kept = self.kept
        return SLICE_BODY_BYTES + (0 if kept is None else len(kept[1].body) + len(kept[1].gzipped))

    def close(self) -> None:
        """Nothing runs."""


def _encode(status: int, doc: dict[str, Any], etag: str, refreshed: float) -> LoadBody:
    body = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
    return LoadBody(status, body, gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0), etag, refreshed)


def _etag(view: LoadView) -> str:
    """A weak ETag of what a body of *view* says, but its times: the same values, the same tag."""
    return 'W/"' + hashlib.sha1(view.signature().encode()).hexdigest()[:20] + '"'


def _selected(view: LoadView, part: EngineSlice | None) -> LoadView:
    """*view* with the engines of slice *part* only (all of them when None)."""
    if part is None:
        return view
    return LoadView(view.time, {e: v for e, v in view.engines.items() if part.holds(str(e))}, view.skipped)


def _confirmed(body: LoadBody, refreshed: float) -> LoadBody:
    """*body* as confirmed by the refresh at *refreshed*: the same body, its new time."""
    return body if body.refreshed == refreshed else replace(body, refreshed=refreshed)


IDLE = 60.0
"""Seconds without a request after which the refresher stops (the next request starts it again
and waits for one fresh read, as the first one does): a view nobody asks for reads nothing."""

STALE_REFRESHES = 10
"""A body is served while its last successful refresh is at most this many refresh intervals
old, and at least :data:`MIN_MAX_AGE` s; older, ``/load`` answers ``503`` (``"error": "stale"``)."""

MIN_MAX_AGE = 2.0


class LoadFeed:
    """The shared, refreshed ``/load`` of one exporter (thread-safe).

    The refresher starts with the first request (an exporter nobody asks for the feed reads
    nothing more from Redis), which waits for the first read; later requests never wait for
    Redis. After *idle* seconds without a request it stops, and the next request starts it again
    the same way. *select* filters the engines of a request's answer (a slice of the fleet); each
    selection's body is built once per change and kept.

    A body is never the past served as the present: a refresh that fails (Redis, or anything
    else: counted in ``redis_stats_background_errors_total{thread="load"}``) makes every answer
    a ``503`` saying why until one succeeds, and a body whose last successful refresh is older
    than *max_age* seconds (default: :data:`STALE_REFRESHES` refreshes, at least
    :data:`MIN_MAX_AGE` s) is answered ``503`` with its age (a refresh stuck on Redis).
    """

    def __init__(
        self,
        reader: StatsReader,
        *,
        refresh: float = 0.25,
        engines: list[int] | None = None,
        namespace: str | None = None,
        only: EngineSlice | None = None,
        idle: float = IDLE,
        max_age: float | None = None,
    ) -> None:
        if not refresh > 0:
            raise ValueError(f"refresh={refresh!r} must be a positive number of seconds (the /load refresh)")
        if not idle > 0:
            raise ValueError(f"idle={idle!r} must be a positive number of seconds (the /load refresher's)")
        self.reader = reader
        self.refresh = refresh
        self.idle = idle
        self.max_age = max_age if max_age is not None else max(MIN_MAX_AGE, STALE_REFRESHES * refresh)
        self.engines: Any = only if only is not None else engines
        self.only = only
        self.namespace = namespace if namespace is not None else reader.config.namespace
        self._lock = threading.Lock()  # the state below: held for a few assignments only
        self._refreshing = threading.Lock()  # one refresh at a time (held while Redis answers)
        self._last_etag = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._view: LoadView | None = None
        self._error: LoadBody | None = None
        self._refreshed = 0.0
        self._good = -math.inf  # monotonic time of the last successful refresh
        self._asked = 0.0  # monotonic time of the last request
        self._generation = 0
        self._whole = SliceBody()  # the whole view's body (a slice's is kept by the caller)
        self.refreshes = 0
        self.failures = 0

    def close(self) -> None:
        """Stop the refresher."""
        self._stop.set()

    @property
    def running(self) -> bool:
        """Whether the refresher thread runs (it stops after :attr:`idle` s without a request)."""
        return self._thread is not None

    def answer(self, part: EngineSlice | None = None, kept: SliceBody | None = None) -> LoadBody:
        """The current body of slice *part* of the view (the whole view when None); *kept*
        holds a slice's body from one answer to the next (without it, built each time)."""
        if part is not None and self.only is not None:
            raise ValueError(
                f"this exporter serves slice {self.only} only; ?slice= needs one of the whole fleet"
            )
        holder = self._whole if part is None else kept or SliceBody()
        current = self.current()
        if isinstance(current, LoadBody):
            return current
        view, generation, refreshed = current
        last = holder.kept
        if last is not None and last[0] == generation:
            return _confirmed(last[1], refreshed)
        body = self._body_of(_selected(view, part), last, refreshed)
        with self._lock:
            if self._generation == generation:
                holder.kept = (generation, body)
        return body

    def current(self) -> tuple[LoadView, int, float] | LoadBody:
        """The newest view (with its generation and the server time of the refresh that last
        confirmed it), or the ``503`` body saying why there is none (the refresher starts with
        the first request: that one waits for a read)."""
        self._asked = time.monotonic()
        if self._thread is None and not self._stop.is_set():
            self._start()
        with self._lock:
            if self._error is not None:
                return self._error
            age = time.monotonic() - self._good
            if age > self.max_age:
                return self._stale(age)
            assert self._view is not None
            return self._view, self._generation, self._refreshed

    def _stale(self, age: float) -> LoadBody:
        """The ``503`` of a view whose last successful refresh is *age* s old (no ETag: never a
        ``304`` that would keep a router on the kept body)."""
        doc = unknown_document(
            "stale",
            f"the load was last refreshed {age:.1f} s ago, more than the {self.max_age:g} s a "
            "body is served for: the refresher is waiting on Redis",
            age_seconds=round(age, 3),
        )
        return _encode(503, doc, "", self._refreshed)

    def _body_of(self, view: LoadView, kept: tuple[int, LoadBody] | None, refreshed: float) -> LoadBody:
        """The body of *view*: the one *kept* of an older generation when it says the same
        (its ETag), with the new time; else a new one."""
        etag = _etag(view)
        if kept is not None and kept[1].etag == etag:
            return _confirmed(kept[1], refreshed)
        return _encode(200, view.to_dict(namespace=self.namespace), etag, refreshed)

    def _start(self) -> None:
        with self._refreshing:
            if self._thread is not None:
                return
            self._refresh_once()  # the first request (and the first after idling) waits for a read
            self._thread = threading.Thread(target=self._loop, name="redis_stats-load", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh):
            with self._refreshing:
                if time.monotonic() - self._asked > self.idle:
                    self._thread = None  # nobody asks: stop reading (the next request restarts)
                    return
                with survive("load", log):  # _refresh_once handles its own; this never dies
                    self._refresh_once()

    def _refresh_once(self) -> None:
        """One read (requests are answered meanwhile from the bodies kept), then a new view
        and a new generation only when a body would change (values or ups: the ETag), or the
        error body says why there is none."""
        try:
            view = self.reader.load(self.engines)
            etag = _etag(view)
            same = self._error is None and etag == self._last_etag
            # The whole view's body now, in this thread (requests are served the old one meanwhile).
            body = None if same else _encode(200, view.to_dict(namespace=self.namespace), etag, view.time)
        except Exception as exc:
            self._failed(exc)
            return
        self.refreshes += 1
        self._outage().succeeded("/load answered 503 meanwhile")
        with self._lock:
            self._refreshed = view.time
            self._good = time.monotonic()
            if body is None:
                return  # the same values: the kept bodies stand (their times are the older view's)
            self._error = None
            self._view = view
            self._last_etag = etag
            self._generation += 1
            self._whole.kept = (self._generation, body)

    def _outage(self) -> Outage:
        """The outages of this reader's ``/load`` refreshes (one per reader, whatever the feeds)."""
        config = self.reader.config
        return shared(
            self.reader,
            "load",
            lambda: Outage(
                f"/load refreshes of namespace {config.namespace!r} from {config.safe_url}",
                log,
                retry=f"tried again every {self.refresh:g} s (/load answers 503 until then)",
            ),
        )

    def _failed(self, exc: Exception) -> None:
        """A refresh failed: every answer is a ``503`` saying why until one succeeds. Redis'
        failures are logged at DEBUG (the ``503`` says them); anything else is a background
        error (counted, logged once with its traceback)."""
        self.failures += 1
        kind = error_kind(exc)
        if kind != "other":  # Redis: the start and the end of each outage are logged
            log.debug("load refresh failed: %s", exc)
            self._outage().failed(kind, redact(str(exc), self.reader.config.url))
        else:
            survived("load", exc, log)
        doc = unknown_document(kind, redact(str(exc), self.reader.config.url))
        with self._lock:
            self._error = _encode(503, doc, "", 0.0)
            self._generation += 1
            self._last_etag = ""


def feed_of(source: Source) -> LoadFeed:
    """The ``/load`` feed of *source*'s namespace (a view state: one per namespace)."""
    options = source.options
    return LoadFeed(
        source.reader,  # its plans are the load feed's own (a reader keeps one per feed)
        refresh=options.load_refresh,
        engines=None if options.engines is None else list(options.engines),
        only=options.slice,
        idle=options.load_idle,
    )
