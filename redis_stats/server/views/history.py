"""``GET /history``: the fleet's recent history of one namespace, for the live page's first open.

What this namespace's ``/snapshot`` window kept of the fleet (:class:`~redis_stats.server.states.
fleet_history.FleetHistory`): a point per snapshot the window took, the figures the exporter was
given (``ServeOptions.history``; the vLLM ones are the page's charts). Answered from memory: it
reads nothing of the fleet from Redis and starts no sampler, so it answers while Redis is down,
and it is empty when nobody asked this exporter for ``/snapshot`` lately (docs/cli.md, "The live
page").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis_stats.server.http import Request, Response, json_response
from redis_stats.server.states.sampler import Window, redis_address, window_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer", "history_document"]


def history_document(window: Window) -> dict[str, Any]:
    """The ``/history`` document of *window*'s namespace (docs/cli.md, "The live page")."""
    source, history = window.source, window.history
    return {
        "source": {"namespace": source.namespace, "redis": redis_address(source.reader.config.url)},
        "seconds": history.seconds,
        "spacing_seconds": history.spacing,
        "window_seconds": window.window,
        "sampling": window.sampling,
        "figures": {
            name: {"metric": metric, "engine": engine, "fleet": fleet}
            for name, (metric, engine, fleet) in history.spec.items()
        },
        "points": history.columns(),
    }


def answer(app: App, request: Request) -> Response:
    """``/history`` of the request's namespace."""
    source = app.source(request)
    # Asking for the window counts as a use, as a /snapshot does, so the history a page is about to
    # extend is not dropped.
    window = window_of(source)
    return json_response(200, history_document(window))  # gzipped by the server when accepted
