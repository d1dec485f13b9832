"""``GET /get_load`` on vLLM's own API port: the endpoint's true load, for a router that polls it.

vllm-router (``--policy power_of_two``) polls ``GET <worker URL>/get_load`` and reads
``{"load": N}`` (an integer: its source reads it with serde_json's ``as_i64``), from the very
address it sends requests to; vLLM serves no such route (vllm-project/router #174). This module
is an ASGI middleware for ``vllm serve --middleware`` (vLLM adds a class with
``app.add_middleware(cls)``)::

    vllm serve M --middleware redis_stats.integrations.vllm.get_load.GetLoadMiddleware

It answers ``GET /get_load`` with the load of this API server's **endpoint** (the plugin's
``REDIS_STATS_ENDPOINT``: every data-parallel engine of the pod, over all of its API-server
processes), from Redis: the requests running plus waiting summed over the endpoint's **live**
engines (``up`` or ``stale``, the one rule of every view; a ``down`` engine is left out), as the
load feed holds them (``redis_stats.load``: the same per-engine numbers whose sum the endpoint
view serves as its ``running`` and ``waiting`` series). Every other request passes through
untouched.

It answers ``GET /v1/loads`` too, from the same read: SGLang's model gateway's load document, one
entry per data-parallel rank of the endpoint (:mod:`redis_stats.routers.smg`, which says
what the gateway does with each answer); the gateway asks every worker for it first, vLLM's
included.

Cost and freshness: one answer is kept :data:`TTL` seconds, so however many routers poll, one
process reads Redis at most once per :data:`TTL`: a load-feed read of the endpoint's engines
(which engines those are: a read of the namespace's load feed at most every
``redis_stats.server.states.endpoints.MAP_TTL`` seconds). The read runs in a thread of its own,
never on vLLM's event loop; concurrent requests wait for the one read in flight.

What it never answers is a wrong number: Redis unreachable, the endpoint unknown to Redis, no
engine of it live, or an engine that reports no request counts: ``503`` with a JSON ``error``
and ``detail`` (``/v1/loads``: a rank without counts is left out, below). (vllm-router treats a
failed poll as it treats any: its own rule, not ours.)
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from redis_stats.config import StatsConfig, redact
from redis_stats.errors import error_kind
from redis_stats.load import EngineLoad, LoadView
from redis_stats.reader import StatsReader
from redis_stats.routers import smg
from redis_stats.routers.get_load import PATH, endpoint_answer, engines_of, rank_list_answer
from redis_stats.routers.vouch import unknown_document
from redis_stats.server.states.endpoints import EndpointMap, UnknownEndpoint

__all__ = [
    "PATH",
    "SMG_PATH",
    "TTL",
    "EndpointLoad",
    "EndpointRead",
    "GetLoadMiddleware",
    "SGLangGetLoadMiddleware",
    "register_config",
]

SMG_PATH = smg.PATH
"""The route SGLang's model gateway asks each worker first (``/v1/loads``)."""

TTL = 1.0
"""Seconds one answer is served again before Redis is read anew (a router polls every 5 s)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_registered: StatsConfig | None = None


def register_config(config: StatsConfig | None) -> None:
    """Make *config* the one a :class:`GetLoadMiddleware` built without one answers for (None:
    none, ``503 not_configured``): the vLLM plugin calls this with its own config, so
    ``/get_load`` reads the namespace and endpoint its writers record."""
    global _registered
    _registered = config


class EndpointRead(NamedTuple):
    """One read of an endpoint's load: its id and engines' loads at Redis time *time*, or
    (*error* set) the ``503`` document of why there is none."""

    endpoint: str | None
    engines: tuple[EngineLoad, ...]
    time: float
    error: dict[str, Any] | None = None

    def get_load(self) -> tuple[int, dict[str, Any]]:
        """(status, document) of ``/get_load``."""
        if self.error is not None or self.endpoint is None:
            return 503, dict(self.error or {})
        return endpoint_answer(self.endpoint, list(self.engines))

    def get_load_list(self) -> tuple[int, Any]:
        """(status, document) of ``/get_load`` as the rank list sglang-router reads."""
        if self.error is not None or self.endpoint is None:
            return 503, dict(self.error or {})
        return rank_list_answer(self.endpoint, list(self.engines))

    def v1_loads(self, query: str = "") -> tuple[int, dict[str, Any]]:
        """(status, document) of ``/v1/loads?<query>`` (SGLang's model gateway's, by rank)."""
        if self.error is not None or self.endpoint is None:
            return 503, dict(self.error or {})
        params = parse_qs(query, keep_blank_values=True)
        include, dp_rank = params.get("include", [None])[-1], params.get("dp_rank", [None])[-1]
        view = LoadView(self.time, {e.engine: e for e in self.engines})
        return smg.loads_document(view, self.endpoint, include=include, dp_rank=dp_rank)


def _failed(doc: dict[str, Any]) -> EndpointRead:
    """A read that has no load to give: the document says so as every view does
    (:func:`redis_stats.routers.vouch.unknown_document`: ``feed: unknown``, the error, why)."""
    return EndpointRead(None, (), 0.0, unknown_document(doc["error"], doc["detail"]))


def _not_configured() -> tuple[int, dict[str, Any]]:
    return 503, {
        "error": "not_configured",
        "detail": "the redis_stats vLLM plugin records nothing in this process yet (is REDIS_STATS_URL "
        "set? vLLM builds the plugin with its engines), so there is no load to answer (docs/routers.md)",
    }


class EndpointLoad:
    """The load of one endpoint, read from Redis: :meth:`answer` gives (HTTP status, document).

    *config* names the Redis, the namespace and the endpoint (``config.endpoint``). Blocking:
    call it off an event loop (:class:`GetLoadMiddleware` does)."""

    def __init__(self, config: StatsConfig, reader: StatsReader | None = None) -> None:
        self.config = config
        self.reader = reader if reader is not None else StatsReader(config)
        # The map (which engines the endpoint has: the whole namespace's load feed) on a reader of
        # its own: a reader plans each read from its last one, and the two reads' plans differ.
        mapper = StatsReader(config, client=self.reader.client)
        self.views = EndpointMap(mapper, self_endpoint=config.endpoint)

    def answer(self) -> tuple[int, dict[str, Any]]:
        """``200`` with ``{"load": N, ...}``, or ``503`` with ``error`` and ``detail`` (never raises)."""
        return self.read().get_load()

    def read(self) -> EndpointRead:
        """The endpoint's engines' loads, or why there are none (never raises)."""
        try:
            return self._read()
        except UnknownEndpoint as exc:
            return _failed({"error": "unknown_endpoint", "detail": str(exc)})
        except Exception as exc:
            return _failed({"error": error_kind(exc), "detail": redact(str(exc), self.config.url)})

    def _read(self) -> EndpointRead:
        if self.views.self_endpoint is None:
            return _failed(
                {
                    "error": "no_endpoint",
                    "detail": "this process's config names no endpoint (REDIS_STATS_ENDPOINT): "
                    "/get_load and /v1/loads answer for the endpoint its own writers store",
                }
            )
        endpoint, engines = self.views.resolve("self")
        view = self.reader.load(engines)
        mine = tuple(engines_of(view, endpoint))
        if len(mine) < len(view.engines):
            self.views.forget()  # an engine is served behind another endpoint now: map it again
        return EndpointRead(endpoint, mine, view.time)


def _body(status: int, doc: Any) -> tuple[int, bytes]:
    return status, json.dumps(doc, separators=(",", ":")).encode()


class GetLoadMiddleware:
    """A pure-ASGI middleware: ``GET`` (or ``HEAD``) :data:`PATH` answered with the endpoint's
    load and :data:`SMG_PATH` with its load per rank (module docstring), both from one kept read;
    every other request handed to *app* untouched.

    *config*: whose endpoint (default: the vLLM plugin's of this process,
    :func:`register_config`); *ttl*: seconds an answer is kept (:data:`TTL`)."""

    rank_list = False
    """Answer ``/get_load`` as sglang-router reads it (:class:`SGLangGetLoadMiddleware`)."""

    def __init__(self, app: ASGIApp, config: StatsConfig | None = None, *, ttl: float = TTL) -> None:
        if not (isinstance(ttl, (int, float)) and math.isfinite(ttl) and ttl >= 0):
            raise ValueError(
                f"ttl={ttl!r} is not a number of seconds >= 0: how long one /get_load answer is kept"
            )
        self.app = app
        self.config = config
        self.ttl = float(ttl)
        self._source: EndpointLoad | None = None
        self._kept: tuple[float, EndpointRead] | None = None
        self._pending: asyncio.Future[EndpointRead] | None = None
        self._lock = threading.Lock()
        # One thread: at most one read of Redis in flight per middleware, off vLLM's event loop.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="redis_stats-get_load")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: answer :data:`PATH` and :data:`SMG_PATH`, pass everything else through."""
        route = self._route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        status, body = await self.answer(route, scope.get("query_string", b"").decode("latin-1"))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    async def answer(self, route: str, query: str = "") -> tuple[int, bytes]:
        """(status, JSON body) of *route* (:data:`PATH` or :data:`SMG_PATH`) with *query*; never
        raises (what it cannot answer is a ``503``)."""
        try:
            read = await self.current_read()
            if route == PATH:
                return _body(*(read.get_load_list() if self.rank_list else read.get_load()))
            return _body(*read.v1_loads(query))
        except Exception as exc:  # never an exception into vLLM's server
            return _body(503, unknown_document("other", f"{type(exc).__name__}: {exc}"))

    @staticmethod
    def _route(scope: Scope) -> str | None:
        """The route of *scope* this middleware answers (None: pass it on)."""
        if scope.get("type") != "http" or scope.get("method") not in ("GET", "HEAD"):
            return None
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        for route in (PATH, SMG_PATH):
            if path == route or path == root + route:
                return route
        return None

    async def current(self) -> tuple[int, bytes]:
        """(status, JSON body) of the current ``/get_load`` answer (:meth:`current_read`'s)."""
        return _body(*(await self.current_read()).get_load())

    async def current_read(self) -> EndpointRead:
        """The current read: the kept one while younger than the ttl, else the one in flight
        (started now if none is)."""
        kept = self._kept
        if kept is not None and time.monotonic() - kept[0] < self.ttl:
            return kept[1]
        if self._pending is None or self._pending.done():
            loop = asyncio.get_running_loop()
            self._pending = asyncio.wrap_future(self._pool.submit(self._refresh), loop=loop)
        return await asyncio.shield(self._pending)

    def _refresh(self) -> EndpointRead:
        """Read Redis (in the middleware's thread) and keep the read."""
        source = self._endpoint_load()
        read = source.read() if source is not None else _failed(_not_configured()[1])
        self._kept = (time.monotonic(), read)
        return read

    def _endpoint_load(self) -> EndpointLoad | None:
        config = self.config if self.config is not None else _registered
        if config is None:
            return None
        with self._lock:
            if self._source is None or self._source.config is not config:
                self._source = EndpointLoad(config)
            return self._source


class SGLangGetLoadMiddleware(GetLoadMiddleware):
    """:class:`GetLoadMiddleware` whose ``/get_load`` is the rank list sglang-router (0.3.x, before
    it read ``/v1/loads``) sums: :func:`redis_stats.routers.get_load.rank_list_answer`. One body
    cannot serve both routers (vllm-router reads an object, sglang-router a list): pick the class
    of the router in front::

        vllm serve M --middleware redis_stats.integrations.vllm.get_load.SGLangGetLoadMiddleware
    """

    rank_list = True
