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

from redis_stats.background import survive
from redis_stats.connection import is_cluster
from redis_stats.load import FIELDS, EngineLoad, LoadView, decode_entries, engine_load
from redis_stats.server.source import Source
from redis_stats.server.states.load_feed import LoadBody, LoadFeed, feed_of

__all__ = ["IDLE", "INTERVAL", "KEEP", "KEEPALIVE", "WatchFeed", "watch_of"]

log = logging.getLogger("redis_stats.exporter")

INTERVAL = 0.02
"""Seconds between two reads of the load hash (every subscriber's, together)."""

KEEP = 100_000
"""Events kept for subscribers that come back (a ``since`` older than these: a gap)."""

IDLE = 60.0
"""Seconds without a subscriber after which the feed stops reading."""

KEEPALIVE = 15.0
"""Seconds a stream waits for an event before it sends a comment (a dead subscriber is found by
the write, and a proxy does not close a silent connection)."""


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
    return all(a.get(k) == b.get(k) for k in ("state", "endpoint", *FIELDS))


class WatchFeed:
    """The change feed of one namespace (module docstring): one reader thread, any number of
    subscribers waiting on one condition. *load* gives the namespace's ``/load`` feed (liveness
    and states); *interval*, *keep* and *idle* as :data:`INTERVAL`, :data:`KEEP`, :data:`IDLE`."""

    def __init__(
        self,
        source: Source,
        load: Callable[[], LoadFeed],
        *,
        interval: float = INTERVAL,
        keep: int = KEEP,
        idle: float = IDLE,
    ) -> None:
        self.reader = source.reader
        self._load = load  # the /load feed, asked for when first read: never while making this
        self.interval, self.idle = interval, idle
        self.epoch = secrets.token_hex(6)
        self.changed = threading.Condition()
        self.seq = 0
        # (seq, the event's JSON, the same as one Server-Sent Event): encoded once, every
        # subscriber's answer joins these bytes (100 streams of 2,000 events a second framed per
        # subscriber were the exporter's busiest work)
        self.events: deque[tuple[int, bytes, bytes]] = deque(maxlen=keep)
        self.state: dict[int, dict[str, Any]] = {}
        self.reads = 0
        self._raw: dict[str, Any] = {}
        self._fields: dict[str, int | None] = {}  # a load hash field -> its engine (None: not one)
        self._basis: dict[int, tuple[Any, ...]] = {}  # engine -> what its last doc was made of
        self._asked = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._starting = threading.Lock()

    def close(self) -> None:
        """Stop the reader thread, and end every stream."""
        self._stop.set()
        with self.changed:
            self.changed.notify_all()

    def ask(self) -> None:
        """A subscriber is here: the reader runs (started now, with one read, if it does not)."""
        self._asked = time.monotonic()
        if self._thread is not None or self._stop.is_set():
            return
        with self._starting:
            if self._thread is None:
                self._read_once()
                self._thread = threading.Thread(target=self._loop, name="redis_stats-watch", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if time.monotonic() - self._asked > self.idle:
                with self._starting:
                    self._thread = None  # nobody watches: stop reading (the next one restarts)
                return
            with survive("watch", log):
                self._read_once()

    def _read_once(self) -> None:
        """One read of the load hashes; an event for each engine whose state or numbers changed."""
        current = self._load().current()  # also keeps the /load refresher running
        if isinstance(current, LoadBody):
            return  # no full read to judge liveness by: nothing is claimed (the /load 503 says why)
        view = current[0]
        now_ms, raw = self._read_hashes()
        self.reads += 1
        engines = self._touched(view, raw)
        self._raw = raw
        if not engines:
            return
        by_engine: dict[int, list[tuple[str, Any]]] = {e: [] for e in engines}
        known = self._fields
        for field, value in raw.items():  # one pass over the entries, not one per touched engine
            engine = known.get(field, _UNKNOWN)
            if engine is _UNKNOWN:
                engine = known[field] = self._engine_of(field)
            if engine is not None and engine in by_engine:
                by_engine[engine].append((field.partition("|")[2], value))
        docs = [d for e in engines if (d := self._changed(e, view, by_engine[e], now_ms))]
        if docs:
            with self.changed:
                for doc in docs:
                    self.seq += 1
                    doc["seq"] = self.seq
                    self.state[doc["engine"]] = doc
                    event = json.dumps(doc, allow_nan=False).encode()
                    self.events.append((self.seq, event, _sse(event, f"{self.epoch}-{self.seq}")))
                self.changed.notify_all()

    def _touched(self, view: LoadView, raw: dict[str, Any]) -> list[int]:
        """The engines whose entries changed since the last read, or whose state did (or that came
        or went) since the last events."""
        old, known = self._raw, self._fields
        if len(known) > 2 * len(raw) + 1024:  # fields of writers long gone: forget them
            known.clear()
        touched: set[int | None] = set()
        # Each field's engine parsed once, when the field first appears (a fleet's 2,048 fields
        # parsed at every read, 50 a second, were a tenth of the feed's CPU).
        for field in [f for f, v in raw.items() if old.get(f) != v] + list(old.keys() - raw.keys()):
            engine = known.get(field, _UNKNOWN)
            if engine is _UNKNOWN:
                engine = known[field] = self._engine_of(field)
            touched.add(engine)
        touched |= set(view.engines) ^ set(self.state)
        touched |= {e for e, load in view.engines.items() if self.state.get(e, {}).get("state") != load.state}
        return sorted(x for x in touched if x is not None)

    def _changed(
        self, engine: int, view: LoadView, stored: list[tuple[str, Any]], now_ms: float
    ) -> dict[str, Any] | None:
        """*engine*'s new state doc (from its *stored* entries: (writer, entry) pairs), or None
        when it says what the last one said."""
        load = view.engines.get(engine)
        if load is None:
            self._basis.pop(engine, None)
            if engine not in self.state:
                return None
            gone = {"engine": engine, "state": "gone", "endpoint": None}
            del self.state[engine]
            return gone
        live = [(writer, v) for writer, v in stored if writer in load.live_writers]
        # What the doc is made of, but the entries' stored times (an entry stored again with the
        # same numbers: a flush of an idle engine): the same basis makes the same doc.
        basis = (load.state, load.endpoint, *(_numbers(v) for _, v in live))
        last = self.state.get(engine)
        if last is not None and self._basis.get(engine) == basis:
            return None
        self._basis[engine] = basis
        entries = [e for e in decode_entries([v for _, v in live]) if e is not None]
        fresh = engine_load(engine, load.up, load.age_seconds, entries, now_ms)
        fresh.state, fresh.endpoint = load.state, load.endpoint
        doc = _doc(fresh)
        return None if _same(last, doc) else doc

    @staticmethod
    def _engine_of(field: str) -> int | None:
        engine, sep, _ = field.partition("|")
        return int(engine) if sep and engine.isascii() and engine.isdigit() else None

    def _read_hashes(self) -> tuple[float, dict[str, Any]]:
        """(Redis' time in ms, every shard's load hash: field -> stored entry), in one pipeline
        (no transaction: each hash is whole, and the entries are absolute values); on a Cluster,
        where redis-py sends no keyless command in a pipeline, the time is asked of shard 0's
        node apart."""
        client: Any = self.reader.client
        keys = [k.load for k in self.reader.shard_keys]
        pipe = client.pipeline(transaction=False)
        cluster = is_cluster(client)
        if not cluster:
            pipe.time()
        for key in keys:
            pipe.hgetall(key)
        replies = pipe.execute(raise_on_error=False)
        if cluster:
            now = client.execute_command("TIME", target_nodes=client.get_node_from_key(keys[0]))
            replies = [now, *replies]
        now = replies[0]
        now_ms = now[0] * 1000.0 + now[1] / 1000.0 if isinstance(now, (list, tuple)) else time.time() * 1000.0
        out: dict[str, Any] = {}
        for found in replies[1:]:
            out.update(_texts(found))
        return now_ms, out

    def since(self, seq: int, epoch: str, wait: float) -> bytes:
        """The answer (JSON) to a subscriber that has everything up to *seq* of *epoch*: the
        events after it, waiting up to *wait* s for one; or the whole state with a gap."""
        self.ask()
        deadline = time.monotonic() + wait
        with self.changed:
            while True:
                oldest = self.events[0][0] if self.events else self.seq + 1
                if epoch != self.epoch or seq > self.seq or seq < oldest - 1:
                    return json.dumps({**self.snapshot_locked(), "gap": True}, allow_nan=False).encode()
                left = deadline - time.monotonic()
                if self.seq > seq or left <= 0:
                    events = [event for _, event, _ in self._after(seq)]
                    head = f'{{"epoch": "{self.epoch}", "seq": {self.seq}, "events": ['.encode()
                    return head + b", ".join(events) + b"]}"
                self.changed.wait(left)

    def stream(self, since: int | None, epoch: str) -> Iterator[bytes]:
        """The feed as Server-Sent Events, for as long as the subscriber stays: the whole state
        first (an ``event: state``) unless *since* of *epoch* is still held, then every event as
        it comes (``id: <epoch>-<seq>``, what ``Last-Event-ID`` gives back on a reconnect), a
        comment every :data:`KEEPALIVE` seconds without one. One subscriber is one connection
        and one thread, woken once per read that changed something: no request per change."""
        last, gap = since, since is None
        while not self._stop.is_set():
            self.ask()
            with self.changed:
                oldest = self.events[0][0] if self.events else self.seq + 1
                if gap or last is None or epoch != self.epoch or last > self.seq or last < oldest - 1:
                    state, last, gap, epoch = self.snapshot_locked(), self.seq, False, self.epoch
                    chunk = _sse(json.dumps(state, allow_nan=False).encode(), f"{epoch}-{last}", "state")
                else:
                    if self.seq == last:
                        self.changed.wait(KEEPALIVE)
                        if self._stop.is_set():
                            return  # the exporter closes: the stream ends
                    events = self._after(last)
                    chunk = b"".join(framed for _, _, framed in events) or b": keepalive\n\n"
                    last = events[-1][0] if events else last
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
        """The whole state now: every engine's last doc, and the sequence it is at."""
        self.ask()
        with self.changed:
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
    return f"{head}id: {event_id}\ndata: ".encode() + data + b"\n\n"


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
