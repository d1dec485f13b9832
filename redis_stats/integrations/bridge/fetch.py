"""One HTTP GET of a source's metrics endpoint: bounded in time and size, secrets kept out.

A source URL may carry a user and password (``http://user:pass@host:8000/metrics``, sent as HTTP
Basic auth) or a token in its query: only :func:`redis_stats.config.mask_url`'s form of it is
ever printed, and every message that comes from elsewhere (an exception's text) goes through
:func:`redis_stats.config.redact` first.
"""

from __future__ import annotations

import base64
import functools
import http.client
import io
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from redis_stats.config import mask_url, redact

__all__ = ["ACCEPT", "FORMATS", "Response", "ScrapeError", "SourceURL", "fetch"]

# What each --format asks for. "any" lists OpenMetrics first and the 0.0.4 text second, as
# Prometheus does: a server that knows only one answers with it (vLLM's Rust front end serves
# OpenMetrics whatever is asked), and the body is parsed by the Content-Type it comes with.
# "escaping=allow-utf-8": prometheus_client >= 0.22 asked for OpenMetrics 1.0.0 without it
# escapes the ':' of vllm:* and sglang:* names to '_' in the samples but not in the TYPE lines
# (a body whose samples belong to no family); servers that know no escaping ignore it.
_OPENMETRICS = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8"
ACCEPT = {
    "any": f"{_OPENMETRICS};q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
    "openmetrics": _OPENMETRICS,
    "text": "text/plain;version=0.0.4",
}
FORMATS = tuple(ACCEPT)


class ScrapeError(Exception):
    """The source did not deliver a body: *reason* is ``down``, ``timeout``, ``http``,
    ``too_large`` or ``truncated``; the message never holds a secret of the URL."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SourceURL:
    """A source's URL, cut for the request; ``repr`` and :attr:`safe` show it masked."""

    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query, as sent
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> SourceURL:
        """Check and cut *url*; ValueError (with the masked URL) when it cannot be scraped."""
        safe = mask_url(url)
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ValueError(f"source {safe} is not a URL (scheme://host[:port]/path)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"source {safe} must be an http:// or https:// URL with a host")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default = 443 if parts.scheme == "https" else 80
        return cls(url, parts.scheme, parts.hostname, port or default, target, _basic_auth(parts))

    @property
    def safe(self) -> str:
        """The URL as it may be printed (password and secret query values masked)."""
        return mask_url(self.url)

    def __repr__(self) -> str:
        return f"SourceURL({self.safe!r})"

    def redact(self, text: str) -> str:
        """*text* without any secret of this URL."""
        return redact(text, self.url)


def _basic_auth(parts: SplitResult) -> str | None:
    """The ``Authorization`` header of a URL's user and password; None when it has neither."""
    if parts.username is None and parts.password is None:
        return None
    pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


@dataclass(frozen=True)
class Response:
    """A body as received, with its Content-Type."""

    content_type: str | None
    data: bytes


def fetch(source: SourceURL, *, accept: str, timeout: float, max_bytes: int) -> Response:
    """GET *source*: :class:`ScrapeError` unless a whole 200 body of at most *max_bytes* came
    within *timeout* seconds in all: connect, TLS handshake, status line and headers, body. One
    deadline bounds the exchange; a socket timeout alone bounds each receive only, and a server
    that trickles its headers (or body) a byte at a time would hold the scrape for ever."""
    deadline = time.monotonic() + timeout
    headers = {"Accept": accept, "Accept-Encoding": "identity", "User-Agent": "redis-stats-bridge"}
    if source.authorization:
        headers["Authorization"] = source.authorization
    phase = "connecting"
    conn = _connection(source, deadline)
    try:
        conn.sock = socket.create_connection((source.host, source.port), timeout=_left(deadline))
        if source.scheme == "https":
            phase = "TLS handshake"
            conn.sock = _tls(conn.sock, source.host, deadline)
        phase = "sending the request"
        conn.request("GET", source.target, headers=headers)
        phase = "waiting for the status line and headers"
        resp = conn.getresponse()
        _check_status(resp)
        length = _declared_length(resp, max_bytes)
        phase = "reading the body"
        data = _read_body(resp, max_bytes)
        if length is not None and len(data) != length:
            raise ScrapeError("truncated", f"got {len(data):,} of {length:,} bytes")
        return Response(resp.getheader("Content-Type"), data)
    except ScrapeError:
        raise
    except http.client.IncompleteRead as exc:
        raise ScrapeError("truncated", f"the connection closed after {len(exc.partial):,} bytes") from None
    except TimeoutError:
        raise ScrapeError("timeout", f"no whole answer within {timeout:g} s ({phase})") from None
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ScrapeError("down", source.redact(f"{reason} ({_short(exc)})")) from None
    finally:
        conn.close()


def _left(deadline: float) -> float:
    """Seconds until *deadline*; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


def _tls(sock: socket.socket, host: str, deadline: float) -> ssl.SSLSocket:
    """*sock* with its TLS handshake done within the deadline: CPython bounds a handshake as a
    whole by the socket's timeout at its start (one deadline inside ``_ssl``), unlike a plain
    socket's receives, which each wait that long again. (On failure the TLS socket, which took
    over *sock*'s descriptor, is closed.)"""
    sock.settimeout(_left(deadline))
    return ssl.create_default_context().wrap_socket(sock, server_hostname=host)


class _DeadlineReader(io.RawIOBase):
    """A socket's input where each receive waits at most until one deadline (the exporter reads
    its requests the same way: ``server/http.py`` ``_RequestReader``). *raw*, the
    socket's ``SocketIO``, is held (and closed with this) only to keep the socket open."""

    def __init__(self, raw: Any, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._raw = raw
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(_left(self._deadline))
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Response(http.client.HTTPResponse):
    """A response whose every read (status line, headers, body) ends by *deadline*."""

    def __init__(self, sock: socket.socket, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        # The socket's own file, whose receives each wait the whole timeout again, gives up its
        # SocketIO (open: it keeps the socket open while the response reads, as http.client
        # closes the connection's reference early) to a reader bounded by the deadline.
        self.fp = io.BufferedReader(_DeadlineReader(self.fp.detach(), sock, deadline))


def _connection(source: SourceURL, deadline: float) -> http.client.HTTPConnection:
    """The HTTP side of the exchange (:func:`fetch` opens its socket within the deadline); the
    class gives the Host header its default port."""
    cls = http.client.HTTPSConnection if source.scheme == "https" else http.client.HTTPConnection
    conn = cls(source.host, source.port)
    conn.response_class = functools.partial(_Response, deadline=deadline)  # type: ignore[assignment]
    return conn


def _check_status(resp: http.client.HTTPResponse) -> None:
    if resp.status == 200:
        return
    hint = ""
    if 300 <= resp.status < 400:
        # Not followed: a redirect could send the Basic auth to another host.
        where = mask_url(resp.getheader("Location") or "")[:120]
        hint = f" to {where} (redirects are not followed: give that URL as the source)"
    raise ScrapeError("http", f"HTTP {resp.status} {resp.reason[:60]}{hint}")


def _declared_length(resp: http.client.HTTPResponse, max_bytes: int) -> int | None:
    """The body's Content-Length when it gives a number (refused at once over the cap)."""
    length = resp.getheader("Content-Length")
    if length is None or not length.isdigit():
        return None
    if int(length) > max_bytes:
        raise ScrapeError("too_large", f"the body is {int(length):,} bytes, over the cap of {max_bytes:,}")
    return int(length)


def _read_body(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The body (each read ends by the exchange's deadline: :class:`_Response`)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise ScrapeError("too_large", f"the body is over the cap of {max_bytes:,} bytes")
        chunks.append(chunk)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
