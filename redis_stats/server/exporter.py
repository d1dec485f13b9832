"""Exporter: the server of views over one Redis, on a port, from a thread or in the foreground.

    GET /metrics        every engine's series (Prometheus text, or OpenMetrics when asked);
                        ?slice=i/N, ?endpoint=<id>, ?engine=<n>, ?name[]=
    GET /snapshot       the same as JSON, with rates and quantiles over a recent window
    GET /history        the fleet's last minutes as the live page charts them (from memory)
    GET /load           every engine's load for routers (refreshed, ETag / If-None-Match -> 304)
    GET /endpoints      every endpoint and its engines' states
    GET /get_load       one endpoint's load as vllm-router polls it (?endpoint=<id>)
    GET /v1/loads       SGLang's model gateway's load document, by rank (?endpoint=<id>)
    GET /loads          the same over every endpoint of the fleet
    GET /pool           the pool's averages, in llm-d-router's multi-cluster families
    GET /watch          every change of every engine's load, pushed (a stream or a long poll)
    GET /healthz        200 when Redis answers, 503 with the reason otherwise
    GET /namespaces     the namespaces served (one, or several: ?namespace= on every path)
    GET /               the live page

Each path is a view module of :mod:`redis_stats.server.views` (the route table is
:data:`redis_stats.server.routes.ROUTES`); the HTTP machinery (one deadline per request, a bound on
connections, gzip, ``HEAD``, TLS) is :mod:`redis_stats.server.http`; who may read which path
(off by default: TLS, basic auth, bearer tokens, client certificates, from the Prometheus
exporter-toolkit's web configuration file) is :mod:`redis_stats.server.access`. Every answer is a
function of the store's state, so any number of exporters over one store give the same
(``/load``'s ``seq`` and ``ETag``, the endpoint views): run several behind one Service
(docs/kubernetes.md, "Running it highly available"). ``/history`` alone is the process's own
record of what it read.

Run it standalone (``redis-stats exporter``) or inside any process (:class:`Exporter`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from redis_stats.background import survive, survived
from redis_stats.errors import error_kind
from redis_stats.reader import StatsReader
from redis_stats.server.app import App
from redis_stats.server.emptiness import EmptyWatch
from redis_stats.server.http import Server
from redis_stats.server.options import ServeOptions
from redis_stats.server.routes import ROUTES
from redis_stats.server.states.sampler import window_of

__all__ = ["Exporter"]

log = logging.getLogger("redis_stats.exporter")

UPKEEP_EVERY = 10.0
"""Seconds between two sweeps of what the exporter keeps (entries idle past a minute go)."""


class Exporter:
    """Serves the views of *reader*'s store on *port* (``0``: a free one, see :attr:`port`).

    The settings are :class:`~redis_stats.server.options.ServeOptions`' (by the same names, or
    one *options*): *engines* or *slice* serve part of one namespace; *namespaces* or
    *all_namespaces* several; *request_timeout* bounds a connection's request and each write of
    its answer; at most *max_connections* are served at once (more get ``503`` with
    ``Retry-After: 1``), and apart from them at most *max_streams* streams and long polls
    (``/watch``: more get ``503``); *gc_interval* > 0 runs retention (``redis_stats.ops.retention``) that
    often; *self_metrics* adds the exporter's own process and views to ``/metrics``;
    *web_config_file*, *web_token_file*, *web_open* and *insecure_private_views* set its access
    control (:mod:`redis_stats.server.access`; :class:`~redis_stats.errors.WebConfigError` when it
    cannot be used).
    """

    def __init__(self, reader: StatsReader, options: ServeOptions | None = None, **settings: Any) -> None:
        if options is not None and settings:
            raise ValueError(f"give options= or settings ({', '.join(settings)}), not both")
        self.options = options if options is not None else ServeOptions(**settings)
        self.reader = reader
        self.app = App(reader, self.options, ROUTES)
        try:
            self._server = Server(
                (self.options.host, self.options.port),
                self.app,
                max_connections=self.options.max_connections,
                max_streams=self.options.max_streams,
                request_timeout=self.options.request_timeout,
                guard=self.app.gate if self.app.gate.enabled else None,
            )
        except BaseException:
            self.app.close()
            raise
        self.app.refused = lambda: self._server.refused
        self.app.streams = lambda: (self._server.streams_open, self._server.streams_refused)
        self._thread: threading.Thread | None = None
        self._serving = False  # serve_forever() runs (or is about to): close() must shut it down
        self._stop = threading.Event()

    @property
    def port(self) -> int:
        """The TCP port served."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Base URL of the server."""
        host = self._server.server_address[0]
        if isinstance(host, bytes):  # typeshed's type for any family; AF_INET gives str
            host = host.decode()
        return f"{'https' if self.app.gate.tls else 'http'}://{host}:{self.port}"

    def reload_web_config(self) -> bool:
        """Read the access control's files again now (``SIGHUP``; a change is also picked up by
        itself within a second): True when taken, False when refused (logged; the configuration
        in force kept)."""
        return self.app.gate.reload()

    def start(self) -> Exporter:
        """Serve from a daemon thread."""
        self._serving = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="redis_stats-exporter", daemon=True
        )
        self._thread.start()
        self._start_upkeep()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread (until :meth:`close` from another thread, or Ctrl-C)."""
        self._start_upkeep()
        self._serving = True
        self._server.serve_forever()

    def close(self) -> None:
        """Stop serving, the upkeep, and every namespace's background reads; also fine before
        :meth:`start`."""
        self._stop.set()
        if self._serving:
            # socketserver's shutdown() waits for serve_forever() to end: called on a server that
            # never served, it would wait for ever.
            self._server.shutdown()
        self._server.server_close()
        self.app.close()

    # -- upkeep: what is kept, and retention ------------------------------------------------

    def _start_upkeep(self) -> None:
        threading.Thread(target=self._sweep_loop, name="redis_stats-kept", daemon=True).start()
        if self.app.gate.enabled:  # the access control's files, read again when they change
            threading.Thread(
                target=self.app.gate.watch, args=(self._stop,), name="redis_stats-web-config", daemon=True
            ).start()
        # The live page's window measured from the exporter's start (an exporter of one namespace
        # with the page's figures): a page opened in its first minute has rates from its first
        # poll. Nobody asking, the sampler stops after a minute, as after any last request.
        if not self.options.several and self.options.history:
            window_of(self.app.sources.one(None)).asked()
        # Retention on a timer: every exporter may run it; the gc lease lets one collect at a time.
        if self.options.gc_interval > 0:
            threading.Thread(target=self._gc_loop, name="redis_stats-gc", daemon=True).start()

    def _sweep_loop(self) -> None:
        # An exporter of one namespace says when it holds nothing. One of several reads a
        # namespace only when asked for it (server/namespaces.py): there the whole /metrics says
        # it (redis_stats_namespace_empty{redis_stats_namespace}), and the alert on it.
        told = [] if self.options.several else [self.reader.config.namespace]
        empty = EmptyWatch(self.reader, told)
        with survive("kept", log):
            empty.check()  # at start: a misspelt namespace is said at once
        while not self._stop.wait(UPKEEP_EVERY):
            with survive("kept", log):
                self.app.kept.sweep()
                empty.check()

    def _gc_loop(self) -> None:
        while not self._stop.wait(self.options.gc_interval):
            # Every namespace served, asked for or not: retention is the store's upkeep.
            with survive("gc", log):  # the list of namespaces (a SCAN) handles its own failures
                for namespace in self.app.sources.served():
                    if self._stop.is_set():
                        break
                    self._collect_once(namespace)

    def _collect_once(self, namespace: str) -> None:
        """One round of retention of *namespace*: a failure costs this round only."""
        from redis_stats.ops.retention import collect_garbage

        try:
            result = collect_garbage(self.reader.config.replace(namespace=namespace))
            for prefix, why in result.failed.items():
                log.warning("gc could not collect keys %s* of the namespace: %s", prefix, why)
            if result.engines or result.writers:
                log.info(
                    "gc removed engines %s and %d writers past retention", result.engines, len(result.writers)
                )
        except Exception as exc:  # Redis away: the next round tries again; anything else counted
            if error_kind(exc) != "other":
                log.debug("gc round failed: %s", exc)
            else:
                survived("gc", exc, log)
