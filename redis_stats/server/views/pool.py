"""``GET /pool``: the namespace's pool averages for the tier above (llm-d-router's multi-cluster
extractor), from the ``/load`` feed's newest read (no Redis read per request).

The text, its families and why a family is withheld are :mod:`redis_stats.routers.pool`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis_stats.routers.pool import CONTENT_TYPE, pool_text
from redis_stats.server.http import Request, Response
from redis_stats.server.states.load_feed import LoadBody, feed_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer"]


def answer(app: App, request: Request) -> Response:
    """``/pool`` of the request's namespace (module docstring); the feed's ``503`` when it has no
    current read."""
    source = app.source(request)
    current = source.state(feed_of).current()
    if isinstance(current, LoadBody):
        return Response(current.status, current.body, headers=(("Cache-Control", "no-store"),))
    text = pool_text(current[0], source.namespace)
    return Response(200, text.encode(), content_type=CONTENT_TYPE)
