"""``GET /v1/loads`` and ``GET /loads``: SGLang's model gateway load documents of the namespace.

``/v1/loads`` is what the gateway asks of each worker (one entry per data-parallel rank,
``?endpoint=<id>``; without it the whole pool, as one worker); ``/loads`` is the gateway's own fleet
route (every endpoint's ranks and an ``aggregate``). The documents, and what the gateway does with
each answer, are :mod:`redis_stats.routers.smg`'s; here they are made from the ``/load`` feed's
newest read (no Redis read per request), or its ``503`` when it has none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis_stats.routers.smg import fleet_document, loads_document
from redis_stats.server.http import Request, Response, json_response
from redis_stats.server.states.endpoints import SELF, endpoint_param
from redis_stats.server.states.load_feed import LoadBody, feed_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer", "fleet_answer"]

_NO_STORE = (("Cache-Control", "no-store"),)


def answer(app: App, request: Request) -> Response:
    """``/v1/loads`` of the request's namespace: ``?endpoint=<id>`` that endpoint's ranks (``self``:
    the exporter's own endpoint, ``REDIS_STATS_ENDPOINT``), without it the whole pool's (the
    fleet document: a gateway registering this exporter as a worker reads the pool as one), from
    the ``/load`` feed's newest read (no Redis read per request)."""
    source = app.source(request)
    endpoint = endpoint_param(request.one("endpoint"))
    include, dp_rank = request.one("include"), request.one("dp_rank")
    current = source.state(feed_of).current()
    if isinstance(current, LoadBody):  # the store cannot be read, or the feed is stale: why
        return Response(current.status, current.body, headers=_NO_STORE)
    view = current[0]
    if endpoint is None:
        if dp_rank is not None:
            return json_response(
                400, {"detail": "dp_rank= needs endpoint=: ranks are an endpoint's"}, _NO_STORE
            )
        return json_response(*fleet_document(view, include=include), _NO_STORE)
    if endpoint == SELF:
        endpoint = source.options.self_endpoint
        if endpoint is None:
            doc = {
                "error": "no_endpoint",
                "detail": "this exporter has no endpoint of its own (REDIS_STATS_ENDPOINT)",
            }
            return json_response(503, doc, _NO_STORE)
    return json_response(*loads_document(view, endpoint, include=include, dp_rank=dp_rank), _NO_STORE)


def fleet_answer(app: App, request: Request) -> Response:
    """``/loads``: the fleet document (:func:`fleet_document`), as smg #2418's gateway serves it."""
    source = app.source(request)
    current = source.state(feed_of).current()
    if isinstance(current, LoadBody):
        return Response(current.status, current.body, headers=_NO_STORE)
    return json_response(*fleet_document(current[0], include=request.one("include")), _NO_STORE)
