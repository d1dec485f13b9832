"""App: what every view may ask of the server, and the route table it answers by.

A view is a module of :mod:`redis_stats.server.views` with one function ``answer(app, request)``
(:class:`~redis_stats.server.http.Request` in, :class:`~redis_stats.server.http.Response` out, or
an :class:`~redis_stats.server.http.HTTPError`); the route table, given to :class:`App`, is
:data:`redis_stats.server.routes.ROUTES`. A view asks :class:`App` for the namespace the request
names (:meth:`App.source`: a source, a ``400`` or a ``404``), the state it keeps of the whole
server (:meth:`App.state`), the lock of one body at a time and the exporter's own metrics.

Who may read a path is decided here, before any view runs, from the route table's data and the
operator's settings, never in a view: every path is behind the access control
(:class:`~redis_stats.server.access.Gate`) once one is configured, but those the operator opens
(``web_open``: ``/healthz`` for a kubelet's probe, ``/metrics``...); a :class:`Route` marked
``private`` (business data: per-tenant usage) is never served without credentials unless the
operator says ``insecure_private_views``: an exporter asked to serve one without either refuses to
start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from redis_stats.errors import WebConfigError
from redis_stats.reader import StatsReader
from redis_stats.server.access import Gate
from redis_stats.server.http import HTTPError, Request, Response
from redis_stats.server.kept import Kept
from redis_stats.server.namespaces import Sources, namespace_param
from redis_stats.server.options import ServeOptions
from redis_stats.server.own import own_registry
from redis_stats.server.source import Source

__all__ = ["App", "Route", "View"]

View = Callable[["App", Request], Response]
"""A view: the answer to a request (:mod:`redis_stats.server.routes` says which path each answers)."""

S = TypeVar("S")


@dataclass(frozen=True)
class Route:
    """A path's view and what it serves. *private*: business data (per-tenant usage), never served
    without credentials unless the operator says ``insecure_private_views`` (True, or a function of
    the options: ``/metrics`` is private when it carries the top tenants). *writes*: the route
    changes the store, answered to ``POST`` only (every other route to ``GET`` and ``HEAD``
    only). A plain view in the route table is a route that is not private and reads."""

    view: View
    private: bool | Callable[[ServeOptions], bool] = False
    writes: bool = False

    def is_private(self, options: ServeOptions) -> bool:
        """Whether the route serves business data with these *options*."""
        return self.private(options) if callable(self.private) else self.private


def _route(entry: View | Route) -> Route:
    return entry if isinstance(entry, Route) else Route(entry)


class App:
    """What the views of one exporter share: its namespaces (:attr:`sources`), what it keeps per
    request parameter (:attr:`kept`, bounded by *options*' ``view_budget``), the states views keep
    of the whole server, and its own metrics (with *options*' ``self_metrics``); *routes* says
    which view answers each path (a view, or a :class:`Route` saying more of it). Its access control
    (:attr:`gate`) is read from *options*' files first: :class:`WebConfigError` when it cannot be
    used, or when a private route would be served without credentials."""

    def __init__(
        self, reader: StatsReader, options: ServeOptions, routes: Mapping[str, View | Route]
    ) -> None:
        self.options = options
        self.routes = {path: _route(entry) for path, entry in routes.items()}
        self.gate = Gate(options.web_config_file, options.web_token_file)
        self.open = self._open_paths()
        self.kept = Kept(options.view_budget, idle=options.view_idle)
        self.building = threading.Lock()  # one body at a time in the process (Source.building)
        self.sources = Sources(reader, options, self.kept, self.building)
        self.refused: Callable[[], int] = lambda: 0  # connections the server refused (set by it)
        self.streams: Callable[[], tuple[int, int]] = lambda: (0, 0)  # streams open, refused (set by it)
        self._states: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self.own_registry: CollectorRegistry | None = None
        if options.self_metrics:
            self.own_registry = own_registry(
                [self.sources, self.kept, self.gate],
                lambda: list(self._states.values()),
                lambda: self.refused(),
                lambda: self.streams(),
            )

    def _open_paths(self) -> frozenset[str]:
        """The paths served without credentials (``web_open``), checked against the route table;
        a private route served without credentials refused unless the operator said so."""
        options = self.options
        unknown = [p for p in options.web_open if p not in self.routes]
        if unknown:
            raise WebConfigError(
                "web_open",
                f"web_open {unknown}: no such path; paths: {', '.join(sorted(self.routes))}",
            )
        private = sorted(p for p, route in self.routes.items() if route.is_private(options))
        if private and not options.insecure_private_views:
            opened = [p for p in private if p in options.web_open]
            if opened:
                raise WebConfigError(
                    "web_open",
                    f"web_open {opened}: business data (per-tenant usage) cannot be opened; serve it "
                    "with credentials, or say insecure_private_views (--insecure-private-views) to "
                    "let anyone who reaches the port read it",
                )
            if not self.gate.authenticates:
                raise WebConfigError(
                    "web_config_file",
                    f"{', '.join(private)} serve business data (per-tenant usage) and no access control "
                    "is configured: give a web configuration file with basic_auth_users or client "
                    "certificates (--web-config-file) or a bearer token file (--web-token-file); or "
                    "say insecure_private_views (--insecure-private-views) to serve it to anyone who "
                    "reaches the port",
                )
            self.gate.keep_authenticating = True
        return frozenset(options.web_open)

    def __call__(self, request: Request) -> Response:
        """The answer of the view of *request*'s path, once the gate let it through (a ``404``
        listing the paths, to a client allowed the protected ones)."""
        route = self.routes.get(request.path)
        if request.path not in self.open:
            denied = self.gate.check(request)
            if denied is not None:
                return denied
        if route is None:
            raise HTTPError(404, "not found", paths=list(self.routes))
        if (request.method == "POST") != route.writes:
            allowed = "POST" if route.writes else "GET, HEAD"
            raise HTTPError(405, f"{request.path} answers {allowed}, not {request.method}", allow=allowed)
        return route.view(self, request)

    def source(self, request: Request) -> Source:
        """The source of the request's ``?namespace=`` (without it, the exporter's one namespace;
        a ``400`` from an exporter of several)."""
        namespace = namespace_param(request.one("namespace"))
        if namespace is None and self.sources.several:
            raise HTTPError(
                400,
                f"{request.path} is one namespace's: this exporter serves several, give "
                "?namespace=NS (GET /namespaces lists them)",
            )
        return self.sources.one(namespace)

    def state(self, kind: Callable[[App], S]) -> S:
        """The state *kind* keeps of the whole server, made with ``kind(self)`` at first use."""
        found = self._states.get(kind)
        if found is None:
            made = kind(self)  # outside the lock: a state may ask for another one as it is made
            with self._lock:
                found = self._states.setdefault(kind, made)
            if found is not made:
                made.close()  # type: ignore[attr-defined]
        return found

    def close(self) -> None:
        """Close every namespace's source and what is kept."""
        self.sources.close()
        self.kept.close()
        with self._lock:
            states, self._states = list(self._states.values()), {}
        for state in states:
            state.close()
