"""Exporter: an HTTP server over the Redis view, for Prometheus, routers and health checks.

    GET /metrics        every engine's series (Prometheus text format), one Redis read
    GET /snapshot       the same snapshot as JSON: per engine up, age, counters, gauges, and
                        histograms with p50/p90/p99 since start; rates and quantiles over the
                        last *window* seconds and fleet totals (for routers and autoscalers;
                        JSON Schema: ``redis_stats/schemas/snapshot.schema.json``)
    GET /load           every engine's load for routers: up, age, requests running and waiting,
                        KV-cache usage and capacity, recent token rates, and the fleet's sums,
                        means and max (refreshed by one thread; ETag / If-None-Match -> 304;
                        JSON Schema: ``redis_stats/schemas/load.schema.json``, docs/load.md)
    GET /healthz        200 when Redis answers, 503 otherwise
    GET /namespaces     the namespaces served (one, or several: see below)

``/metrics?slice=i/N`` serves the engines ``e % N == i`` only (read from Redis alone; the
writers' self-metrics in slice 0), ``name[]=`` keeps only the samples named, and a label value
longer than ``max_label_length`` is replaced and counted (redis_stats/prometheus/slices.py);
``/load?slice=i/N`` too. With *slice* the whole exporter serves one slice (``--slice``).
    GET /               a live page (redis_stats/prometheus/web/index.html): each engine's state, throughput
                        and latency with charts of the last minutes, polling /snapshot

HTTP as prometheus_client's own server does it (its helpers are reused, not rewritten):
``/metrics`` negotiates the format from ``Accept`` with ``choose_encoder`` — OpenMetrics 1.0 when
asked for (Prometheus asks for it first by default), else Prometheus text 0.0.4 from the fast
renderer — and every body is gzipped when ``Accept-Encoding`` allows it (``gzip_accepted``).
``HEAD`` answers every ``GET`` path with the same headers and no body. A connection whose request
(line and headers) has not arrived within *request_timeout* seconds is closed, whether it stays
silent or trickles bytes, so idle or slow clients cannot hold the server's threads.

With ``self_metrics`` (the standalone ``redis-stats exporter``), ``/metrics`` also carries the
exporter's own process: prometheus_client's ``process_*`` and ``python_*`` collectors, and the
duration and size of its scrapes (``redis_stats_exporter_*``).

One exporter may serve several namespaces (``namespaces=[...]`` or ``all_namespaces=True``;
``redis-stats exporter --namespace A --namespace B`` or ``--all-namespaces``,
redis_stats/prometheus/namespaces.py): ``?namespace=NS`` on any path serves that namespace exactly
as an exporter of it alone would (the other parameters as they are: ``?namespace=A&slice=0/4``),
its series labelled ``redis_stats_namespace``; the whole ``/metrics`` (no ``?namespace=``) carries
every namespace served, each family once, every namespace's series labelled so; ``/load`` and
``/snapshot`` need ``?namespace=``.

Run it standalone (``redis-stats exporter``) or inside any process (:class:`Exporter`).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import logging
import queue
import re
import socket
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import (
    CONTENT_TYPE_PLAIN_0_0_4,
    choose_encoder,
    generate_latest,
    gzip_accepted,
)

from redis_stats._core.background import background_errors, survive, survived
from redis_stats.config import mask_url, redact
from redis_stats.endpoints import FamilyRole
from redis_stats.errors import error_kind
from redis_stats.prometheus.collector import RedisCollector
from redis_stats.prometheus.endpoints import EndpointViews, UnknownEndpoint, without_engine_label
from redis_stats.prometheus.loadfeed import IDLE as LOAD_IDLE
from redis_stats.prometheus.loadfeed import LoadFeed
from redis_stats.prometheus.namespaces import (
    MAX_NAMESPACES,
    AllNamespaces,
    NamespaceSet,
    NotServed,
    namespace_param,
)
from redis_stats.prometheus.recent import (
    WINDOW_BUDGET,
    FleetSummary,
    SnapshotRing,
    snapshot_document,
    summary_problems,
)
from redis_stats.prometheus.slices import EngineSlice, ScrapeQuery, parse_query, select_samples
from redis_stats.reader import StatsReader

OPENMETRICS_1_0 = "application/openmetrics-text; version=1.0.0; charset=utf-8"

__all__ = ["Exporter"]

log = logging.getLogger("redis_stats.exporter")

PATHS = ("/", "/metrics", "/snapshot", "/load", "/endpoints", "/healthz", "/namespaces")


@functools.cache
def live_page() -> bytes:
    """The page served at ``/`` (package data; read once, never changes)."""
    return (resources.files("redis_stats.prometheus") / "web" / "index.html").read_bytes()


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


# A version prometheus_client may echo back into Content-Type: digits only (ASCII), three parts.
_VERSION = re.compile(r"version=([^;]*)")
_SAFE_VERSION = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", re.ASCII)


def negotiate(accept: str) -> tuple[Callable[[Any], bytes], str]:
    """(encoder, Content-Type) for an ``Accept`` header, as ``choose_encoder`` picks them, except
    that a header it cannot parse gets the Prometheus text format instead of an exception.

    ``choose_encoder`` raises on a version that is not numbers (``version=abc``, ``1.x``) and
    echoes whatever parses (``1.0.0.\\x01``) into the answer's Content-Type; any client could
    then make every request a 500 and a traceback in the log. A version that is not three ASCII
    numbers is treated as no OpenMetrics request at all.
    """
    try:
        encoder, content_type = choose_encoder(accept)
    except (TypeError, ValueError):
        return generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    if content_type != CONTENT_TYPE_PLAIN_0_0_4:
        version = _VERSION.search(content_type)
        if version is None or not _SAFE_VERSION.fullmatch(version.group(1)):
            return generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    return encoder, content_type


OMITTED = "redis_stats_openmetrics_samples_omitted"
OMITTED_HELP = (
    "Samples of this scrape left out of OpenMetrics, which cannot carry them: a counter's or a "
    "histogram's value below 0 or NaN (a histogram's sum after negative observations)."
)


def openmetrics_from_text(text: str) -> str:
    """OpenMetrics 1.0 from Prometheus text 0.0.4, as prometheus_client writes both.

    The samples are the same; the metadata differs in three ways: a counter's ``# HELP``/``# TYPE``
    name has no ``_total`` (its samples keep it), ``"`` is escaped in ``# HELP`` text, and the
    body ends with ``# EOF``. Only the ``#`` lines are touched (found with ``str.find``: a few
    hundred in a multi-megabyte body), so this costs a small fraction of a render, where
    prometheus_client's OpenMetrics writer over ``collect()`` costs several renders.

    One more difference: OpenMetrics holds a counter's and a histogram's samples to be counters,
    never below 0 nor NaN, and a parser refuses the whole body for one of them (a histogram's
    ``_sum`` after negative observations, or with +Inf and -Inf summed over writers). Such a
    sample is left out (the text format carries it) and counted in
    ``redis_stats_openmetrics_samples_omitted``, written when it is not 0.
    """
    lines = _comment_lines(text)
    counters = _counter_names(text, lines)
    edits = [(start, end, _openmetrics_comment(text[start:end], counters)) for start, end in lines]
    unfit = _unfit_samples(text, counters, _histogram_names(text, lines))
    edits += [(start, end, "") for start, end in unfit]
    out = []
    done = 0
    for start, end, line in sorted(edits, key=lambda edit: edit[0]):
        if line is None:
            continue
        out.append(text[done:start])
        out.append(line)
        done = end
    out.append(text[done:])
    if text and not text.endswith("\n"):
        out.append("\n")
    if unfit:
        out.append(f"# HELP {OMITTED} {OMITTED_HELP}\n# TYPE {OMITTED} gauge\n{OMITTED} {len(unfit)}.0\n")
    out.append("# EOF\n")
    return "".join(out)


def _histogram_names(text: str, lines: list[tuple[int, int]]) -> set[str]:
    """The histograms' names, from their ``# TYPE`` lines."""
    names = set()
    for start, end in lines:
        line = text[start:end]
        if line.startswith("# TYPE ") and line.endswith(" histogram"):
            names.add(line[7 : -len(" histogram")])
    return names


_COUNTER_LIKE = ("_sum", "_count", "_bucket")


def _unfit(value: str) -> bool:
    """A sample value below 0 or NaN (``-0.0`` is neither)."""
    try:
        number = float(value)
    except ValueError:
        return False
    return number != number or number < 0


def _count_before(text: str, start: int, base: str, labels: str) -> list[tuple[int, int]]:
    """The ``_count`` line of histogram *base* with *labels* just before *start*, if it is there."""
    before = text.rfind("\n", 0, max(start - 1, 0)) + 1
    prefix = f"{base}_count{labels} "
    return [(before, start)] if start and text.startswith(prefix, before) else []


def _unfit_samples(text: str, counters: set[str], histograms: set[str]) -> list[tuple[int, int]]:
    """Where the sample lines OpenMetrics cannot carry are (start, end with the newline): a
    counter's ``_total``, a histogram's ``_sum``, ``_count`` or ``_bucket`` whose value is below 0
    or NaN. Found with ``str.find`` on the value's first characters: rare (a gauge below 0 is the
    usual find, looked at and kept)."""
    found = []
    for marker in (" -", " NaN"):
        i = text.find(marker)
        while i != -1:
            end = text.find("\n", i)
            end = len(text) if end == -1 else end
            start = text.rfind("\n", 0, i) + 1
            # The value is a sample line's last field (a label value holds no newline, and a
            # space in one comes before the value's): anything else is not a value.
            if " " not in text[i + 1 : end] and not text.startswith("#", start) and _unfit(text[i + 1 : end]):
                brace = text.find("{", start, i)
                name = text[start : i if brace == -1 else brace]
                base, _, suffix = name.rpartition("_")
                if (suffix == "total" and base in counters) or (
                    "_" + suffix in _COUNTER_LIKE and base in histograms
                ):
                    found.append((start, min(end + 1, len(text))))
                    if suffix == "sum":  # a _count needs its _sum: the line before, as written
                        labels = text[start + len(name) : i]
                        found += _count_before(text, start, base, labels)
            i = text.find(marker, end)
    return found


def _comment_lines(text: str) -> list[tuple[int, int]]:
    """Where each ``#`` line of *text* starts and ends (its newline not included)."""
    starts = [0] if text.startswith("#") else []
    i = text.find("\n#")
    while i != -1:
        starts.append(i + 1)
        i = text.find("\n#", i + 1)
    lines = []
    for start in starts:
        end = text.find("\n", start)
        lines.append((start, len(text) if end == -1 else end))
    return lines


def _counter_names(text: str, lines: list[tuple[int, int]]) -> set[str]:
    """The counters' names without ``_total``, from their ``# TYPE`` lines."""
    counters = set()
    for start, end in lines:
        line = text[start:end]
        if line.startswith("# TYPE ") and line.endswith("_total counter"):
            counters.add(line[7 : -len("_total counter")])
    return counters


def _openmetrics_comment(line: str, counters: set[str]) -> str | None:
    """A ``# HELP`` or ``# TYPE`` line as OpenMetrics writes it; None for any other comment."""
    kind, _, rest = line[2:].partition(" ")
    name, _, tail = rest.partition(" ")
    if kind not in ("HELP", "TYPE"):
        return None
    if name.endswith("_total") and name[:-6] in counters:
        name = name[:-6]
    if kind == "HELP":
        tail = tail.replace('"', '\\"')
    return f"# {kind} {name} {tail}"


def redis_address(url: str) -> str:
    """Where the view reads, for a page header: scheme, hosts and path only.

    Masked by :func:`~redis_stats.config.mask_url` first (which never lets a password through, even
    a malformed one), then cut to what a reader needs: no user name, no ``***``, no query.
    """
    masked = mask_url(url)
    scheme, sep, rest = masked.partition("://")
    if not sep:
        scheme, rest = "", masked
    if "<" in rest:  # mask_url's own "not shown" forms
        return masked
    authority, slash, path = rest.split("?", 1)[0].split("#", 1)[0].partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}".replace("***", "")


def _check_options(
    request_timeout: float,
    window: float,
    max_connections: int,
    summary: FleetSummary | None,
    engines: list[int] | None,
    slice: EngineSlice | None,
    window_budget: int = WINDOW_BUDGET,
) -> None:
    """ValueError for an :class:`Exporter` option out of its range (the first one found)."""
    if not request_timeout > 0:
        raise ValueError(f"request_timeout={request_timeout!r} must be a positive number of seconds")
    if not window > 0:
        raise ValueError(f"window={window!r} must be a positive number of seconds (the /snapshot rates)")
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(
            f"max_connections={max_connections!r} must be a whole number >= 1 "
            "(connections served at once; more get 503 with Retry-After)"
        )
    if isinstance(window_budget, bool) or not isinstance(window_budget, int) or window_budget < 0:
        raise ValueError(
            f"window_budget={window_budget!r} must be a whole number of bytes >= 0 (the memory the "
            "/snapshot window may keep; 0 keeps none: no rates)"
        )
    problems = summary_problems(summary or {})
    if problems:
        raise ValueError("; ".join(problems))
    if slice is not None and engines is not None:
        raise ValueError(f"engines={engines!r} and slice={slice} both limit the view: give one")


def _check_several(several: bool, both: bool, engines: list[int] | None, slice: EngineSlice | None) -> None:
    """ValueError for the options an exporter of several namespaces cannot take."""
    if several and (engines is not None or slice is not None):
        raise ValueError(
            "engines= and slice= serve part of one namespace: not with several (scrape "
            "?namespace=NS&slice=i/N instead)"
        )
    if both:
        raise ValueError("give namespaces=[...] or all_namespaces=True, not both")


def _own_registry(scrapes: ScrapeStats) -> CollectorRegistry:
    """A registry of the exporter's own process and scrapes (never the host's global one, which
    a host such as vLLM serves on its own port)."""
    registry = CollectorRegistry(auto_describe=False)
    for own in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, scrapes, _BackgroundErrors()):
        registry.register(own)
    return registry


class _Both:
    """The Redis view and the exporter's own metrics as one collector (for prometheus_client's writers)."""

    def __init__(self, exporter: Exporter, collector: RedisCollector | AllNamespaces | None = None) -> None:
        self.exporter = exporter
        self.collector = collector or exporter.collector

    def collect(self) -> Iterator[Metric]:
        yield from self.collector.collect()
        if self.exporter.own_registry is not None:
            yield from self.exporter.own_registry.collect()


class _BackgroundErrors:
    """``redis_stats_background_errors_total{thread,kind}``: the exceptions this process's
    background threads and tasks survived (:mod:`redis_stats._core.background`); one of the
    exporter's own metrics, as its process's are."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield background_family()


def background_family() -> Metric:
    """The family of :class:`_BackgroundErrors`."""
    fam = CounterMetricFamily(
        "redis_stats_background_errors",
        "Exceptions a background thread or task of this process survived (it went on), by thread "
        "(flusher, lease, reporter, load, gc, window) and kind (the exception's class); the first of "
        "each is logged with its traceback.",
        labels=["thread", "kind"],
    )
    for (thread, kind), n in sorted(background_errors().items()):
        fam.add_metric([thread, kind], float(n))
    return fam


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


class _BusyResponder:
    """One daemon thread that answers connections over the cap with the 503.

    Closing a socket whose request was never read makes the kernel send a reset instead of a
    normal close, and a client (on a real network, or still sending) then loses the 503 already
    sent. So each refused socket has its request read first (what arrives within ``_BUSY_WAIT``),
    gets the 503, is shut for writing, and is drained until the client hangs up (or the wait
    ends) before it is closed. The accept loop only puts the socket in a bounded queue: when it
    is full the socket is closed at once, so a flood never blocks accepting.
    """

    def __init__(self) -> None:
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
            try:
                self._answer(sock)
            except OSError:
                pass
            finally:
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

    def _answer(self, sock: socket.socket) -> None:
        self._read(sock, until_end_of_headers=True)
        sock.settimeout(_BUSY_WAIT)
        sock.sendall(_BUSY)
        sock.shutdown(socket.SHUT_WR)
        # Whatever still arrives (a request body) is read, so the close is not a reset.
        self._read(sock, until_end_of_headers=False)


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most *max_connections* connections served at once.

    ThreadingHTTPServer starts one thread per connection with no bound (prometheus_client's own
    server too): a burst of clients, or many slow ones each held up to the request timeout, would
    grow threads and memory without limit. Past the cap a connection gets a 503 with
    ``Retry-After`` from one responder thread (:class:`_BusyResponder`) and is closed, so the
    clients already being served keep their threads and a scraper sees a clear answer instead of
    a timeout.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._busy = _BusyResponder()
        self.refused = 0  # connections refused for the cap, answered 503 or not (read by ScrapeStats)
        super().__init__(address, handler)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._busy.start()
        super().serve_forever(poll_interval)

    def server_close(self) -> None:
        super().server_close()
        self._busy.stop()

    def process_request(self, request: Any, client_address: Any) -> None:
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
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up mid-response is routine for a metrics endpoint: a debug line, not
        # socketserver's traceback on stderr.
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


# Buckets of redis_stats_exporter_scrape_duration_seconds: a scrape takes milliseconds for a few
# engines and up to seconds for a thousand on a loaded host.
SCRAPE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# /snapshot reports rates only over at least this fraction of the window (3 s of 30 s); the sampler
# takes a snapshot every SAMPLE_EVERY of the window, so once warm a full window is always there.
MIN_SPAN = 0.1
SAMPLE_EVERY = 1 / 6
# The sampler stops after this many windows without a /snapshot request (at least SAMPLER_IDLE s;
# the next request starts it again): a page closed, or a namespace nobody looks at, reads nothing.
SAMPLER_IDLE_WINDOWS = 4
SAMPLER_IDLE = 60.0


def _failed_round(thread: str, exc: Exception) -> None:
    """One round of the exporter's *thread* (gc, window) failed: Redis' failures are the next
    round's to retry (DEBUG); anything else is a background error, counted and logged once."""
    if error_kind(exc) != "other":
        log.debug("%s round failed: %s", thread, exc)
    else:
        survived(thread, exc, log)


class ScrapeStats:
    """Duration and size of the exporter's ``/metrics`` answers, as metrics (thread safe).

    A scrape's own duration and size are known only after its body is built, so each body carries
    the figures of the scrapes before it (as prometheus_client's own collectors do).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets = [0] * len(SCRAPE_BUCKETS)
        self._count = 0
        self._sum = 0.0
        self._bytes = 0.0
        self._last_bytes = 0.0
        # Connections refused for the server's cap (set by the Exporter that owns the server).
        self.refused: Callable[[], int] = lambda: 0

    def observe(self, seconds: float, size: int) -> None:
        """Count one scrape that took *seconds* and answered *size* bytes (before compression)."""
        with self._lock:
            for i, bound in enumerate(SCRAPE_BUCKETS):
                if seconds <= bound:
                    self._buckets[i] += 1
            self._count += 1
            self._sum += seconds
            self._bytes += size
            self._last_bytes = size

    def describe(self) -> list[Metric]:
        """Nothing to describe ahead (registering must stay cheap)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The scrape figures so far."""
        with self._lock:
            buckets, count, total = list(self._buckets), self._count, self._sum
            size, last = self._bytes, self._last_bytes
        hist = HistogramMetricFamily(
            "redis_stats_exporter_scrape_duration_seconds",
            "Time taken to build the answers to /metrics (read of Redis, render, encode).",
        )
        pairs = [(repr(b), float(c)) for b, c in zip(SCRAPE_BUCKETS, buckets)] + [("+Inf", float(count))]
        hist.add_metric([], pairs, total)
        yield hist
        sent = CounterMetricFamily(
            "redis_stats_exporter_scrape_bytes", "Bytes of /metrics bodies built (before compression)."
        )
        sent.add_metric([], size)
        yield sent
        last_size = GaugeMetricFamily(
            "redis_stats_exporter_last_scrape_size_bytes",
            "Size of the last /metrics body (before compression).",
        )
        last_size.add_metric([], last)
        yield last_size
        refused = CounterMetricFamily(
            "redis_stats_exporter_connections_refused",
            "Connections refused because max_connections were already being served (answered 503, "
            "or closed unanswered when more than 128 refused ones were waiting).",
        )
        refused.add_metric([], float(self.refused()))
        yield refused


class Exporter:
    """Serves ``/metrics``, ``/snapshot`` and ``/healthz`` from a thread.

    *port* 0 picks a free port (see :attr:`port` after :meth:`start`). With *gc_interval* > 0 it
    also runs retention (``redis_stats.ops.retention``) that often. *request_timeout* bounds each socket
    operation of a connection: a client that has not sent its whole request (line and headers)
    within that long is disconnected and its thread freed, even if it keeps sending a byte at a
    time, and a response must be sent within it (``sendall``'s timeout covers the
    whole body; the default, 10 s, is Prometheus' default scrape timeout).

    ``/snapshot`` adds rates and quantiles over the last *window* seconds and fleet totals. The
    window comes from the snapshots this exporter took (every ``/snapshot`` request, and one every
    ``window / 6`` seconds from the first request on); one shorter than a tenth of *window* is not
    reported. The snapshots behind the window are kept in at most *window_budget* bytes (estimated:
    about 5 MB each at 1,024 vLLM engines, docs/operations.md "Sizing"); past it the oldest go, and
    the window is the span that fits. *summary* names fleet figures for a product (e.g.
    ``redis_stats.integrations.vllm.summary.VLLM_FLEET_SUMMARY``). With *self_metrics* ``/metrics``
    also shows this process (``process_*``, ``python_*``) and its scrapes: on for the standalone
    ``redis-stats exporter``; off by default because a host such as vLLM already serves its own
    process metrics on its own ``/metrics``.

    At most *max_connections* connections are served at once (one thread each); past that a new
    connection is answered 503 with ``Retry-After: 1`` by one responder thread and closed (counted in
    ``redis_stats_exporter_connections_refused_total`` with *self_metrics*).

    With *namespaces* (a list) or *all_namespaces* it serves several namespaces (at most
    *max_namespaces*) of *reader*'s Redis, by its client and catalogue (its own namespace is
    served only when listed or found): ``?namespace=`` picks one (module docstring). Each is served
    by an ``Exporter`` of its own made on first use, with ``listen=False`` (no socket, no gc, no
    process metrics: this exporter's) and ``namespace_label=True`` (every series labelled
    ``redis_stats_namespace``), the other options as given here.

    ``GET /endpoints`` and ``/metrics?endpoint=<id>`` / ``?engine=<n>`` are the endpoint views
    (redis_stats/prometheus/endpoints.py): *roles* declares which families they serve as one
    series each (e.g. ``redis_stats.integrations.vllm.roles.VLLM_ROLES``); *self_endpoint* is
    what ``?endpoint=self`` names (the view inside a vLLM pod: its own endpoint).
    """

    def __init__(
        self,
        reader: StatsReader,
        *,
        engines: list[int] | None = None,
        host: str = "127.0.0.1",
        port: int = 9400,
        gc_interval: float = 0.0,
        request_timeout: float = 10.0,
        window: float = 30.0,
        summary: FleetSummary | None = None,
        self_metrics: bool = False,
        max_connections: int = 64,
        load_refresh: float = 0.25,
        slice: EngineSlice | None = None,
        load_idle: float = LOAD_IDLE,
        window_budget: int = WINDOW_BUDGET,
        namespaces: Sequence[str] | None = None,
        all_namespaces: bool = False,
        max_namespaces: int = MAX_NAMESPACES,
        listen: bool = True,
        namespace_label: bool = False,
        roles: Sequence[FamilyRole] = (),
        self_endpoint: str | None = None,
    ) -> None:
        _check_options(request_timeout, window, max_connections, summary, engines, slice, window_budget)
        several = all_namespaces or namespaces is not None
        _check_several(several, all_namespaces and namespaces is not None, engines, slice)
        self.reader = reader
        self.slice = slice
        self.engines: Any = slice if slice is not None else engines
        self.request_timeout = request_timeout
        self.window = window
        self.summary = dict(summary or {})
        self.namespace_label = namespace_label
        self.collector = RedisCollector(
            reader,
            engines=self.engines,
            writers=slice is None or slice.index == 0,
            namespace_label=namespace_label,
        )
        self.load_feed = LoadFeed(reader, refresh=load_refresh, engines=engines, only=slice, idle=load_idle)
        self.endpoint_views = EndpointViews(
            # a reader of its own: its whole-namespace map reads and the load feed's reads of
            # these engines would otherwise replace each other's plan (a read again each time)
            StatsReader(reader.config, reader.catalog, client=reader.client),
            roles,
            labels=self.collector.labels,
            self_endpoint=self_endpoint,
            namespace_label=namespace_label,
        )
        # The options each namespace's own Exporter is made with (several namespaces).
        self._view_options: dict[str, Any] = {
            "roles": tuple(roles),
            "request_timeout": request_timeout,
            "window": window,
            "load_refresh": load_refresh,
            "load_idle": load_idle,
            "window_budget": window_budget,
        }
        self.namespaces: NamespaceSet[Exporter] | None = None
        if several:
            self.namespaces = NamespaceSet(
                reader.client,
                None if all_namespaces else list(namespaces or ()),
                self._namespace_view,
                limit=max_namespaces,
            )
        # ?slice=i/N: one collector (and reader: its own plan and caches) per slice asked for.
        self._slices: dict[EngineSlice, RedisCollector] = {}
        self._slices_lock = threading.Lock()
        # One snapshot kept per sampling period at most, for a window and two periods more: a
        # baseline a full window old is there when the next sample lands. Within window_budget
        # bytes (the oldest dropped first: the window reported is then the span that fits).
        spacing = window * SAMPLE_EVERY
        self._ring = SnapshotRing(keep=window + 2 * spacing, max_bytes=window_budget, spacing=spacing * 0.9)
        self._sampler_lock = threading.Lock()
        self._sampler_started = False
        self.scrapes = ScrapeStats()
        # One body (a /metrics text, a /snapshot document, a window sample) is built at a time. Its
        # read, decode and rendering are Python under the GIL: several at once finish no sooner
        # in all, but each holds its read, its decoded form and its text at the same time (at a
        # thousand engines, tens of MB each: four slice scrapes, a whole /metrics and the page's
        # poll together took the process past its limit). Serving a built body is not held.
        self._building = threading.Lock()
        # The exporter's own process and scrapes: a registry of its own (never the host's global
        # one, which a host such as vLLM serves on its own port).
        self.own_registry = _own_registry(self.scrapes) if self_metrics else None
        if self.own_registry is not None and self.namespaces is not None:
            self.own_registry.register(self.namespaces)
        self._snapshot_asked = 0.0  # monotonic time of the last /snapshot request (the sampler's idling)
        # listen=False: one namespace's view inside an exporter of several (which has the socket).
        self._server = _Server((host, port), self._handler(), max_connections) if listen else None
        self.scrapes.refused = lambda: self._server.refused if self._server is not None else 0
        self._thread: threading.Thread | None = None
        self._serving = False  # serve_forever() runs (or is about to): close() must shut it down
        self.gc_interval = gc_interval
        self._stop = threading.Event()

    def _listening(self) -> _Server:
        if self._server is None:
            raise RuntimeError("this Exporter was made with listen=False: it has no socket to serve")
        return self._server

    @property
    def port(self) -> int:
        """The TCP port served."""
        return self._listening().server_address[1]

    @property
    def url(self) -> str:
        """Base URL of the server."""
        host = self._listening().server_address[0]
        if isinstance(host, bytes):  # typeshed's type for any family; AF_INET gives str
            host = host.decode()
        return f"http://{host}:{self.port}"

    def start(self) -> Exporter:
        """Serve from a daemon thread."""
        self._serving = True
        self._thread = threading.Thread(
            target=self._listening().serve_forever, name="redis_stats-exporter", daemon=True
        )
        self._thread.start()
        self._start_gc()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread (until :meth:`close` from another thread, or Ctrl-C)."""
        self._start_gc()
        self._serving = True
        self._listening().serve_forever()

    def _start_gc(self) -> None:
        # Retention on a timer: every exporter may run it; the gc lease lets one collect at a time.
        if self.gc_interval > 0:
            threading.Thread(target=self._gc_loop, name="redis_stats-gc", daemon=True).start()

    def _gc_loop(self) -> None:
        while not self._stop.wait(self.gc_interval):
            if self.namespaces is None:
                self._collect_once()
                continue
            # Every namespace served, asked for or not: retention is the store's upkeep.
            with survive("gc", log):  # the list of namespaces (a SCAN) handles its own failures
                for namespace in self.namespaces.served():
                    if self._stop.is_set():
                        break
                    self._collect_once(namespace)

    def _collect_once(self, namespace: str | None = None) -> None:
        """One round of retention (of *namespace*, default the reader's): a failure costs this
        round only (the loop never dies)."""
        from redis_stats.ops.retention import collect_garbage

        try:
            config = (
                self.reader.config if namespace is None else self.reader.config.replace(namespace=namespace)
            )
            result = collect_garbage(config)
            for prefix, why in result.failed.items():
                log.warning("gc could not collect keys %s* of the namespace: %s", prefix, why)
            if result.engines or result.writers:
                log.info(
                    "gc removed engines %s and %d writers past retention", result.engines, len(result.writers)
                )
        except Exception as exc:  # Redis away: the next round tries again; anything else counted
            _failed_round("gc", exc)

    def close(self) -> None:
        """Stop serving (and the retention timer, and every namespace's view); also fine before
        :meth:`start`."""
        self._stop.set()
        self.load_feed.close()
        if self.namespaces is not None:
            self.namespaces.close()
        if self._server is None:
            return
        if self._serving:
            # socketserver's shutdown() waits for serve_forever() to end: called on a server that
            # never served, it would wait for ever.
            self._server.shutdown()
        self._server.server_close()

    def _namespace_view(self, namespace: str) -> Exporter:
        """The Exporter serving *namespace* inside this one (made by :attr:`namespaces` on first
        use): the reader's client and catalogue, its own reader (plan and caches), no socket."""
        reader = StatsReader(
            self.reader.config.replace(namespace=namespace), self.reader.catalog, client=self.reader.client
        )
        view = Exporter(
            reader, listen=False, namespace_label=True, summary=self.summary, **self._view_options
        )
        view._building = self._building  # one body at a time in the whole process (its memory)
        view.scrapes = self.scrapes  # ?namespace= scrapes count in the exporter's scrape figures
        return view

    def route(self, query: str) -> Exporter:
        """The Exporter that answers a request with this query string: the view of its
        ``?namespace=`` (this one when it serves that namespace alone, or when none is given).
        ValueError for a bad parameter, :class:`NotServed` for a namespace not served."""
        namespace = namespace_param(query)
        if namespace is None:
            return self
        if self.namespaces is not None:
            return self.namespaces.view(namespace)
        if namespace != self.reader.config.namespace:
            raise NotServed(
                f"this exporter serves namespace {self.reader.config.namespace!r} only, not "
                f"{namespace!r} (an exporter of several: redis-stats exporter --namespace A "
                "--namespace B, or --all-namespaces)"
            )
        return self

    def namespaces_json(self) -> dict[str, Any]:
        """The document of ``/namespaces``: the namespaces served (sorted) and whether this
        exporter serves several (then each is picked with ``?namespace=``)."""
        if self.namespaces is None:
            return {"namespaces": [self.reader.config.namespace], "several": False}
        return {
            "namespaces": self.namespaces.served(),
            "several": True,
            "all": self.namespaces.every,
            "max_namespaces": self.namespaces.limit,
        }

    def metrics(
        self, accept: str | None = None, query: ScrapeQuery | None = None, *, gzipped: bool = False
    ) -> tuple[str, bytes]:
        """(Content-Type, body) of ``/metrics`` for a request's ``Accept`` header and query
        (*query*: its ``slice`` and ``name[]``, see :func:`parse_query`); the body gzipped when
        *gzipped* (compressed from the text a slice at a time: no whole copy of it as bytes).

        The format is chosen by prometheus_client's ``choose_encoder``, as its own server does.
        A client that does not ask for OpenMetrics gets the fast renderer's Prometheus text,
        format 0.0.4 (what ``choose_encoder`` answers it; the names a catalogue allows are the
        same in every text version). OpenMetrics 1.0 is that text rewritten by
        :func:`openmetrics_from_text`; another OpenMetrics version is generated by
        prometheus_client over :meth:`RedisCollector.collect`. Label values past
        ``max_label_length`` are replaced and counted in every format.
        """
        query = query or ScrapeQuery()
        collector = self._collector_of(query)
        encoder, content_type = negotiate(accept or "")
        if (query.endpoint is not None or query.engine is not None) and content_type.startswith(
            "application/openmetrics-text"
        ):
            # An endpoint's view is its text (the one series per family is made there), so
            # OpenMetrics 1.0 of it whatever version was asked: prometheus_client's writer of
            # another version would go by the engines' own series.
            content_type = OPENMETRICS_1_0
        with self._building:
            started = time.perf_counter()
            text = self._metrics_text(collector, encoder, content_type, query)
            if query.engine is not None:  # one engine's view: without its engine label
                text = without_engine_label(text, query.engine)
            body, size = encode_body(text, gzipped)
            del text  # before the next body is built: at a thousand engines tens of MB
            self.scrapes.observe(time.perf_counter() - started, size)
        if not content_type.startswith("application/openmetrics-text"):
            content_type = CONTENT_TYPE_PLAIN_0_0_4
        return content_type, body

    def _collector_of(self, query: ScrapeQuery) -> RedisCollector | AllNamespaces:
        """What a ``/metrics`` of *query* reads and renders: this namespace's collector (or its
        slice's, endpoint's or engine's: :class:`UnknownEndpoint` for one not held); for an
        exporter of several, every namespace's, merged."""
        if query.endpoint is not None or query.engine is not None:
            return self.endpoint_views.collector_of(query, several=self.namespaces is not None)
        if self.namespaces is None:
            return self.collector if query.slice is None else self.slice_collector(query.slice)
        views = self.namespaces.views()
        parts = [v.collector if query.slice is None else v.slice_collector(query.slice) for _, v in views]
        return AllNamespaces(parts, self.namespaces.clashed)

    def _metrics_text(
        self,
        collector: RedisCollector | AllNamespaces,
        encoder: Callable[[Any], bytes],
        content_type: str,
        query: ScrapeQuery,
    ) -> str:
        """The text of one ``/metrics`` answer (see :meth:`metrics`)."""
        if not content_type.startswith("application/openmetrics-text") or "version=1.0.0;" in content_type:
            text = collector.render_text() + self._own_text()
            if query.names is not None:
                text = select_samples(text, query.names)
            if content_type.startswith("application/openmetrics-text"):
                # Prometheus' default: the fast text, turned into OpenMetrics 1.0 (same samples).
                text = openmetrics_from_text(text)
            return text
        # Another version: prometheus_client writes it.
        text = encoder(_Both(self, collector)).decode()
        return select_samples(text, query.names) if query.names is not None else text

    # At most this many slices get a collector of their own (a client inventing slices must not
    # make the exporter hold a reader for each).
    MAX_SLICE_COLLECTORS = 64

    def slice_collector(self, part: EngineSlice) -> RedisCollector:
        """The collector of ``?slice=`` *part*: a reader of its own (its plan and caches hold
        that slice's engines only) on the exporter's Redis client; ValueError past
        :attr:`MAX_SLICE_COLLECTORS` slices, or when the exporter serves one slice already."""
        if self.slice is not None or self.engines is not None:
            served = f"slice {self.slice}" if self.slice is not None else f"engines {self.engines}"
            raise ValueError(
                f"this exporter serves {served} only; ?slice= needs an exporter of the whole fleet "
                "(no --slice, no --engines)"
            )
        found = self._slices.get(part)
        if found is not None:
            return found
        with self._slices_lock:
            found = self._slices.get(part)
            if found is None:
                if len(self._slices) >= self.MAX_SLICE_COLLECTORS:
                    raise ValueError(
                        f"slice {part}: already serving {len(self._slices)} distinct slices, the most "
                        "one exporter keeps; scrape fewer distinct i/N"
                    )
                reader = StatsReader(self.reader.config, self.reader.catalog, client=self.reader.client)
                found = RedisCollector(
                    reader, engines=part, writers=part.index == 0, namespace_label=self.namespace_label
                )
                self._slices[part] = found
            return found

    def _own_text(self) -> str:
        if self.own_registry is None:
            return ""
        return generate_latest(self.own_registry).decode()

    def snapshot_json(
        self, names: list[str] | None = None, buckets: bool = True
    ) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) of ``/snapshot``: the snapshot, its recent window, fleet totals
        (only the metrics *names* when given: ``?name[]=...``; without since-start histogram
        buckets when *buckets* is False: ``?buckets=0``)."""
        self._start_sampler()
        with self._building:
            return self._snapshot_json(names, buckets)

    def snapshot_body(
        self, names: list[str] | None = None, buckets: bool = True, *, gzipped: bool = False
    ) -> tuple[int, bytes]:
        """(HTTP status, body) of ``/snapshot``: :meth:`snapshot_json`'s document as strict JSON,
        gzipped when *gzipped*; the document is freed before the next body is built."""
        self._start_sampler()
        with self._building:
            status, doc = self._snapshot_json(names, buckets)
            text = json.dumps(doc, allow_nan=False)  # strict JSON: Snapshot.to_dict is
            del doc
            body, _size = encode_body(text, gzipped)
        return status, body

    def _snapshot_json(self, names: list[str] | None, buckets: bool) -> tuple[int, dict[str, Any]]:
        try:
            snap = self.reader.snapshot(self.engines)  # thread-safe: each read checks its own plan
        except Exception as exc:
            # redis-py's message names a host or a reply; redacted in case it ever quotes a secret.
            return 503, {"error": error_kind(exc), "detail": redact(str(exc), self.reader.config.url)}
        earlier = self._ring.baseline(snap, self.window, min_span=self.window * MIN_SPAN)
        self._ring.add(snap)
        source = {"namespace": self.reader.config.namespace, "redis": redis_address(self.reader.config.url)}
        doc = snapshot_document(
            snap,
            earlier,
            requested=self.window,
            summary=self.summary,
            source=source,
            names=names,
            buckets=buckets,
        )
        return 200, doc

    def _start_sampler(self) -> None:
        # Started by the first /snapshot request: an exporter nobody asks for windows (a node view
        # scraped only for /metrics) adds no reads of Redis. It stops after sampler_idle seconds
        # without one (a page closed), and the next request starts it again.
        self._snapshot_asked = time.monotonic()
        with self._sampler_lock:  # two first requests at once must not start two samplers
            if self._sampler_started:
                return
            self._sampler_started = True
        threading.Thread(target=self._sample_loop, name="redis_stats-window", daemon=True).start()

    @property
    def sampler_idle(self) -> float:
        """Seconds without a ``/snapshot`` request after which the window's sampler stops."""
        return max(SAMPLER_IDLE, SAMPLER_IDLE_WINDOWS * self.window)

    @property
    def sampling(self) -> bool:
        """Whether the window's sampler runs (from the first ``/snapshot`` until it idles)."""
        return self._sampler_started

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.window * SAMPLE_EVERY):
            with self._sampler_lock:
                if time.monotonic() - self._snapshot_asked > self.sampler_idle:
                    self._sampler_started = False  # nobody asks: stop reading (a request restarts)
                    return
            try:
                with self._building:
                    self._ring.add(self.reader.snapshot(self.engines))
            except Exception as exc:  # Redis away: the next request reports it
                _failed_round("window", exc)

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) of ``/healthz``: from a read of the load feed (the engines, the
        writers and their load entries, by the rule every view judges liveness with), not of every
        series: a probe every few seconds must not decode the whole fleet (tens of MB at a
        thousand engines, beside the scrapes). For an exporter of several namespaces (no
        ``?namespace=``): whether Redis answers (``TIME``, one round trip whatever the namespaces:
        a probe must not read every namespace, nor make a view of each)."""
        if self.namespaces is not None:
            return self._health_of_redis()
        try:
            snap = self.reader.load(self.engines)
        except Exception as exc:
            return 503, {
                "status": "redis unavailable",
                "error": error_kind(exc),
                "redis": self.reader.config.safe_url,
            }
        up = sum(e.up for e in snap.engines.values())
        return 200, {"status": "ok", "engines": len(snap.engines), "engines_up": up}

    def _health_of_redis(self) -> tuple[int, dict[str, Any]]:
        try:
            self.reader.client.time()
        except Exception as exc:
            return 503, {
                "status": "redis unavailable",
                "error": error_kind(exc),
                "redis": self.reader.config.safe_url,
            }
        assert self.namespaces is not None
        return 200, {"status": "ok", "namespaces": len(self.namespaces.known())}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            # Socket timeout of each connection (read by StreamRequestHandler.setup): a client that
            # connects and stays silent gets its connection closed instead of holding a thread.
            timeout = exporter.request_timeout

            def setup(self) -> None:
                super().setup()
                # The whole request must arrive within the timeout, not each byte of it.
                self._reader = _RequestReader(self.connection, time.monotonic() + exporter.request_timeout)
                self.rfile = io.BufferedReader(self._reader)

            def parse_request(self) -> bool:
                ok = super().parse_request()  # reads the headers: still under the deadline
                self._reader.deadline = None
                self.connection.settimeout(exporter.request_timeout)  # the answer gets a full timeout
                return ok

            def do_GET(self) -> None:
                self._serve(head=False)

            def do_HEAD(self) -> None:
                # The same work and headers as GET (Content-Length included), without the body.
                self._serve(head=True)

            def _serve(self, *, head: bool) -> None:
                path, _, query = self.path.partition("?")
                try:
                    # The Exporter of the request's ?namespace= (this one when none is given):
                    # every path below is answered by it as a one-namespace exporter answers.
                    # (The page and the list are the exporter's: a page opened on a namespace
                    # not served loads, and says so.)
                    target = exporter if path in ("/", "/namespaces") else exporter.route(query)
                    if path in ("/load", "/snapshot", "/endpoints") and target.namespaces is not None:
                        raise ValueError(
                            f"{path} is one namespace's: this exporter serves several, give "
                            "?namespace=NS (GET /namespaces lists them)"
                        )
                except (ValueError, NotServed) as exc:
                    status = 404 if isinstance(exc, NotServed) else 400
                    self._send(
                        status,
                        "application/json",
                        json.dumps({"error": str(exc)}).encode(),
                        head,
                        "Accept-Encoding",
                    )
                    return
                if path == "/load":
                    self._serve_load(target, head)
                    return
                zipped = gzip_accepted(self.headers.get("Accept-Encoding", ""))
                try:
                    status, content_type, body, vary, compressed = self._respond(target, path, zipped)
                except Exception:
                    # Never a closed connection without an answer (and no URL or data in the body).
                    log.exception("serving %s failed", path)
                    status, content_type, vary = 500, "application/json", "Accept-Encoding"
                    body = json.dumps({"error": "internal error, see the exporter's log"}).encode()
                    compressed = False
                self._send(status, content_type, body, head, vary, compressed)

            def _query(self) -> ScrapeQuery:
                return parse_query(self.path.partition("?")[2])

            def _respond(
                self, exporter: Exporter, path: str, zipped: bool
            ) -> tuple[int, str, bytes, str, bool]:
                """(status, Content-Type, body, Vary, whether the body is gzipped already), as
                *exporter* (the one of the request's namespace) answers."""
                if path == "/metrics":
                    try:
                        query = self._query()
                        accept = self.headers.get("Accept")
                        content_type, body = exporter.metrics(accept, query, gzipped=zipped)
                    except (ValueError, UnknownEndpoint) as exc:  # a bad ?slice=, an unknown endpoint
                        error = json.dumps({"error": str(exc)}).encode()
                        status = 404 if isinstance(exc, UnknownEndpoint) else 400
                        return status, "application/json", error, "Accept-Encoding", False
                    return 200, content_type, body, "Accept, Accept-Encoding", zipped
                if path == "/":
                    return 200, "text/html; charset=utf-8", live_page(), "Accept-Encoding", False
                if path == "/snapshot":
                    params = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                    buckets = params.get("buckets", ["1"])[-1] != "0"
                    status, body = exporter.snapshot_body(params.get("name[]"), buckets, gzipped=zipped)
                    return status, "application/json", body, "Accept-Encoding", zipped
                if path == "/healthz":
                    status, doc = exporter.health()
                elif path == "/endpoints":
                    status, doc = exporter.endpoint_views.answer()
                elif path == "/namespaces":
                    status, doc = 200, exporter.namespaces_json()
                else:
                    status, doc = 404, {"error": "not found", "paths": list(PATHS)}
                body = json.dumps(doc, allow_nan=False).encode()
                return status, "application/json", body, "Accept-Encoding", False

            def _serve_load(self, exporter: Exporter, head: bool) -> None:
                """``/load`` of *exporter* (the one of the request's namespace): the feed's kept
                body (no Redis read, no encoding here), or ``304`` when ``If-None-Match`` names
                its ETag."""
                try:
                    part = self._query().slice
                    answer = exporter.load_feed.answer(part)
                except ValueError as exc:
                    body = json.dumps({"error": str(exc)}).encode()
                    self._send(400, "application/json", body, head, "Accept-Encoding")
                    return
                except Exception:
                    log.exception("serving /load failed")
                    body = json.dumps({"error": "internal error, see the exporter's log"}).encode()
                    self._send(500, "application/json", body, head, "Accept-Encoding")
                    return
                extra = [("Cache-Control", "no-cache"), ("X-Load-Refreshed", f"{answer.refreshed:.3f}")]
                if answer.etag:
                    extra.append(("ETag", answer.etag))
                    wanted = self.headers.get("If-None-Match", "")
                    if answer.etag in (t.strip() for t in wanted.split(",")) or wanted.strip() == "*":
                        self.send_response(304)
                        for name, value in extra:
                            self.send_header(name, value)
                        self.send_header("Vary", "Accept-Encoding")
                        self.end_headers()
                        return
                zipped = gzip_accepted(self.headers.get("Accept-Encoding", ""))
                body = answer.gzipped if zipped else answer.body
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                if zipped:
                    self.send_header("Content-Encoding", "gzip")
                for name, value in extra:
                    self.send_header(name, value)
                self.send_header("Vary", "Accept-Encoding")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _send(
                self,
                status: int,
                content_type: str,
                body: bytes,
                head: bool,
                vary: str,
                compressed: bool = False,
            ) -> None:
                encoding: str | None = None
                if compressed:
                    encoding = "gzip"
                elif gzip_accepted(self.headers.get("Accept-Encoding", "")):
                    body = gzip.compress(body, compresslevel=GZIP_LEVEL)
                    encoding = "gzip"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                if encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Vary", vary)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("%s " + fmt, self.address_string(), *args)

        return Handler
