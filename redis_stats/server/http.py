"""The HTTP machinery of the server of views: a request in, an answer out, nothing of metrics.

A view (:mod:`redis_stats.server.views`) is a function from the served state and a
:class:`Request` to a :class:`Response`, or it raises :class:`HTTPError`. This module reads the
request off the socket, hands it to the application (a callable: the route table of
:mod:`redis_stats.server.app`), and writes the answer: gzipped when the client accepts it and the
view did not compress it already, headers only for ``HEAD``, a JSON error for an
:class:`HTTPError`, and a ``500`` with no detail (the traceback goes to the log) for anything else.

It is hardened as prometheus_client's own server is not:

- **one deadline for the whole request** (line and headers, :class:`_RequestReader`): a client
  sending a byte per socket timeout (slowloris) is closed when the deadline passes;
- **a bound on connections served at once** (:class:`Server`): past it a connection is answered
  ``503`` with ``Retry-After`` by one responder thread (:class:`_BusyResponder`) and closed, so
  the clients being served keep their threads and a scraper sees a clear answer, not a timeout;
- **long-lived answers apart** (a stream, a long poll: :meth:`Request.long_lived`): such a
  connection leaves the request slots for a stream slot, bounded on its own (*max_streams*), so
  subscribers at their limit never keep a scrape or a health check from answering;
- **TLS inside both** when a :class:`Guard` secures connections (:mod:`redis_stats.server.access`):
  the handshake runs on the connection's own thread, after its slot is taken and before its
  request, under the same deadline (a client that opens TCP and never says hello holds its
  thread no longer than one that never sends a request line), never in the accept loop.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import queue
import select
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs

from prometheus_client.exposition import gzip_accepted

__all__ = [
    "GZIP_LEVEL",
    "Guard",
    "HTTPError",
    "Request",
    "Response",
    "Server",
    "encode_body",
    "json_response",
    "refuse_plain_http",
]

log = logging.getLogger("redis_stats.exporter")

# gzip level 6 (zlib's default) rather than prometheus_client's 9: on a multi-megabyte scrape it is
# several times faster for a body a few percent larger (bench/http_exporter.py measures both).
GZIP_LEVEL = 6

# Characters of a body encoded (and compressed) at a time.
ENCODE_CHUNK = 1 << 20


def encode_body(text: str, gzipped: bool) -> tuple[bytes, int]:
    """(*text* as UTF-8, gzipped when *gzipped*; its size before compression). Gzipped a slice
    at a time, so the whole text never exists as bytes too (tens of MB at a thousand engines)."""
    if not gzipped:
        body = text.encode()
        return body, len(body)
    z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: the gzip format
    parts, size = [], 0
    for start in range(0, len(text), ENCODE_CHUNK):
        chunk = text[start : start + ENCODE_CHUNK].encode()
        size += len(chunk)
        parts.append(z.compress(chunk))
    parts.append(z.flush())
    return b"".join(parts), size


class HTTPError(Exception):
    """A request a view cannot answer: *status* (400 a bad parameter, 404 nothing of that name,
    503 the store cannot be read) with *message*, sent as ``{"error": message}`` (and *extra*
    keys, e.g. ``paths``)."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra

    def response(self) -> Response:
        """The JSON answer of this error."""
        return json_response(self.status, {"error": str(self), **self.extra})


@dataclass(frozen=True)
class Request:
    """One request as a view sees it: method, path, query string and headers."""

    method: str
    path: str
    query: str = ""
    headers: Any = field(default_factory=dict)
    """The request's headers (an ``email.message.Message`` off the socket; a dict in tests)."""
    client_cert: bool = False
    """Whether the connection presented a client certificate that TLS verified (against the web
    configuration's client CA)."""
    hold: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    """The server's move of this connection to a stream slot (:meth:`long_lived`)."""

    def long_lived(self) -> None:
        """This request's answer will be long-lived (a stream, a long poll): its connection moves
        from the slots of requests (``max_connections``) to those of streams (``max_streams``)
        for the rest of its life, so subscribers never take the scrapes' room; a ``503`` when
        the streams are at their limit. Nothing without a server (a view called directly)."""
        if self.hold is not None:
            self.hold()

    @property
    def head(self) -> bool:
        """Whether only the headers are wanted (``HEAD``)."""
        return self.method == "HEAD"

    @cached_property
    def params(self) -> dict[str, list[str]]:
        """The query's parameters (blank values kept: ``?name[]=`` is a parameter)."""
        return parse_qs(self.query, keep_blank_values=True)

    def one(self, name: str) -> str | None:
        """The one value of parameter *name* (None when absent); a 400 when it is given twice."""
        found = self.params.get(name, [])
        if len(found) > 1:
            raise HTTPError(400, f"{name} given {len(found)} times ({found}); give one")
        return found[0] if found else None

    def header(self, name: str) -> str:
        """A header's value (``""`` when absent)."""
        return str(self.headers.get(name, "") or "")

    @property
    def gzip_ok(self) -> bool:
        """Whether the client accepts a gzipped body."""
        return gzip_accepted(self.header("Accept-Encoding"))


@dataclass(frozen=True)
class Response:
    """A view's answer. *gzipped*: *body* is gzipped already (the view compressed it as it built
    it); otherwise the server gzips it when the client accepts that. *headers*: more headers."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    vary: str = "Accept-Encoding"
    gzipped: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    stream: Iterator[bytes] | None = None
    """A body written a chunk at a time as the iterator gives them (Server-Sent Events): no
    ``Content-Length``, never gzipped; the answer ends when the iterator does, or the client
    leaves (then the iterator is closed). It holds its connection, and one of the server's
    stream slot (``max_streams``, :meth:`Request.long_lived`) meanwhile."""


def json_response(status: int, doc: Any, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    """*doc* as strict JSON (a NaN or an infinity is a bug of the view, raised)."""
    return Response(status, json.dumps(doc, allow_nan=False).encode(), headers=headers)


App = Callable[[Request], Response]


class Guard(Protocol):
    """What secures the connections of a :class:`Server` (:class:`redis_stats.server.access.Gate`)."""

    def secure(self, sock: socket.socket, deadline: float) -> socket.socket:
        """The connection to serve *sock* on (its TLS connection, handshake done by *deadline*, or
        *sock* itself); raises ``OSError`` (``ssl.SSLError``, ``TimeoutError``...) when it must be
        closed, having closed what it opened."""

    def headers(self) -> tuple[tuple[str, str], ...]:
        """Headers every answer carries (the web configuration's ``http_server_config.headers``)."""


class _RequestReader(io.RawIOBase):
    """A connection's input with one deadline for the whole request (line and headers).

    A socket timeout bounds each ``recv`` only: a client sending one byte per timeout would hold
    its connection, thread and file descriptor for ever (slowloris). Each read here waits at
    most until the deadline; past it, ``TimeoutError`` ends the connection (http.server catches
    it). ``deadline = None`` once the request is parsed: the body, if any, is the handler's.
    """

    def __init__(self, sock: Any, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self.deadline: float | None = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request not complete within the request timeout")
            self._sock.settimeout(left)
        return int(self._sock.recv_into(buffer))


# Answer to a connection over the cap: written by the one _BusyResponder thread, none per connection.
_BUSY_BODY = b'{"error": "too many connections, retry in a second"}'
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)
# A refused connection waits at most this long for its request (then the 503 goes anyway), and
# as long again for the client to hang up after reading it; at most _BUSY_BYTES are read in
# each phase. Short, because one thread answers every refused connection in turn.
_BUSY_WAIT = 0.2
_BUSY_BYTES = 1 << 20
# Refused connections waiting for the responder; past this many a new one is just closed.
_BUSY_QUEUE = 128


_PLAIN_BODY = b'{"error": "this port serves HTTPS (TLS): use https://"}'
_PLAIN = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_PLAIN_BODY), _PLAIN_BODY)
)


def refuse_plain_http(sock: socket.socket) -> None:
    """Answer a plain-HTTP request sent to a TLS port with a ``400`` saying so (what Go's servers,
    the toolkit's included, answer), instead of a handshake error the client shows as garbage.
    Read, answered and drained as a refused connection is (:class:`_BusyResponder`)."""
    with contextlib.suppress(OSError):
        _BusyResponder.answer_with(sock, _PLAIN)


class _BusyResponder:
    """One daemon thread that answers connections over the cap with the 503.

    Closing a socket whose request was never read makes the kernel send a reset instead of a
    normal close, and a client (on a real network, or still sending) then loses the 503 already
    sent. So each refused socket has its request read first (what arrives within ``_BUSY_WAIT``),
    gets the 503, is shut for writing, and is drained until the client hangs up (or the wait
    ends) before it is closed. The accept loop only puts the socket in a bounded queue: when it
    is full the socket is closed at once, so a flood never blocks accepting.
    """

    def __init__(self, guard: Guard | None = None) -> None:
        self._guard = guard
        self._queue: queue.Queue[socket.socket | None] = queue.Queue(_BUSY_QUEUE)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="redis_stats-exporter-busy", daemon=True)
            self._thread.start()

    def refuse(self, sock: socket.socket) -> bool:
        """Queue *sock* for the 503; False when the queue is full or the responder stopped (the
        caller closes it)."""
        if self._stopping.is_set():
            return False
        try:
            self._queue.put_nowait(sock)
        except queue.Full:
            return False
        return True

    def stop(self) -> None:
        """Close the sockets still queued (unanswered: the server is closing) and end the thread.

        The thread ends after the socket it is answering (at most ``2 * _BUSY_WAIT``): it checks
        the flag between sockets, and the sentinel wakes it if it waits on the queue. (Joining
        first and then emptying the queue lost the sentinel with the sockets whenever a dozen slow
        clients outlasted the join: the thread then waited on an empty queue for ever.)
        """
        self._stopping.set()
        thread, self._thread = self._thread, None
        self._close_queued()
        if thread is not None:
            with contextlib.suppress(queue.Full):  # just emptied, and nothing is queued any more
                self._queue.put_nowait(None)
            thread.join(2 * _BUSY_WAIT + 1)
        self._close_queued()

    def _close_queued(self) -> None:
        while True:
            try:
                sock = self._queue.get_nowait()
            except queue.Empty:
                return
            if sock is not None:
                sock.close()

    def _run(self) -> None:
        while not self._stopping.is_set() and (sock := self._queue.get()) is not None:
            conn = sock
            try:
                if self._guard is not None:  # a TLS client reads the 503 only through TLS
                    conn = self._guard.secure(sock, time.monotonic() + _BUSY_WAIT)
                self.answer_with(conn, _BUSY)
            except OSError:
                pass
            finally:
                conn.close()
                sock.close()

    @staticmethod
    def _read(sock: socket.socket, until_end_of_headers: bool) -> None:
        """Read (and drop) what the client sends, until EOF, the end of the request's headers
        when *until_end_of_headers*, ``_BUSY_WAIT`` or ``_BUSY_BYTES``."""
        deadline, seen, tail = time.monotonic() + _BUSY_WAIT, 0, b""
        while seen < _BUSY_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return
            if not data:
                return
            seen += len(data)
            if until_end_of_headers:
                tail = (tail + data)[-(len(data) + 3) :]
                if b"\r\n\r\n" in tail:
                    return

    @classmethod
    def answer_with(cls, sock: socket.socket, answer: bytes) -> None:
        """Read the request, write *answer*, and drain the connection until the client hangs up."""
        cls._read(sock, until_end_of_headers=True)
        sock.settimeout(_BUSY_WAIT)
        sock.sendall(answer)
        sock.shutdown(socket.SHUT_WR)
        # Whatever still arrives (a request body) is read, so the close is not a reset.
        cls._read(sock, until_end_of_headers=False)


class Server(ThreadingHTTPServer):
    """An HTTP server of *app* with at most *max_connections* connections served at once.

    ThreadingHTTPServer starts one thread per connection with no bound (prometheus_client's own
    server too): a burst of clients, or many slow ones each held up to the request timeout, would
    grow threads and memory without limit. Past the cap a connection gets a 503 with
    ``Retry-After`` from one responder thread (:class:`_BusyResponder`) and is closed.
    *request_timeout* bounds the whole request (TLS handshake, line and headers) and each write of
    the answer; *guard* secures each connection (TLS) and adds headers to every answer.
    """

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        app: App,
        *,
        max_connections: int,
        request_timeout: float,
        guard: Guard | None = None,
        max_streams: int = 256,
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._streams = threading.BoundedSemaphore(max_streams)
        self.max_streams = max_streams
        self._held = threading.local()  # .stream: this connection's thread holds a stream slot
        self.streams_refused = 0  # long-lived answers refused for max_streams (a self-metric)
        self.streams_open = 0  # connections holding a stream slot now (a self-metric; GIL-atomic +=)
        # socketserver listens with a backlog of 5: a burst of more clients at once had its
        # connection attempts dropped by the kernel and retried by TCP a second or more later,
        # under the cap. Room for every connection served and every one refused.
        self.request_queue_size = max_connections + max_streams + _BUSY_QUEUE
        self._busy = _BusyResponder(guard)
        self.refused = 0  # connections refused for the cap, answered 503 or not (a self-metric)
        super().__init__(address, _handler(app, request_timeout, guard, self.hold_stream))

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until shutdown (the responder of refused connections with it)."""
        self._busy.start()
        super().serve_forever(poll_interval)

    def server_close(self) -> None:
        """Close the socket and the responder (the connections it still holds unanswered)."""
        super().server_close()
        self._busy.stop()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection, or the 503 when max_connections are served already."""
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            if not self._busy.refuse(request):
                self.shutdown_request(request)  # too many refused at once: no answer at all
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # the thread did not start: free its slot
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve the connection, then free its slot (a request's, or the stream's it moved to)."""
        self._held.stream = False
        try:
            super().process_request_thread(request, client_address)
        finally:
            if self._held.stream:
                self.streams_open -= 1
                self._streams.release()
            else:
                self._slots.release()

    def hold_stream(self) -> None:
        """Move this connection (the calling thread's) to a stream slot for the rest of its life
        (:meth:`Request.long_lived`); a ``503`` when *max_streams* are held already."""
        if getattr(self._held, "stream", True):
            return  # already a stream's (or not a connection thread of this server)
        if not self._streams.acquire(blocking=False):
            self.streams_refused += 1
            raise HTTPError(
                503,
                f"{self.max_streams} streams and long polls are open already (--max-streams): "
                "retry later, or raise the limit",
                retry_after=1,
            )
        self._held.stream = True
        self.streams_open += 1
        self._slots.release()  # the request's slot goes back to the requests

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A debug line (see below), not a traceback."""
        # A client that hung up mid-response is routine for a metrics endpoint: a debug line, not
        # socketserver's traceback on stderr.
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


_INTERNAL = json_response(500, {"error": "internal error, see the exporter's log"})


def answer(app: App, request: Request) -> Response:
    """*app*'s answer to *request*: its :class:`HTTPError` as JSON, anything else raised a ``500``
    without detail (never a closed connection, never a URL or a value in the body)."""
    try:
        return app(request)
    except HTTPError as exc:
        return exc.response()
    except Exception:
        log.exception("serving %s failed", request.path)
        return _INTERNAL


def _client_left(sock: socket.socket) -> bool:
    """Whether the client of *sock* closed its end (a read would give the end of the stream),
    found without writing; a TLS connection is not asked (its records cannot be peeked): its
    departure is found by the next write."""
    if isinstance(sock, ssl.SSLSocket):
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _handler(
    app: App, request_timeout: float, guard: Guard | None, hold: Callable[[], None] | None = None
) -> type[BaseHTTPRequestHandler]:
    extra: Callable[[], tuple[tuple[str, str], ...]] = guard.headers if guard is not None else tuple

    class Handler(BaseHTTPRequestHandler):
        # Socket timeout of each connection (read by StreamRequestHandler.setup): a client that
        # connects and stays silent gets its connection closed instead of holding a thread.
        timeout = request_timeout

        def setup(self) -> None:
            """The connection (secured by the guard), with one deadline for the whole request."""
            # The whole request must arrive within the timeout, not each byte of it: the TLS
            # handshake included (a client that never says hello is a slowloris too).
            deadline = time.monotonic() + request_timeout
            self._secured: socket.socket | None = None
            if guard is not None:
                # socketserver closes the socket it accepted; a TLS connection replaces it (its
                # file descriptor taken over), so finish() closes that one.
                self.request = self._secured = guard.secure(self.request, deadline)
            super().setup()
            self._reader = _RequestReader(self.connection, deadline)
            self.rfile = io.BufferedReader(self._reader)
            self._client_cert = isinstance(self.connection, ssl.SSLSocket) and bool(
                self.connection.getpeercert()
            )

        def finish(self) -> None:
            """Flush the answer; close the TLS connection (socketserver closes the plain one)."""
            try:
                super().finish()
            finally:
                if self._secured is not None:
                    with contextlib.suppress(OSError):
                        self._secured.shutdown(socket.SHUT_WR)
                    self._secured.close()

        def parse_request(self) -> bool:
            """The request line and headers (under the deadline); then a full timeout per write."""
            ok = super().parse_request()  # reads the headers: still under the deadline
            self._reader.deadline = None
            self.connection.settimeout(request_timeout)  # the answer gets a full timeout
            return ok

        def do_GET(self) -> None:
            """The view's answer."""
            self._serve()

        def do_POST(self) -> None:
            """A route that writes (``Route(writes=True)``): its parameters are in the query; a
            request with a body is refused and the connection closed (no body is ever read, so
            none can be taken for a next request)."""
            length = self.headers.get("Content-Length", "0").strip()
            if self.headers.get("Transfer-Encoding") or length not in ("", "0"):
                self.close_connection = True
                doc = {"error": "give the parameters in the query string: a POST here carries no body"}
                path, _, query = self.path.partition("?")
                self._write(Request("POST", path, query, self.headers), json_response(413, doc))
                return
            self._serve()

        def do_HEAD(self) -> None:
            """The view's answer, headers only."""
            # The same work and headers as GET (Content-Length included), without the body.
            self._serve()

        def _serve(self) -> None:
            path, _, query = self.path.partition("?")
            request = Request(self.command, path, query, self.headers, self._client_cert, hold)
            self._write(request, answer(app, request))

        def _write(self, request: Request, response: Response) -> None:
            if response.stream is not None:
                self._stream(request, response, response.stream)
                return
            body, encoding = response.body, "gzip" if response.gzipped else None
            if encoding is None and body and response.status != 304 and request.gzip_ok:
                body, encoding = gzip.compress(body, compresslevel=GZIP_LEVEL), "gzip"
            self.send_response(response.status)
            if response.status != 304:
                self.send_header("Content-Type", response.content_type)
            if encoding:
                self.send_header("Content-Encoding", encoding)
            for name, value in (*response.headers, *extra()):
                self.send_header(name, value)
            self.send_header("Vary", response.vary)
            if response.status != 304:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not request.head and response.status != 304:
                self.wfile.write(body)

        def _stream(self, request: Request, response: Response, chunks: Iterator[bytes]) -> None:
            """*chunks* written as they come, each flushed, until they end or the client leaves."""
            try:
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Cache-Control", "no-store")
                for name, value in (*response.headers, *extra()):
                    self.send_header(name, value)
                self.end_headers()
                if request.head:
                    return
                for chunk in chunks:
                    if not chunk:  # nothing to send: has the client left? (its slot comes back)
                        if _client_left(self.connection):
                            break
                        continue
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except OSError:  # the client left (or stopped reading past the request timeout)
                log.debug("a stream to %s ended with the connection", self.address_string())
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
            self.close_connection = True

        def log_message(self, fmt: str, *args: Any) -> None:
            """A debug line per request (http.server writes one to stderr)."""
            log.debug("%s " + fmt, self.address_string(), *args)

    return Handler
