"""A load proxy in front of a vLLM API server that runs no Python plugin (vLLM's Rust front end).

vLLM's Rust front end (``vllm-rs``, ``VLLM_USE_RUST_FRONTEND=1``) ignores ``--middleware``: nothing
Python runs in it, so :class:`~redis_stats.integrations.vllm.get_load.GetLoadMiddleware` cannot
answer ``/get_load`` there. A router reads load only from the address it routes to, so the answer
has to come from that address. This proxy takes that address (a port of the pod): it answers
``GET /get_load`` and ``GET /v1/loads`` itself, from Redis, exactly as the middleware does (the
same code: :meth:`GetLoadMiddleware.answer`), and hands every other request to the front end
behind it, byte for byte.

Its numbers come from the store: the bridge (``redis-stats bridge``, docs/bridge.md) stores the
front end's own ``/metrics`` with the load feed on, under the same ``REDIS_STATS_ENDPOINT`` (the
proxy's address, as routers reach it).

How a request is passed on: the proxy reads the request's head, writes it to a new connection to
the upstream with ``Connection: close``, then copies bytes both ways until the upstream closes
(a streamed completion streams through as it comes), and closes the client's connection. One
upstream connection per passed request: a client that keeps connections open (a router's pool)
never sends its next ``/get_load`` down a connection that already leads to the front end, which
has no such route. Answered requests keep the client's connection open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from urllib.parse import urlsplit

from redis_stats.config import StatsConfig
from redis_stats.integrations.vllm.get_load import (
    PATH,
    SMG_PATH,
    TTL,
    GetLoadMiddleware,
    SGLangGetLoadMiddleware,
)

__all__ = ["MAX_HEAD", "LoadProxy", "Sidecar"]

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
"""The largest request head (request line and headers) read, in bytes: more is refused (431)."""

_HEAD_TIMEOUT = 30.0  # seconds a client may take to send a request head (a slow or idle one)
_CHUNK = 64 * 1024


async def _not_passed(scope: object, receive: object, send: object) -> None:  # pragma: no cover
    raise AssertionError("the load proxy passes requests on itself, never through the middleware")


class LoadProxy:
    """Serves ``/get_load`` and ``/v1/loads`` of *config*'s endpoint on *host*:*port* and passes
    everything else to *upstream* (``host:port``). *rank_list*: ``/get_load`` as sglang-router
    reads it (:class:`SGLangGetLoadMiddleware`). :meth:`start` binds (port 0: a free one)."""

    def __init__(
        self,
        config: StatsConfig,
        upstream: str,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        rank_list: bool = False,
        ttl: float = TTL,
    ) -> None:
        up = urlsplit("//" + upstream)
        if not up.hostname or up.port is None:
            raise ValueError(f"upstream={upstream!r} is not host:port (the API server behind the proxy)")
        if config.endpoint is None:
            raise ValueError(
                "the proxy answers for one endpoint, REDIS_STATS_ENDPOINT: the address routers reach "
                "it at (this proxy's), as the bridge of the front end's /metrics stores it"
            )
        self.upstream = (up.hostname, up.port)
        self.host, self.port = host, port
        kind = SGLangGetLoadMiddleware if rank_list else GetLoadMiddleware
        self.loads = kind(_not_passed, config, ttl=ttl)
        self.server: asyncio.AbstractServer | None = None
        self.polls = 0  # /get_load and /v1/loads answered
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> LoadProxy:
        """Bind and accept connections (in the running event loop)."""
        self.server = await asyncio.start_server(self._client, self.host, self.port, limit=MAX_HEAD)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop accepting, and close the connections open (a client's idle keep-alive ones too)."""
        if self.server is not None:
            self.server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self.server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_TIMEOUT)
                except asyncio.LimitOverrunError:
                    await _reply(writer, 431, b'{"error": "request head too large"}')
                    return
                except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                    return
                method, target = _request_line(head)
                route = target.split("?", 1)[0]
                if method in ("GET", "HEAD") and route in (PATH, SMG_PATH):
                    await _discard_body(reader, head)
                    status, body = await self.loads.answer(route, target.partition("?")[2])
                    self.polls += 1
                    await _reply(writer, status, b"" if method == "HEAD" else body, len(body))
                    continue
                await self._pass(head, reader, writer)
                return
        except Exception:  # a connection's failure is that connection's only
            log.debug("load proxy: connection failed", exc_info=True)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _pass(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Hand the request whose *head* was read to the upstream, and its answer back."""
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError as exc:
            await _reply(
                writer, 502, b'{"error": "upstream unreachable", "detail": "%s"}' % str(exc).encode()
            )
            return
        up_writer.write(_close_after(head))
        request = asyncio.ensure_future(_copy(reader, up_writer))
        try:
            # The answer's head says "Connection: close" too: a client that pools connections
            # (hyper, in the routers) must not send its next request down this one, which the
            # proxy closes once the upstream has answered. Interim (1xx) heads pass as they are.
            while True:
                answer = await up_reader.readuntil(b"\r\n\r\n")
                if not answer.startswith(b"HTTP/1.1 1") or answer.startswith(b"HTTP/1.1 101"):
                    break
                writer.write(answer)
            writer.write(_close_after(answer))
            await _copy(up_reader, writer)  # the rest, until the upstream closes
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the upstream closed mid-answer: so does the client's connection
        finally:
            request.cancel()
            up_writer.close()


def _request_line(head: bytes) -> tuple[str, str]:
    """(method, target) of a request head ("" for what is not a request line)."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) != 3:
        return "", ""
    return parts[0].decode("latin-1"), parts[1].decode("latin-1")


def _close_after(head: bytes) -> bytes:
    """*head* (a request's or an answer's) with ``Connection: close`` in place of any Connection
    header (and of Keep-Alive)."""
    lines = head[:-4].split(b"\r\n")
    kept = [
        ln for ln in lines[1:] if ln.split(b":", 1)[0].strip().lower() not in (b"connection", b"keep-alive")
    ]
    return b"\r\n".join([lines[0], *kept, b"Connection: close"]) + b"\r\n\r\n"


async def _discard_body(reader: asyncio.StreamReader, head: bytes) -> None:
    """Read and drop the body a request to an answered route carries (Content-Length only)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            await reader.readexactly(int(value.strip()))


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy *source* into *sink* until *source* ends (then half-close *sink* where it can)."""
    while data := await source.read(_CHUNK):
        sink.write(data)
        await sink.drain()
    if sink.can_write_eof():
        with contextlib.suppress(OSError):
            sink.write_eof()


async def _reply(writer: asyncio.StreamWriter, status: int, body: bytes, length: int | None = None) -> None:
    reason = {
        200: "OK",
        400: "Bad Request",
        431: "Request Header Fields Too Large",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }.get(status, "")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\nCache-Control: no-store\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()


class Sidecar:
    """``redis-stats load-proxy``: a :class:`LoadProxy` on *listen* (``host:port``) in a thread of
    its own, and (*bridge*) the bridge of *upstream*'s ``/metrics`` into the store under *config*
    (engine label ``engine``, the vLLM catalogue and load map), every flush interval."""

    def __init__(
        self, config: StatsConfig, upstream: str, listen: str, *, rank_list: bool, bridge: bool
    ) -> None:
        from redis_stats.integrations.bridge import Bridge, BridgedSource
        from redis_stats.integrations.vllm import vllm_catalog
        from redis_stats.integrations.vllm.load import VLLM_LOAD

        where = urlsplit("//" + listen)
        if not where.hostname or where.port is None:
            raise ValueError(f"--listen {listen!r} is not HOST:PORT")
        self.upstream = upstream
        self.proxy = LoadProxy(config, upstream, host=where.hostname, port=where.port, rank_list=rank_list)
        source = BridgedSource(
            f"http://{upstream}/metrics", config, engine_label="engine", known=vllm_catalog(), load=VLLM_LOAD
        )
        self.bridge = Bridge([source]) if bridge else None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="redis_stats-load-proxy", daemon=True
        )

    def start(self) -> str:
        """Listen and bridge; a line saying where."""
        self._loop.run_until_complete(self.proxy.start())
        self._thread.start()
        if self.bridge is not None:
            self.bridge.start()
        endpoint = self.proxy.loads.config.endpoint if self.proxy.loads.config else None
        return (
            f"load proxy on {self.proxy.host}:{self.proxy.port} for endpoint {endpoint!r} -> {self.upstream}"
            + (f"; bridging http://{self.upstream}/metrics" if self.bridge is not None else "")
        )

    def close(self) -> None:
        """Stop bridging (its writer closed) and serving."""
        if self.bridge is not None:
            self.bridge.close()
        asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
