"""A router's view of the fleet from the exporter (docs/load.md): pick the engine to send to.

    python docs/examples/load_router.py http://127.0.0.1:9400 [--count 20]          # follows /watch
    python docs/examples/load_router.py http://127.0.0.1:9400 --poll [--every 0.05]  # polls /load

By default it follows ``GET /watch`` (:class:`WatchClient`) as Server-Sent Events on one
connection: the whole state, then each change as soon as an engine changes (its numbers, or its
state), each numbered; a gap (the exporter restarted, or the client fell behind) gives the whole
state again. So the router's view is a change behind Redis by one read of the exporter (20 ms),
not by a refresh plus a poll interval, and an unchanged fleet costs nothing. With ``--poll``,
:class:`LoadClient` polls ``/load`` with ``If-None-Match`` (an unchanged fleet costs a ``304`` and
no body), keeps the last document, and picks, among the engines whose ``state`` is ``up`` and
whose data is fresh, the one with the fewest requests waiting, then the lowest KV-cache usage,
then the fewest running.
It falls back on ``stale`` engines (up, but a flush or more behind) only when no engine is ``up``,
and never sends to a ``down`` one: with none left it answers None, and the caller routes by its
own rule (round robin). An engine whose data is older than ``--stale`` seconds counts as unknown,
as the llm-d endpoint picker treats data older than 2 s.

It routes only on what the feed vouches for (docs/load.md, "What is not known"): an engine
without a waiting count (``null``: never read as 0) or with counts no engine can have (negative)
is never picked; while the exporter says the load is unknown (``/load`` answers ``503``, ``/watch``
sends ``event: unknown``) it picks nothing at all, until the whole state comes again. Only the
standard library: copy it into a router.

**As one of N replicas** (docs/routers.md, "Router replicas"): ``--book`` books each pick through
the exporter (:class:`HttpBookings`: ``POST /bookings``, an exporter started with ``--bookings``)
and picks by ``expected_in_flight`` (``pick_least``: the engines' own counts plus every replica's
bookings), so N copies of this router, each its own process, spread their dispatches as one::

    python docs/examples/load_router.py http://127.0.0.1:9400 --poll --book --count 20
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

SCHEMA_VERSION = 1  # the /load version this code reads (docs/load.md: what a version promises)


class LoadClient:
    """The last ``/load`` document of one exporter, refreshed with ``If-None-Match``."""

    def __init__(self, base_url: str, timeout: float = 1.0) -> None:
        self.url = base_url.rstrip("/") + "/load"
        self.timeout = timeout
        self.etag = ""
        self.doc: dict[str, Any] | None = None
        self.refreshed = 0.0  # the exporter's X-Load-Refreshed: its last read of Redis (server s)
        self.not_modified = 0
        self.unknown: dict[str, Any] | None = None  # why the exporter has no load now (a 503)

    def poll(self) -> dict[str, Any]:
        """The current document (the kept one when the exporter answers 304); while the exporter
        says the load is unknown (a ``503``), a document of no engine (and :attr:`unknown` why)."""
        headers = {"Accept-Encoding": "gzip"}
        if self.etag:
            headers["If-None-Match"] = self.etag
        request = urllib.request.Request(self.url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                body = resp.read()
                if resp.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                doc = json.loads(body)
                if doc.get("schema_version") != SCHEMA_VERSION:
                    raise ValueError(f"/load schema_version {doc.get('schema_version')!r}, this code reads 1")
                self.doc, self.etag = doc, resp.headers.get("ETag", "")
                self.refreshed = float(resp.headers.get("X-Load-Refreshed", doc["time"]))
                self.unknown = None
        except urllib.error.HTTPError as exc:
            if exc.code == 503:  # the load is not known: route by nothing of it
                body = exc.read()
                if exc.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                self.doc, self.etag, self.unknown = None, "", json.loads(body or b"{}")
                return {"time": 0.0, "engines": {}, "fleet": None}
            if exc.code != 304 or self.doc is None:
                raise
            self.not_modified += 1
            self.refreshed = float(exc.headers.get("X-Load-Refreshed", self.refreshed))
        assert self.doc is not None
        return self.doc


def candidates(doc: dict[str, Any], refreshed: float, stale: float = 2.0) -> list[tuple[int, dict[str, Any]]]:
    """The engines a request may go to: those ``up`` with data at most *stale* seconds old (the
    document's ages are as of its ``time``; the exporter confirmed them at *refreshed*); when
    there is none, the ``stale`` ones (up, a flush or more behind: better than no engine); never
    a ``down`` one, nor one without a waiting count, or with a count no engine can have. A document without ``state``
    (an older exporter) is read by ``up``."""
    fresh, behind = [], []
    for name, engine in doc["engines"].items():
        state = engine.get("state", "up" if engine["up"] else "down")
        running = engine.get("requests_running")
        if not counted(engine.get("requests_waiting")) or not (running is None or counted(running)):
            continue  # no queue (null is not 0), or a count no engine has: not vouched for
        age = engine["age_seconds"] + max(0.0, refreshed - doc["time"])
        if state == "up" and age <= stale:
            fresh.append((int(name), engine))
        elif state == "stale":
            behind.append((int(name), engine))
    return fresh or behind


def counted(value: Any) -> bool:
    """Whether *value* is a count an engine can have (a number, not negative)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")


def pick(doc: dict[str, Any], refreshed: float, stale: float = 2.0) -> int | None:
    """The engine to send the next request to, or None when no engine qualifies."""

    def cost(item: tuple[int, dict[str, Any]]) -> tuple[float, float, float, int]:
        engine, load = item
        return (
            load["requests_waiting"] or 0.0,
            load["kv_cache_usage"] or 0.0,
            load["requests_running"] or 0.0,
            engine,
        )

    found = candidates(doc, refreshed, stale)
    return min(found, key=cost)[0] if found else None


def pick_least(
    doc: dict[str, Any],
    field: str | None = "expected_in_flight",
    newer: list[int] | None = None,
    rng: random.Random | None = None,
) -> int | None:
    """For router replicas (docs/routers.md, "Router replicas"): the candidate engine with the
    fewest requests expected, ties broken at random (replicas that agree must not all pick the
    lowest index). *field*: ``expected_in_flight`` (the engine's count plus every replica's
    bookings), ``in_flight`` (requests counted where they landed), or None (running + waiting,
    the engine's own numbers); an engine that does not report *field* is read by running +
    waiting. *newer*: per engine, this replica's dispatches since *doc* was read (what no document
    can show yet)."""
    found = candidates(doc, doc.get("time", 0.0))
    if not found:
        return None

    def expected(engine: int, load: dict[str, Any]) -> float:
        value = load.get(field) if field else None
        if value is None:
            value = (load.get("requests_running") or 0) + (load.get("requests_waiting") or 0)
        return float(value) + (newer[engine] if newer is not None and engine < len(newer) else 0)

    costs = [(expected(engine, load), engine) for engine, load in found]
    low = min(cost for cost, _ in costs)
    return (rng or random).choice([engine for cost, engine in costs if cost == low])


class HttpBookings:
    """This replica's bookings through the exporter (``POST /bookings``, docs/routers.md): book a
    pick before sending the request with ``X-Request-Id: <its id>``, end it when the response
    ended; a thread renews the lease every third of it. *token*: a bearer token when the
    exporter's access control asks for one."""

    def __init__(self, base_url: str, lease: float = 2.0, bound: float = 2.0, token: str = "") -> None:
        self.url = base_url.rstrip("/") + "/bookings"
        self.router = f"example-{uuid.uuid4().hex[:12]}"
        self.lease, self.bound, self.token = lease, bound, token
        self.open: dict[str, int] = {}  # request id -> engine, booked and not ended
        self._stop = threading.Event()
        threading.Thread(target=self._renew, daemon=True).start()

    def _post(self, **params: Any) -> dict[str, Any]:
        query = urllib.parse.urlencode({"router": self.router, "lease": self.lease, **params})
        request = urllib.request.Request(f"{self.url}?{query}", method="POST", data=b"")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=2.0) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def book(self, engine: int) -> str:
        """Book a request on *engine*: its id, to send as ``X-Request-Id``. Where the store had
        lost this router's lease (Redis restarted), its open bookings are booked again."""
        request_id = uuid.uuid4().hex
        answer = self._post(op="book", engine=engine, request_id=request_id, bound=self.bound)
        self.open[request_id] = engine
        if answer.get("lease_lost"):
            for rid, e in list(self.open.items()):
                self._post(op="book", engine=e, request_id=rid, bound=self.bound)
        return request_id

    def end(self, request_id: str) -> None:
        """The response of *request_id* ended (or its send failed)."""
        engine = self.open.pop(request_id, None)
        if engine is not None:
            self._post(op="end", engine=engine, request_id=request_id)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                self._post(op="renew")
            except OSError:
                pass  # the next renewal tries again; past the lease, the bookings stop counting

    def close(self) -> None:
        """End the lease and every booking of this replica."""
        self._stop.set()
        self._post(op="release")


class WatchClient:
    """Every engine's state from ``/watch``, as Server-Sent Events on one connection: the whole
    state first, then each change as it comes; reconnected with ``Last-Event-ID`` after the
    connection drops (the feed sends what was missed, or the whole state again after a gap)."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.url = base_url.rstrip("/") + "/watch"
        self.timeout = timeout  # > the feed's 15 s keepalive: a silent connection is a dead one
        self.engines: dict[int, dict[str, Any]] = {}
        self.seq = 0
        self.epoch = ""
        self.gaps = 0
        self.last_id = ""
        self.unknown: dict[str, Any] | None = None  # why the feed vouches for nothing now
        self._stream: Any = None

    def _connect(self) -> None:
        headers = {"Accept": "text/event-stream"}
        if self.last_id:
            headers["Last-Event-ID"] = self.last_id
        request = urllib.request.Request(self.url, headers=headers)
        self._stream = urllib.request.urlopen(request, timeout=self.timeout)

    def _next(self) -> tuple[str, dict[str, Any]] | None:
        """The next event (its kind and data), or None for a keepalive comment."""
        kind, data = "message", ""
        while True:
            line = self._stream.readline()
            if not line:
                raise ConnectionError("the feed ended")
            text = line.decode().rstrip("\n")
            if not text:
                return (kind, json.loads(data)) if data else None
            field, _, value = text.partition(": ")
            if field == "event":
                kind = value
            elif field == "id":
                self.last_id = value
            elif field == "data":
                data = value

    def start(self) -> None:
        """Connect and take the whole state (the first event), or the feed's word that the load
        is not known."""
        self._connect()
        while not self.epoch and self.unknown is None:
            self.follow()

    def follow(self) -> list[dict[str, Any]]:
        """Wait for the next change (or a keepalive) and apply it; the events applied. A dropped
        connection is made again, from the last event seen."""
        try:
            got = self._next()
        except (OSError, ConnectionError):
            try:
                self._connect()
            except OSError as exc:  # the exporter is not there: nothing is vouched for
                self.unknown, self.engines = {"error": "connection", "detail": str(exc)}, {}
                time.sleep(0.2)
            return []
        if got is None:
            return []
        kind, doc = got
        if kind == "unknown":  # the store cannot be read: nothing held is vouched for any more
            self.unknown, self.engines = doc, {}
            return []
        if kind == "state":
            self.gaps += 1 if self.epoch else 0
            self.engines = {int(e): d for e, d in doc["engines"].items()}
            self.seq, self.epoch, self.unknown = doc["seq"], doc["epoch"], None
            return []
        if doc["state"] == "gone":
            self.engines.pop(doc["engine"], None)
        else:
            self.engines[doc["engine"]] = doc
        self.seq = doc["seq"]
        return [doc]

    def pick(self) -> int | None:
        """The engine to send the next request to (:func:`pick`'s rule on the followed state: an
        ``up`` engine, else a ``stale`` one, never a ``down`` or ``unknown`` one), or None (and
        None while the feed says the load is unknown)."""
        if self.unknown is not None:
            return None
        engines = {
            str(e): {**d, "age_seconds": 0.0, "up": d["state"] != "down"} for e, d in self.engines.items()
        }
        doc = {"time": 0.0, "engines": engines}
        return pick(doc, 0.0)

    def close(self) -> None:
        """Close the connection."""
        if self._stream is not None:
            self._stream.close()


def main() -> None:
    """Poll, pick, print: ``--count`` times, every ``--every`` seconds."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url", help="the exporter, e.g. http://127.0.0.1:9400")
    parser.add_argument("--every", type=float, default=0.05, help="seconds between two polls")
    parser.add_argument("--count", type=int, default=20, help="polls, then exit")
    parser.add_argument(
        "--stale", type=float, default=2.0, help="seconds after which an engine's data is unknown"
    )
    parser.add_argument("--poll", action="store_true", help="poll /load instead of following /watch")
    parser.add_argument(
        "--book",
        action="store_true",
        help="as one of N replicas: book each pick (POST /bookings), pick least expected",
    )
    opts = parser.parse_args()
    if opts.book:
        replicas(opts)
        return
    if not opts.poll:
        watch = WatchClient(opts.url)
        watch.start()
        for _ in range(opts.count):
            events = watch.follow()
            print(
                f"send to engine {watch.pick()}; {len(events)} changes, at seq {watch.seq}, gaps {watch.gaps}"
            )
        return
    client = LoadClient(opts.url)
    for _ in range(opts.count):
        doc = client.poll()
        fleet = doc["fleet"]
        if fleet is None:
            print(f"no engine: the load is not known ({client.unknown})")
            time.sleep(opts.every)
            continue
        print(
            f"send to engine {pick(doc, client.refreshed, opts.stale)}; "
            f"{fleet['engines_up']}/{fleet['engines']} up, waiting {fleet['requests_waiting']['sum']}, "
            f"KV max {fleet['kv_cache_usage']['max']}, 304s {client.not_modified}"
        )
        time.sleep(opts.every)


def replicas(opts: argparse.Namespace) -> None:
    """``--book``: poll ``/load``, pick the engine with the fewest requests expected, book it."""
    client, bookings = LoadClient(opts.url), HttpBookings(opts.url)
    try:
        for _ in range(opts.count):
            doc = client.poll()
            engine = pick_least(doc)
            if engine is not None:
                bookings.book(engine)  # then send the request with X-Request-Id: the id
            expected = doc["fleet"].get("expected_in_flight", {}).get("sum")
            print(f"send to engine {engine}; expected in flight {expected}, booked here {len(bookings.open)}")
            time.sleep(opts.every)
    finally:
        bookings.close()


if __name__ == "__main__":
    main()
