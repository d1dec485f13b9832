"""``GET /get_load?endpoint=<id>``: one endpoint's true load, as vllm-router polls it.

The document is :func:`redis_stats.routers.get_load.endpoint_answer`'s (``{"load": N}``: the
requests running plus waiting over the endpoint's live engines); the exporter makes it for any
endpoint of its namespace (without ``?endpoint=``, or with ``self``, its own endpoint) from its
``/load`` feed's newest read (no Redis read per request). The vLLM middleware serves the same
document on vLLM's own port (``redis_stats.integrations.vllm.get_load``).

What it never answers is a wrong number: Redis unreachable, the endpoint unknown, no engine of it
live, or an engine that reports no request counts: ``503`` with a JSON ``error`` and ``detail``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis_stats.routers.get_load import endpoint_answer, engines_of
from redis_stats.server.http import Request, Response, json_response
from redis_stats.server.states.endpoints import SELF, endpoint_param
from redis_stats.server.states.load_feed import LoadBody, feed_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer"]

_NO_STORE = (("Cache-Control", "no-store"),)


def answer(app: App, request: Request) -> Response:
    """``/get_load?endpoint=<id>`` of the request's namespace (module docstring)."""
    source = app.source(request)
    endpoint = endpoint_param(request.one("endpoint")) or SELF
    if endpoint == SELF:
        if source.options.self_endpoint is None:
            doc = {
                "error": "no_endpoint",
                "detail": "give ?endpoint=<id> (GET /endpoints lists them): this exporter has no "
                "endpoint of its own (REDIS_STATS_ENDPOINT)",
            }
            return json_response(503, doc, _NO_STORE)
        endpoint = source.options.self_endpoint
    current = source.state(feed_of).current()
    if isinstance(current, LoadBody):  # the store cannot be read, or the feed is stale: why
        return Response(current.status, current.body, headers=_NO_STORE)
    mine = engines_of(current[0], endpoint)
    if not mine:
        doc = {
            "error": "unknown_endpoint",
            "detail": current[0].why_no_engine_behind(endpoint),
            "endpoint": endpoint,
        }
        return json_response(503, doc, _NO_STORE)
    return json_response(*endpoint_answer(endpoint, mine), _NO_STORE)
