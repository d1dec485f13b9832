"""``GET /endpoints``: every endpoint of the namespace, its engines and their states.

Every endpoint, its engines, each engine's ``state`` (``up``, ``stale``, ``down``: the one rule of
every view), ``age_seconds`` and ``seq``, and whether the endpoint is up (one engine up is
enough); the engines with no endpoint stored (``unassigned``). From a read of the load feed (no
series), or ``503`` with the reason when Redis cannot be read.

The endpoint's own series, ``/metrics?endpoint=<id>`` and ``?engine=<n>``, are the ``/metrics``
view's (:mod:`redis_stats.server.views.metrics`); which engines each endpoint has, the map, is
:mod:`redis_stats.server.states.endpoints`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis_stats.config import redact
from redis_stats.errors import error_kind
from redis_stats.server.http import Request, Response, json_response
from redis_stats.server.states.endpoints import EndpointMap

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer"]


def answer(app: App, request: Request) -> Response:
    """``/endpoints`` of the request's namespace, or ``503`` with the reason when Redis cannot
    be read."""
    source = app.source(request)
    mapping = source.state(EndpointMap.of)
    try:
        return json_response(200, mapping.document())
    except Exception as exc:
        detail = redact(str(exc), source.reader.config.url)
        return json_response(503, {"error": error_kind(exc), "detail": detail})
