"""One HTTP GET of a source's metrics endpoint: bounded in time and size, secrets kept out.

A source URL may carry a user and password (``http://user:pass@host:8000/metrics``, sent as HTTP
Basic auth) or a token in its query: only :func:`redis_stats.config.mask_url`'s form of it is
ever printed, and every message that comes from elsewhere (an exception's text) goes through
:func:`redis_stats.config.redact` first.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import time
from dataclasses import dataclass
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
    within *timeout* seconds in all (connect, headers and body: a server that trickles bytes is
    cut off at the deadline too)."""
    deadline = time.monotonic() + timeout
    conn = _connection(source, timeout)
    headers = {"Accept": accept, "Accept-Encoding": "identity", "User-Agent": "redis-stats-bridge"}
    if source.authorization:
        headers["Authorization"] = source.authorization
    try:
        conn.request("GET", source.target, headers=headers)
        resp = conn.getresponse()
        _check_status(resp)
        length = _declared_length(resp, max_bytes)
        data = _read_body(conn, resp, deadline, timeout, max_bytes)
        if length is not None and len(data) != length:
            raise ScrapeError("truncated", f"got {len(data):,} of {length:,} bytes")
        return Response(resp.getheader("Content-Type"), data)
    except ScrapeError:
        raise
    except http.client.IncompleteRead as exc:
        raise ScrapeError("truncated", f"the connection closed after {len(exc.partial):,} bytes") from None
    except TimeoutError:
        raise ScrapeError("timeout", f"no answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ScrapeError("down", source.redact(f"{reason} ({_short(exc)})")) from None
    finally:
        conn.close()


def _connection(source: SourceURL, timeout: float) -> http.client.HTTPConnection:
    if source.scheme == "https":
        return http.client.HTTPSConnection(
            source.host, source.port, timeout=timeout, context=ssl.create_default_context()
        )
    return http.client.HTTPConnection(source.host, source.port, timeout=timeout)


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


def _read_body(
    conn: http.client.HTTPConnection,
    resp: http.client.HTTPResponse,
    deadline: float,
    timeout: float,
    max_bytes: int,
) -> bytes:
    """The body, read within the deadline (the socket's timeout shrinks with what is left)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ScrapeError("timeout", f"the body took longer than {timeout:g} s")
        if conn.sock is not None:
            conn.sock.settimeout(left)
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
