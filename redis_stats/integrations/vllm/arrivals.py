"""Requests counted where they land: an ASGI middleware for ``vllm serve --middleware``.

    vllm serve M --middleware redis_stats.integrations.vllm.arrivals.ArrivalsMiddleware

Every inference request (a ``POST`` under :data:`COUNTED`) that reaches this API server is counted
from the moment it arrives until its response ended, failed or was aborted (the client gone
mid-stream: the app's call ends, however it ends), in the ``in_flight`` of the engine it names by
vllm-router's ``X-data-parallel-rank`` header (else this process's first engine: with one engine
per pod, every request is its). The count rides the plugin writer's load lane (docs/load.md: at
once after a quiet spell, then at most every ``load_interval``), so every router replica reading
the feed (``/load``, ``/watch``, ``/v1/loads``, ``/get_load``) sees every replica's dispatches in
tens of milliseconds. The ``X-Request-Id`` of a request ends the routers' booking of it
(:mod:`redis_stats.bookings`) with the entry that counts it. Everything else passes through
untouched; a request that arrives before the plugin built its writer is not counted (``in_flight``
is ``null`` until the first counted one: nothing counts yet).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from redis_stats.writer import Arrivals, StatsWriter

__all__ = ["COUNTED", "RANK_HEADER", "REQUEST_ID_HEADER", "ArrivalsMiddleware", "register_writer"]

COUNTED = ("/v1/", "/v2/", "/pooling", "/classify", "/score", "/rerank", "/invocations", "/inference/")
"""The paths (prefixes) of the requests counted, when ``POST``: vLLM's inference routes."""

RANK_HEADER = b"x-data-parallel-rank"
"""vllm-router's header naming the engine (data-parallel rank) a request is for."""

REQUEST_ID_HEADER = b"x-request-id"
"""The request's id, as a router booked it (vLLM makes it its own request id)."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_writer: StatsWriter | None = None
_arrivals: Arrivals | None = None


def register_writer(writer: StatsWriter | None) -> None:
    """The writer a middleware built without one counts in (the vLLM plugin's of this process);
    its engines report ``in_flight`` from the first request counted."""
    global _writer, _arrivals
    _writer, _arrivals = writer, None


def _registered() -> Arrivals | None:
    global _arrivals
    if _arrivals is None and _writer is not None and _writer.load is not None:
        _arrivals = Arrivals(_writer)
    return _arrivals


class ArrivalsMiddleware:
    """A pure-ASGI middleware counting the requests of :data:`COUNTED` while they are served
    (module docstring). *arrivals*: where (default: the vLLM plugin's writer of this process)."""

    def __init__(self, app: ASGIApp, arrivals: Arrivals | None = None) -> None:
        self.app = app
        self.arrivals = arrivals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: the request counted while the app serves it, every exit included."""
        arrivals = self.arrivals if self.arrivals is not None else _registered()
        if arrivals is None or not self._counted(scope):
            await self.app(scope, receive, send)
            return
        rank = request_id = None
        for name, value in scope.get("headers", ()):
            if name == RANK_HEADER:
                rank = value.decode("latin-1")
            elif name == REQUEST_ID_HEADER:
                request_id = value.decode("latin-1")[:256]
        arrival = arrivals.begin(rank=rank, request_id=request_id)
        try:
            await self.app(scope, receive, send)
        finally:  # answered, raised, cancelled (the client went away mid-stream): ended
            arrival.end()

    @staticmethod
    def _counted(scope: Scope) -> bool:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return False
        path = str(scope.get("path", ""))
        root = str(scope.get("root_path", ""))
        if root and path.startswith(root):
            path = path[len(root) :]
        return path.startswith(COUNTED)
