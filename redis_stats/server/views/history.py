"""``GET /history``: the recent history of one namespace, for the live page's first open and reloads.

What this namespace's ``/snapshot`` window kept (:class:`~redis_stats.server.states.fleet_history.
FleetHistory`, :class:`~redis_stats.server.states.outages.OutageTrace`): a point per snapshot the
window took, the fleet figures the exporter was given (``ServeOptions.history``; the vLLM ones are
the page's charts), the engines that went down; with ``?engine=N`` (up to :data:`MAX_ENGINES`,
repeated) those engines' own figures at each point. Answered from memory: it reads nothing of the
fleet from Redis and starts no sampler, so it answers while Redis is down, and it is empty when
nobody asked this exporter for ``/snapshot`` lately (docs/cli.md, "The live page").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis_stats.server.http import HTTPError, Request, Response, json_response
from redis_stats.server.states.sampler import Window, redis_address, window_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["MAX_ENGINES", "answer", "history_document"]

MAX_ENGINES = 64
"""Engines one ``/history`` request may ask for (``?engine=``): the page draws 8 at a time."""


def history_document(window: Window, engines: list[int] | None = None) -> dict[str, Any]:
    """The ``/history`` document of *window*'s namespace (docs/cli.md, "The live page"), with the
    figures of *engines* kept for each."""
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
        "engines": {
            "held": history.engines_held(),
            "bytes": history.bytes,
            "max_bytes": history.max_bytes,
            "series": history.engine_series(engines or ()),
        },
        "outages": window.outages.document(),
        "outages_dropped": window.outages.dropped,
    }


def _engines(request: Request) -> list[int]:
    given = request.params.get("engine", [])
    if len(given) > MAX_ENGINES:
        raise HTTPError(400, f"{len(given)} engines asked: at most {MAX_ENGINES} in one request")
    out = []
    for text in given:
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            raise HTTPError(
                400, f"engine={text[:40]!r} is not an engine index (a decimal integer, e.g. engine=3)"
            )
        out.append(int(text))
    return out


def answer(app: App, request: Request) -> Response:
    """``/history`` of the request's namespace (``?engine=N``: and that engine's figures)."""
    engines = _engines(request)
    source = app.source(request)
    # Asking for the window counts as a use, as a /snapshot does, so the history a page is about to
    # extend is not dropped.
    window = window_of(source)
    return json_response(200, history_document(window, engines))  # gzipped by the server when accepted
