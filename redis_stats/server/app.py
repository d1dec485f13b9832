"""App: what every view may ask of the server, and the route table it answers by.

A view is a module of :mod:`redis_stats.server.views` with one function ``answer(app, request)``
(:class:`~redis_stats.server.http.Request` in, :class:`~redis_stats.server.http.Response` out, or
an :class:`~redis_stats.server.http.HTTPError`); the route table, given to :class:`App`, is
:data:`redis_stats.server.routes.ROUTES`. A view asks :class:`App` for the namespace the request
names (:meth:`App.source`: a source, a ``400`` or a ``404``), the state it keeps of the whole
server (:meth:`App.state`), the lock of one body at a time and the exporter's own metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from redis_stats.reader import StatsReader
from redis_stats.server.http import HTTPError, Request, Response
from redis_stats.server.kept import Kept
from redis_stats.server.namespaces import Sources, namespace_param
from redis_stats.server.options import ServeOptions
from redis_stats.server.own import own_registry
from redis_stats.server.source import Source

__all__ = ["App", "View"]

View = Callable[["App", Request], Response]
"""A view: the answer to a request (:mod:`redis_stats.server.routes` says which path each answers)."""

S = TypeVar("S")


class App:
    """What the views of one exporter share: its namespaces (:attr:`sources`), what it keeps per
    request parameter (:attr:`kept`, bounded by *options*' ``view_budget``), the states views keep
    of the whole server, and its own metrics (with *options*' ``self_metrics``); *routes* says
    which view answers each path."""

    def __init__(self, reader: StatsReader, options: ServeOptions, routes: Mapping[str, View]) -> None:
        self.options = options
        self.routes = routes
        self.kept = Kept(options.view_budget, idle=options.view_idle)
        self.building = threading.Lock()  # one body at a time in the process (Source.building)
        self.sources = Sources(reader, options, self.kept, self.building)
        self.refused: Callable[[], int] = lambda: 0  # connections the server refused (set by it)
        self._states: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self.own_registry: CollectorRegistry | None = None
        if options.self_metrics:
            self.own_registry = own_registry(
                [self.sources, self.kept], lambda: list(self._states.values()), lambda: self.refused()
            )

    def __call__(self, request: Request) -> Response:
        """The answer of the view of *request*'s path (a ``404`` listing the paths)."""
        view = self.routes.get(request.path)
        if view is None:
            raise HTTPError(404, "not found", paths=list(self.routes))
        return view(self, request)

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
