"""The watch feed of ``GET /watch``: every change of every engine's load, as numbered events.

**One read serves every subscriber.** One thread per namespace (:class:`WatchFeed`, started by the
first subscriber, stopped after :data:`IDLE` seconds without one) reads the load hash alone
(``HGETALL`` of each shard's: the writers' entries, which the writers' load lane keeps within
80 ms of their engines) every :data:`INTERVAL` seconds, and finds the engines whose entries
changed; who is live, and the engines' states, come from the ``/load`` feed's newest full read
(every 0.25 s). Each change becomes an **event**: the engine, its ``state`` (``up``, ``stale``,
``down``: the one rule of every view), its endpoint and the load feed's fields (rolled up over
its live writers as ``/load`` rolls them), numbered by a **sequence** of this feed (``seq``, one
more per event): a subscriber that skipped a number knows it. Events are kept (the last
:data:`KEEP`); a subscriber whose ``since`` is older than that, or of another run of the feed
(``epoch``: a new one when the exporter restarts), gets ``"gap": true`` and the whole state
instead, and continues from there.

**What is not known is said** (:mod:`redis_stats.routers.vouch`, the rule every view a router
reads follows). While the store cannot be read — the feed's own read fails, the ``/load`` feed
it judges liveness by answers ``503``, or the last good read is older than the ``/load`` feed's
bound (a read stuck on a frozen Redis) — the feed is **unknown**: one event says so
(``{"feed": "unknown", "error", "detail"}``, an ``event: unknown`` on a stream), and a long poll
or the whole state answers ``503`` with the reason instead of the last numbers. When a read
succeeds again the feed starts a new ``epoch`` from the whole state read then: a stream gets an
``event: state``, a long poll a gap and the whole state. An engine is ``up``/``stale`` only with
numbers some live writer stored, ``down`` as soon as its writers' entries are gone (a closing
writer deletes them with its close: the feed reads them every 20 ms, before the next full read
says ``down``), and ``unknown`` while live without numbers.

**Bounded.** The history kept for subscribers that come back is at most :data:`KEEP` events and
:attr:`WatchFeed.keep_bytes` bytes (a share of the server's ``--view-budget``, and counted in it:
``redis_stats_exporter_kept_bytes{kind="watch_history"}``), and is given back when nobody has
watched for the feed's idle time (the history, the state, and the memory to the system). Its
state is changed under the one lock it is read under.

What a subscriber asks of it: :meth:`WatchFeed.snapshot` (the whole state now), :meth:`WatchFeed.since`
(a long poll: the events after a sequence number, or the whole state with a gap) and
:meth:`WatchFeed.stream` (Server-Sent Events for as long as it stays). The answers' forms are the
view's (:mod:`redis_stats.server.views.watch`).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from redis_stats.background import survive, survived
from redis_stats.config import redact
from redis_stats.connection import is_cluster
from redis_stats.errors import error_kind
from redis_stats.load import FIELDS, EngineLoad, LoadView, add_bookings, decode_entries, engine_load
from redis_stats.routers.vouch import engine_state, unknown_document
from redis_stats.server.kept import release_memory
from redis_stats.server.source import Source
from redis_stats.server.states.load_feed import LoadBody, LoadFeed, feed_of

__all__ = ["IDLE", "INTERVAL", "KEEP", "KEEPALIVE", "FeedUnknown", "WatchFeed", "watch_of"]

log = logging.getLogger("redis_stats.exporter")

INTERVAL = 0.02
"""Seconds between two reads of the load hash (every subscriber's, together)."""

KEEP = 100_000
"""Events kept at most for subscribers that come back (a ``since`` older than these: a gap)."""

KEEP_SHARE = 16
"""The history is kept in at most ``view_budget / KEEP_SHARE`` bytes (16 MiB of the default 256)."""

EVENT_BYTES = 200
"""What a kept event holds beyond its two encodings (its tuple, its int, the deque's slot)."""

IDLE = 60.0
"""Seconds without a subscriber after which the feed stops reading (and gives back its history)."""

KEEPALIVE = 15.0
"""Seconds a stream waits for an event before it sends a comment (a dead subscriber is found by
the write, and a proxy does not close a silent connection)."""


class FeedUnknown(Exception):
    """The feed has no load to give (the store cannot be read): :attr:`doc` says why."""

    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__(doc.get("detail", ""))
        self.doc = doc


def _doc(load: EngineLoad) -> dict[str, Any]:
    """An engine's state as an event carries it (no ``seq``: the event's)."""
    doc: dict[str, Any] = {"engine": load.engine, "state": load.state, "endpoint": load.endpoint}
    doc.update(load.to_dict())
    doc.pop("up", None)
    doc.pop("seq", None)
    return doc


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """Whether two state docs say the same (their ages aside)."""
    if a is None:
        return False
    return all(a.get(k) == b.get(k) for k in ("state", "endpoint", "booked", *FIELDS))


class _History:
    """The watch feed's history as the server's budget sees it (a kept entry): its bytes, and
    a close (the budget needed the room, or nobody asked for the idle time) that drops it."""

    def __init__(self, feed: WatchFeed) -> None:
        self.feed = feed

    def kept_bytes(self) -> int:
        return self.feed.history_bytes

    def close(self) -> None:
        self.feed.forget()


class WatchFeed:
    """The change feed of one namespace (module docstring): one reader thread, any number of
    subscribers waiting on one condition. *load* gives the namespace's ``/load`` feed (liveness
    and states); *interval*, *keep* and *idle* as :data:`INTERVAL`, :data:`KEEP`, :data:`IDLE`;
    *keep_bytes* bounds the history's bytes (default: a :data:`KEEP_SHARE` of the server's view
    budget, and the history is one of the server's kept entries)."""

    def __init__(
        self,
        source: Source,
        load: Callable[[], LoadFeed],
        *,
        interval: float = INTERVAL,
        keep: int = KEEP,
        keep_bytes: int | None = None,
        idle: float = IDLE,
    ) -> None:
        self.reader = source.reader
        self.source = source
        self._load = load  # the /load feed, asked for when first read: never while making this
        self.interval, self.idle, self.keep = interval, idle, keep
        self.keep_bytes = keep_bytes if keep_bytes is not None else source.options.view_budget // KEEP_SHARE
        self.epoch = secrets.token_hex(6)
        self.changed = threading.Condition()
        self.seq = 0
        # (seq, the event's JSON, the same as one Server-Sent Event): encoded once, every
        # subscriber's answer joins these bytes (100 streams of 2,000 events a second framed per
        # subscriber were the exporter's busiest work)
        self.events: deque[tuple[int, bytes, bytes]] = deque()
        self.history_bytes = 0
        self.state: dict[int, dict[str, Any]] = {}
        self.unknown: dict[str, Any] | None = None  # why the load is not known now (None: it is)
        self.reads = 0
        self._raw: dict[str, Any] = {}
        self._good = time.monotonic()  # the last read that succeeded (or the start)
        self._booked: dict[int, int] = {}  # routers' bookings by engine, as of the last read
        self._fields: dict[str, int | None] = {}  # a load hash field -> its engine (None: not one)
        self._basis: dict[int, tuple[Any, ...]] = {}  # engine -> what its last doc was made of
        self._live: dict[int, frozenset[str]] = {}  # engine -> its live writers, as of the last read
        self._asked = 0.0
        self._registered = 0.0
        self._whole = True  # the next read builds the whole state anew (a new epoch)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._starting = threading.Lock()

    def close(self) -> None:
        """Stop the reader thread, and end every stream."""
        self._stop.set()
        with self.changed:
            self.changed.notify_all()

    @property
    def max_age(self) -> float:
        """Seconds past the last good read after which the feed is unknown (``/load``'s bound)."""
        return self._load().max_age

    def ask(self) -> None:
        """A subscriber is here: the reader runs (started now, with one read, if it does not)."""
        now = self._asked = time.monotonic()
        if now - self._registered > 1.0:  # the history in the server's budget (kept while asked)
            self._registered = now
            self.source.kept("watch_history", "", lambda: _History(self))
        if self._thread is not None or self._stop.is_set():
            return
        with self._starting:
            if self._thread is None:
                with survive("watch", log):
                    self._read_once()
                self._thread = threading.Thread(target=self._loop, name="redis_stats-watch", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if time.monotonic() - self._asked > self.idle:
                with self._starting:
                    self._thread = None  # nobody watches: stop reading (the next one restarts)
                self.forget()
                return
            with survive("watch", log):
                self._read_once()

    def forget(self) -> None:
        """Drop the history and the state (nobody watches, or the budget needs the room): a
        subscriber that comes back gets the whole state of a new epoch; memory goes back."""
        with self.changed:
            self.events.clear()
            self.history_bytes = 0
            self.state, self._raw = {}, {}
            self.epoch = secrets.token_hex(6)
            self._whole = True
            self.changed.notify_all()
        release_memory()  # the history's, and what the subscribers' threads left in the heap

    def _read_once(self) -> None:
        """One read of the load hashes; an event for each engine whose state or numbers changed
        (the whole state anew, in a new epoch, after the feed was unknown); the feed unknown
        when the store cannot be read."""
        current = self._load().current()  # also keeps the /load refresher running
        if isinstance(current, LoadBody):  # no full read to judge liveness by: the /load 503's why
            self._not_known(json.loads(current.body))
            return
        view = current[0]
        try:
            now_ms, raw, booked = self._read_hashes()
        except Exception as exc:
            kind = error_kind(exc)
            self._not_known({"error": kind, "detail": redact(str(exc), self.reader.config.url)})
            if kind == "other":
                survived("watch", exc, log)
            return
        self.reads += 1
        if self.unknown is not None or self._whole:
            self._restart(view, raw, booked, now_ms)
            return
        engines = self._touched(view, raw, booked)
        self._raw, self._booked = raw, booked
        docs = self._docs(engines, view, raw, booked, now_ms)
        with self.changed:
            self._good = time.monotonic()
            for doc in docs:
                self._append(doc)
                if doc["state"] == "gone":
                    self.state.pop(doc["engine"], None)
                else:
                    self.state[doc["engine"]] = doc
            if docs:
                self.changed.notify_all()

    def _restart(self, view: LoadView, raw: dict[str, Any], booked: dict[int, int], now_ms: float) -> None:
        """The whole state from this read, in a new epoch (the feed was unknown, or starts)."""
        self._raw, self._booked = raw, booked
        self._basis = {}
        self._live = {e: load.live_writers for e, load in view.engines.items()}
        docs = self._docs(sorted(view.engines), view, raw, booked, now_ms, fresh=True)
        with self.changed:
            self._good = time.monotonic()
            self.unknown = None
            self._whole = False
            self.epoch = secrets.token_hex(6)
            self.events.clear()
            self.history_bytes = 0
            self.state = {}
            for doc in docs:
                self._append(doc)
                self.state[doc["engine"]] = doc
            self.changed.notify_all()

    def _not_known(self, why: dict[str, Any]) -> None:
        """The store cannot be read: the feed is unknown (one event says so), as ``/load``
        answers ``503`` from its first failed refresh."""
        if self.unknown is not None:
            return
        doc = unknown_document(
            str(why.get("error", "unreadable")),
            f"the load is not known: {why.get('detail', 'the store cannot be read')}",
        )
        self._mark_unknown(doc)

    def _mark_unknown(self, doc: dict[str, Any]) -> None:
        with self.changed:
            if self.unknown is not None:
                return
            self.unknown = doc
            self._append(doc, "unknown")
            self.changed.notify_all()

    def _append(self, doc: dict[str, Any], kind: str | None = None) -> None:
        """One more event (the condition held): numbered, encoded once, the history bounded."""
        self.seq += 1
        doc["seq"] = self.seq
        event = json.dumps(doc, allow_nan=False).encode()
        framed = _sse(event, f"{self.epoch}-{self.seq}", kind)
        self.events.append((self.seq, event, framed))
        self.history_bytes += len(event) + len(framed) + EVENT_BYTES
        while len(self.events) > self.keep or (self.history_bytes > self.keep_bytes and len(self.events) > 1):
            _, old, old_framed = self.events.popleft()
            self.history_bytes -= len(old) + len(old_framed) + EVENT_BYTES

    def check(self) -> dict[str, Any] | None:
        """Why the load is not known now (None: it is): the feed's own verdict, or a last good
        read older than :attr:`max_age` (a read stuck on a frozen store), which marks it unknown."""
        if self.unknown is not None:
            return self.unknown
        age = time.monotonic() - self._good
        if age > self.max_age:
            self._mark_unknown(
                unknown_document(
                    "stale",
                    f"the load is not known: the feed last read the store {age:.1f} s ago, more than "
                    f"the {self.max_age:g} s it vouches for (the read is waiting on the store)",
                )
            )
        return self.unknown

    def _docs(
        self,
        engines: list[int],
        view: LoadView,
        raw: dict[str, Any],
        booked: dict[int, int],
        now_ms: float,
        *,
        fresh: bool = False,
    ) -> list[dict[str, Any]]:
        """The new state docs of *engines* (all of them when *fresh*, else only those that changed),
        with the routers' *booked* requests by engine."""
        by_engine: dict[int, list[tuple[str, Any]]] = {e: [] for e in engines}
        if not engines:
            return []
        known, engine_at = self._fields, self._engine_at
        for field, value in raw.items():  # one pass over the entries, not one per touched engine
            engine = known.get(field, _UNKNOWN)
            if engine is _UNKNOWN:
                engine = engine_at(field)
            if engine is not None and engine in by_engine:
                by_engine[engine].append((field.partition("|")[2], value))
        return [d for e in engines if (d := self._changed(e, view, by_engine[e], booked, now_ms, fresh))]

    def _touched(self, view: LoadView, raw: dict[str, Any], booked: dict[int, int]) -> list[int]:
        """The engines whose entries or bookings changed since the last read, or whose state did
        (or that came or went) since the last events."""
        old = self._raw
        if len(self._fields) > 2 * len(raw) + 1024:  # fields of writers long gone: forget them
            self._fields.clear()
        changed = [f for f, v in raw.items() if old.get(f) != v] + list(old.keys() - raw.keys())
        touched = set(map(self._engine_at, changed))
        touched |= {e for e in booked.keys() | self._booked.keys() if booked.get(e) != self._booked.get(e)}
        touched |= set(view.engines) ^ set(self.state)
        # A writer live (or not) since the last read, its entry unchanged: the engine's numbers
        # count it now (they waited for its entry to change again: up to a flush interval).
        live = {e: load.live_writers for e, load in view.engines.items()}
        touched |= {e for e, writers in live.items() if self._live.get(e) != writers}
        self._live = live
        touched |= {e for e, load in view.engines.items() if self.state.get(e, {}).get("state") != load.state}
        return sorted(x for x in touched if x is not None)

    def _changed(
        self,
        engine: int,
        view: LoadView,
        stored: list[tuple[str, Any]],
        booked: dict[int, int],
        now_ms: float,
        fresh: bool,
    ) -> dict[str, Any] | None:
        """*engine*'s new state doc (from its *stored* entries: (writer, entry) pairs, and the
        routers' *booked* requests by engine), or None when it says what the last one said (read
        only: the state changes under the lock)."""
        load = view.engines.get(engine)
        if load is None:
            self._basis.pop(engine, None)
            return (
                None
                if fresh or engine not in self.state
                else {"engine": engine, "state": "gone", "endpoint": None}
            )
        values = [v for writer, v in stored if writer in load.live_writers]
        if self._same_basis(engine, load, values, booked.get(engine), fresh):
            return None
        entries = [e for e in decode_entries(values) if e is not None]
        now = engine_load(engine, load.up, load.age_seconds, entries, now_ms)
        now.state, now.endpoint = load.state, load.endpoint
        # Its live writers' entries gone since the full read counted them: they closed.
        now.state = engine_state(now, entries_gone=load.up and load.writers > 0 and not entries)
        now.booked = booked.get(engine, 0) if load.up else None
        doc = _doc(now)
        return doc if fresh or not _same(self.state.get(engine), doc) else None

    def _same_basis(
        self, engine: int, load: EngineLoad, values: list[Any], booked: int | None, fresh: bool
    ) -> bool:
        """Whether *engine*'s doc would be made of what its last one was: its state, endpoint,
        liveness, bookings and its live writers' entries but their stored times (an entry stored
        again with the same numbers: a flush of an idle engine), so not decoded again; the basis
        kept for the next read (this reader thread alone reads and writes the bases)."""
        basis = (load.state, load.endpoint, load.up, load.writers, booked, *map(_numbers, values))
        if not fresh and self._basis.get(engine) == basis and engine in self.state:
            return True
        self._basis[engine] = basis
        return False

    def _engine_at(self, field: str) -> int | None:
        """*field*'s engine, parsed once, when the field first appears (a fleet's 2,048 fields
        parsed at every read, 50 a second, were a tenth of the feed's CPU)."""
        engine = self._fields.get(field, _UNKNOWN)
        if engine is _UNKNOWN:
            engine = self._fields[field] = self._engine_of(field)
        return engine  # type: ignore[no-any-return]

    @staticmethod
    def _engine_of(field: str) -> int | None:
        engine, sep, _ = field.partition("|")
        return int(engine) if sep and engine.isascii() and engine.isdigit() else None

    def _read_hashes(self) -> tuple[float, dict[str, Any], dict[int, int]]:
        """(Redis' time in ms, every shard's load hash: field -> stored entry, the routers'
        bookings that count by engine), in one pipeline (no transaction: each hash is whole, and
        the entries are absolute values; a booking and its router's lease are read together); on
        a Cluster, where redis-py sends no keyless command in a pipeline, the time is asked of
        shard 0's node apart."""
        client: Any = self.reader.client
        cluster = is_cluster(client)
        pipe = client.pipeline(transaction=False)
        if not cluster:
            pipe.time()
        for keys in self.reader.shard_keys:
            pipe.hgetall(keys.load)
            pipe.hgetall(keys.bookings)
            pipe.zrange(keys.routers, 0, -1, withscores=True)
        replies = pipe.execute(raise_on_error=False)
        if cluster:
            node = client.get_node_from_key(self.reader.shard_keys[0].load)
            replies = [client.execute_command("TIME", target_nodes=node), *replies]
        for reply in replies:
            if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
                raise reply  # the store cannot be read (a key of the wrong type is skipped: /load's rule)
        now = replies[0]
        now_ms = now[0] * 1000.0 + now[1] / 1000.0 if isinstance(now, (list, tuple)) else time.time() * 1000.0
        out: dict[str, Any] = {}
        booked: dict[int, int] = {}
        for found, bookings, routers in zip(replies[1::3], replies[2::3], replies[3::3]):
            out.update(_texts(found))
            if isinstance(routers, list):  # a key of the wrong type: no booking of that shard counts
                leases = {_text(router): float(end) for router, end in routers}
                add_bookings(booked, _texts(bookings).values(), leases, now_ms)
        return now_ms, out, booked

    def since(self, seq: int, epoch: str, wait: float) -> bytes:
        """The answer (JSON) to a subscriber that has everything up to *seq* of *epoch*: the
        events after it, waiting up to *wait* s for one; or the whole state with a gap;
        :class:`FeedUnknown` while the load is not known (before, or instead of, an answer)."""
        self.ask()
        deadline = time.monotonic() + wait
        with self.changed:
            while True:
                if self.check() is not None:
                    raise FeedUnknown(dict(self.unknown or {}))
                oldest = self.events[0][0] if self.events else self.seq + 1
                if epoch != self.epoch or seq > self.seq or seq < oldest - 1:
                    return json.dumps({**self.snapshot_locked(), "gap": True}, allow_nan=False).encode()
                left = deadline - time.monotonic()
                if self.seq > seq or left <= 0:
                    events = [event for _, event, _ in self._after(seq)]
                    head = f'{{"epoch": "{self.epoch}", "seq": {self.seq}, "events": ['.encode()
                    return head + b", ".join(events) + b"]}"
                self.changed.wait(min(left, self.max_age))

    def stream(self, since: int | None, epoch: str) -> Iterator[bytes]:
        """The feed as Server-Sent Events, for as long as the subscriber stays: the whole state
        first (an ``event: state``) unless *since* of *epoch* is still held, then every event as
        it comes (``id: <epoch>-<seq>``, what ``Last-Event-ID`` gives back on a reconnect), a
        comment every :data:`KEEPALIVE` seconds without one; an ``event: unknown`` while the load
        is not known, and the whole state again once it is. An empty chunk now and then (every
        ``max_age`` s without an event): the server writes nothing and checks the subscriber has
        not left, so a gone subscriber's slot comes back without waiting for a write to fail.
        One subscriber is one connection and one thread, woken once per read that changed
        something: no request per change."""
        last, gap = since, since is None
        quiet = time.monotonic()
        while not self._stop.is_set():
            self.ask()
            with self.changed:
                unknown = self.check()
                oldest = self.events[0][0] if self.events else self.seq + 1
                lost = gap or last is None or epoch != self.epoch or last > self.seq or last < oldest - 1
                if lost and unknown is not None:  # no state to give: say why, wait for the store
                    chunk = _sse(json.dumps(unknown).encode(), "", "unknown")
                    gap, last, epoch = False, self.seq, self.epoch
                elif lost:
                    state, last, gap, epoch = self.snapshot_locked(), self.seq, False, self.epoch
                    chunk = _sse(json.dumps(state, allow_nan=False).encode(), f"{epoch}-{last}", "state")
                elif last is not None and self.seq > last:
                    events = self._after(last)
                    chunk, last = b"".join(framed for _, _, framed in events), events[-1][0]
                elif time.monotonic() - quiet >= KEEPALIVE:
                    chunk = b": keepalive\n\n"
                elif self.changed.wait(min(KEEPALIVE - (time.monotonic() - quiet), self.max_age)):
                    continue  # woken by a change: looked at from the top
                else:  # nothing for a while: an empty chunk, on which the server checks the
                    chunk = b""  # subscriber is still there (it is written nothing)
            if chunk:
                quiet = time.monotonic()
            yield chunk

    def _after(self, seq: int) -> list[tuple[int, bytes, bytes]]:
        """The events after *seq* (the condition held), oldest first."""
        out = []
        for event in reversed(self.events):  # the newest few, usually
            if event[0] <= seq:
                break
            out.append(event)
        out.reverse()
        return out

    def snapshot(self) -> dict[str, Any]:
        """The whole state now: every engine's last doc, and the sequence it is at;
        :class:`FeedUnknown` while the load is not known."""
        self.ask()
        with self.changed:
            if self.check() is not None:
                raise FeedUnknown(dict(self.unknown or {}))
            return self.snapshot_locked()

    def snapshot_locked(self) -> dict[str, Any]:
        """:meth:`snapshot`, the condition held."""
        engines = {str(e): self.state[e] for e in sorted(self.state)}
        return {"epoch": self.epoch, "seq": self.seq, "engines": engines}


_UNKNOWN: Any = object()  # a field whose engine was not parsed yet


def _numbers(stored: Any) -> Any:
    """A stored entry without its stored time (``<server ms>,<entry>``): what a doc reads of it
    besides its age."""
    return stored.partition(",")[2] if isinstance(stored, str) else stored


def _sse(data: bytes, event_id: str, event: str | None = None) -> bytes:
    """One Server-Sent Event (*data* is one line of JSON: no newline in it)."""
    head = f"event: {event}\n" if event else ""
    ident = f"id: {event_id}\n" if event_id else ""
    return f"{head}{ident}data: ".encode() + data + b"\n\n"


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _texts(found: Any) -> dict[str, Any]:
    if not isinstance(found, dict):
        return {}
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in found.items()
    }


def watch_of(source: Source) -> WatchFeed:
    """The watch feed of *source*'s namespace (a view state: one per namespace)."""
    # Not source.state(feed_of) here: this runs under the source's lock, which that takes too.
    return WatchFeed(source, lambda: source.state(feed_of))
