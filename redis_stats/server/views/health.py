"""``GET /healthz``: whether this exporter can read its store.

Of one namespace: ``200`` with its engines and how many are up, from a read of the load feed
(the engines, the writers and their load entries, by the rule every view judges liveness with),
not of every series: a probe every few seconds must not decode the whole fleet (tens of MB at a
thousand engines, beside the scrapes). Of an exporter of several namespaces (no ``?namespace=``):
whether Redis answers (``TIME``, one round trip whatever the namespaces: a probe must not read
every namespace, nor make a source for each), and whether it can hold the store (the capability
check every reader makes, redis_stats/capability.py: a Valkey without its Lua module is not
healthy). ``503`` with the reason when the store cannot be read: ``"status": "store unsupported"``
and the check's message for a server that cannot hold it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis_stats.config import redact
from redis_stats.errors import StoreUnsupported, error_kind
from redis_stats.server.http import Request, Response, json_response

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer"]


def _unavailable(exc: Exception, url: str, safe_url: str) -> Response:
    unsupported = isinstance(exc, StoreUnsupported)
    doc: dict[str, Any] = {
        "status": "store unsupported" if unsupported else "redis unavailable",
        "error": error_kind(exc),
        "detail": redact(str(exc), url),
        "redis": safe_url,
    }
    return json_response(503, doc)


def answer(app: App, request: Request) -> Response:
    """``/healthz`` (module docstring)."""
    sources = app.sources
    if sources.several and request.one("namespace") is None:
        reader = sources.reader
        try:
            reader.check_store()
            reader.client.time()
        except Exception as exc:
            return _unavailable(exc, reader.config.url, reader.config.safe_url)
        return json_response(200, {"status": "ok", "namespaces": len(sources.known())})
    source = app.source(request)
    config = source.reader.config
    try:
        view = source.reader.load(source.part)
    except Exception as exc:
        return _unavailable(exc, config.url, config.safe_url)
    up = sum(e.up for e in view.engines.values())
    return json_response(200, {"status": "ok", "engines": len(view.engines), "engines_up": up})
