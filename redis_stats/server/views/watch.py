"""``GET /watch``: every change of every engine's load, pushed to the subscribers that wait for it.

A router that polls ``/load`` sees a change a refresh (0.25 s) plus its own poll interval after
Redis does, and asks again and again for a document that has not changed (llm-d-router PR #2067:
95 % of its polls fetched unchanged state). ``/watch`` pushes each change instead, as a stream of
Server-Sent Events on one connection, or as a long poll (the subscriber names the last event it
has, ``?since=<seq>``, and the answer comes as soon as there is a newer one, or after ``wait``
seconds, empty): a subscriber costs nothing while nothing changes, and a change reaches every
subscriber together.

One read serves every subscriber: the namespace's watch feed
(:mod:`redis_stats.server.states.watch_feed`) reads the load hash, numbers each change of an
engine as an event (``seq``; ``epoch``, a new one when the exporter restarts) and keeps the last
ones; the view answers from what it keeps.

Answers (JSON):

- ``/watch`` (no ``since``): ``{"epoch", "seq", "engines": {<engine>: <state doc>}}``, the state
  now, from which to follow.
- ``/watch?since=<seq>&epoch=<epoch>[&wait=<s>]``: ``{"epoch", "seq", "events": [<event>...]}``,
  the events after ``since`` (empty after ``wait`` seconds, 10 by default, at most 30, without
  one); or the whole state with ``"gap": true``.

- ``/watch`` with ``Accept: text/event-stream``: the same as **Server-Sent Events** on one
  connection for as long as the subscriber stays: the whole state (``event: state``), then every
  event as it comes (``id: <epoch>-<seq>``; a reconnect's ``Last-Event-ID`` resumes from it, or
  gets the whole state again), a comment every 15 s without one
  (:data:`~redis_stats.server.states.watch_feed.KEEPALIVE`). No request
  per change: a subscriber costs a wakeup per read that changed something.

While the load is not known (the store cannot be read: :mod:`redis_stats.routers.vouch`), the
whole state and a long poll answer ``503`` with ``{"feed": "unknown", "error", "detail"}``, and a
stream gets that document as an ``event: unknown``; once it is known again, a new ``epoch``
starts from the whole state (a stream's ``event: state``, a long poll's gap).

A streaming or waiting subscriber holds one of the server's **stream** slots
(``--max-streams``), apart from the connections for requests (``--max-connections``): subscribers
at their limit get ``503`` themselves, and never keep ``/metrics``, ``/load`` or ``/healthz``
from answering.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis_stats.server.http import HTTPError, Request, Response, json_response
from redis_stats.server.states.watch_feed import FeedUnknown, WatchFeed, watch_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["DEFAULT_WAIT", "MAX_WAIT", "PATH", "answer"]

PATH = "/watch"

MAX_WAIT = 30.0
"""Seconds a long poll may ask to wait at most (``?wait=``)."""

DEFAULT_WAIT = 10.0
"""Seconds a long poll waits for an event without ``?wait=``."""


def answer(app: App, request: Request) -> Response:
    """``/watch`` of the request's namespace (module docstring)."""
    source = app.source(request)
    feed = source.state(watch_of)
    since, epoch, wait = request.one("since"), request.one("epoch"), request.one("wait")
    headers = (("Cache-Control", "no-store"),)
    if "text/event-stream" in request.header("Accept"):
        return _stream(feed, request, since, epoch)
    if since is not None and not _sequence(since):
        raise HTTPError(400, f"since={since[:40]!r} is not a sequence number (the seq of your last answer)")
    try:
        seconds = DEFAULT_WAIT if wait is None else float(wait)
    except ValueError:
        raise HTTPError(400, f"wait={(wait or '')[:40]!r} is not a number of seconds") from None
    if not 0 <= seconds <= MAX_WAIT:
        raise HTTPError(400, f"wait={(wait or '')[:40]!r} must be 0 to {MAX_WAIT:g} seconds")
    try:
        if since is None:
            return json_response(200, feed.snapshot(), headers)
        if seconds > 0:
            request.long_lived()  # a waiting subscriber holds a stream's slot, not a request's
        return Response(200, feed.since(int(since), epoch or "", seconds), headers=headers)
    except FeedUnknown as unknown:
        return json_response(503, unknown.doc, headers)


def _sequence(text: str) -> bool:
    """Whether *text* is a sequence number (at most 18 digits: a feed's seq is an int64)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _stream(feed: WatchFeed, request: Request, since: str | None, epoch: str | None) -> Response:
    """The Server-Sent Events answer: from ``Last-Event-ID`` (``<epoch>-<seq>``, a reconnect) or
    ``?since=`` and ``?epoch=``, else the whole state first."""
    resume = request.header("Last-Event-ID")
    if resume:
        epoch, _, since = resume.rpartition("-")
    if since is not None and not _sequence(since):
        raise HTTPError(400, f"since={since[:40]!r} is not a sequence number (the seq of your last event)")
    start = None if since is None else int(since)
    request.long_lived()  # a stream's slot, or a 503 when the streams are at their limit
    return Response(200, content_type="text/event-stream", stream=feed.stream(start, epoch or ""))
