"""``GET /namespaces``: the namespaces this exporter serves (one, or several: then ``?namespace=``
picks one on every other path); for an exporter of every namespace, also its limit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis_stats.server.http import Request, Response, json_response

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer"]


def answer(app: App, request: Request) -> Response:
    """The document of :meth:`~redis_stats.server.namespaces.Sources.document`."""
    return json_response(200, app.sources.document())
