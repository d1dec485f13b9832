"""``GET /get_load``: one endpoint's true load, in the shape vllm-router and sglang-router poll.

vllm-router (``--policy power_of_two``) polls ``GET <worker URL>/get_load`` and reads
``{"load": N}`` (an integer: its source reads it with serde_json's ``as_i64``). The load is the
requests running plus waiting summed over the endpoint's **live** engines (``up`` or ``stale``,
the one rule of every view; a ``down`` engine is left out), as the load feed holds them
(``redis_stats.load``). The vLLM plugin serves it on vLLM's own port
(``redis_stats.integrations.vllm.get_load``); the exporter serves it too, for any endpoint of its
namespace (``/get_load?endpoint=<id>``; without it, or with ``self``, the exporter's own
endpoint), from its ``/load`` feed's newest read (no Redis read per request).

What it never answers is a wrong number: Redis unreachable, the endpoint unknown, no engine of it
live, or an engine that reports no request counts: ``503`` with a JSON ``error`` and ``detail``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from redis_stats.load import EngineLoad, LoadView
from redis_stats.server.http import Request, Response, json_response
from redis_stats.server.views.endpoints import SELF, endpoint_param
from redis_stats.server.views.load import LoadBody, feed_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["PATH", "answer", "endpoint_answer", "engines_of"]

PATH = "/get_load"
"""The route vllm-router and sglang-router poll on each worker."""

_NO_STORE = (("Cache-Control", "no-store"),)


def engines_of(view: LoadView, endpoint: str) -> list[EngineLoad]:
    """The engines of *view* served behind *endpoint*, in engine order."""
    return [view.engines[e] for e in sorted(view.engines) if view.engines[e].endpoint == endpoint]


def endpoint_answer(endpoint: str, mine: list[EngineLoad]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, document) of ``/get_load`` for *endpoint* whose engines' loads are *mine*."""
    live = [e for e in mine if e.up]
    down = [e.engine for e in mine if not e.up]
    if not live:
        return 503, {
            "error": "endpoint_down",
            "detail": f"no engine of endpoint {endpoint!r} is up (engines {down} are down): "
            "its load is not known",
            "endpoint": endpoint,
        }
    silent = [e.engine for e in live if not _counted(e)]
    running = sum(e.requests_running or 0.0 for e in live)
    waiting = sum(e.requests_waiting or 0.0 for e in live)
    if silent:
        return 503, {
            "error": "no_load",
            "detail": f"engines {silent} of endpoint {endpoint!r} report no finite requests running "
            "or waiting (a writer without the load feed, or no step recorded yet)",
            "endpoint": endpoint,
        }
    if not math.isfinite(running + waiting):  # every count finite, their sum past the float range
        return 503, {
            "error": "no_load",
            "detail": f"the requests of engines {[e.engine for e in live]} of endpoint {endpoint!r} "
            "add up past the float range: no load to serve",
            "endpoint": endpoint,
        }
    return 200, {
        # An integer: vllm-router reads it with as_i64, which reads 5.0 as nothing.
        "load": round(running + waiting),
        "running": round(running),
        "waiting": round(waiting),
        "endpoint": endpoint,
        "engines": [e.engine for e in live],
        "engines_down": down,
        "age_seconds": round(max(e.age_seconds for e in live), 3),
    }


def _counted(load: EngineLoad) -> bool:
    values = (load.requests_running, load.requests_waiting)
    return all(v is not None and math.isfinite(v) for v in values)


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
