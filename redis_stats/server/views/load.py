"""``GET /load``: every engine's load for routers, the load feed's kept body.

The body (encoded and gzipped once per change), its weak ``ETag``, the ``X-Load-Refreshed`` time
and the ``503`` of a feed that cannot refresh are the load feed's
(:mod:`redis_stats.server.states.load_feed`): a request reads no Redis and encodes nothing; one
sending the body's ``ETag`` back in ``If-None-Match`` gets ``304 Not Modified`` with no body.
``?slice=i/N`` serves that slice of the engines, its body kept by the server per slice asked
(bounded in bytes, dropped when idle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis_stats.reader import EngineSlice
from redis_stats.server.http import HTTPError, Request, Response
from redis_stats.server.states.load_feed import SliceBody, feed_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer", "if_none_match"]


def if_none_match(request: Request, etag: str) -> bool:
    """Whether the request's ``If-None-Match`` names *etag* (or ``*``): answer ``304``."""
    wanted = request.header("If-None-Match")
    return bool(etag) and (etag in (t.strip() for t in wanted.split(",")) or wanted.strip() == "*")


def answer(app: App, request: Request) -> Response:
    """``/load`` of the request's namespace (``?slice=i/N``: that slice): the feed's kept body (no
    Redis read, no encoding here), or ``304`` when ``If-None-Match`` names its ETag."""
    source = app.source(request)
    feed = source.state(feed_of)
    part = _slice_param(request)
    try:
        kept = None if part is None else source.kept("load_slice", str(part), SliceBody)
        body = feed.answer(part, kept)
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None
    headers = [("Cache-Control", "no-cache"), ("X-Load-Refreshed", f"{body.refreshed:.3f}")]
    if body.etag:
        headers.append(("ETag", body.etag))
        if if_none_match(request, body.etag):
            return Response(304, headers=tuple(headers))
    zipped = request.gzip_ok
    return Response(
        body.status, body.gzipped if zipped else body.body, gzipped=zipped, headers=tuple(headers)
    )


def _slice_param(request: Request) -> EngineSlice | None:
    text = request.one("slice")
    try:
        return None if text is None else EngineSlice.parse(text)
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None
