"""Source: one namespace as the views read it, and what each view keeps of it.

A view is a function of a source and a request (:mod:`redis_stats.server.views`). The source holds
the namespace's reader (its Redis client, catalogue, plans and caches), the collector of its
whole ``/metrics``, and, made at first use, the state a view keeps per namespace (the ``/load``
feed, the ``/snapshot`` window, the endpoint map): :meth:`Source.state` makes it with the view's
own class, so the source knows no view. What a view keeps per request parameter (a slice's
reader, an endpoint's renderer) goes in the server's :class:`~redis_stats.server.kept.Kept`,
bounded in bytes: :meth:`Source.kept`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

from redis_stats.prometheus.collector import NAMESPACE_LABEL, RedisCollector
from redis_stats.reader import StatsReader
from redis_stats.server.kept import Kept, KeptEntry
from redis_stats.server.options import ServeOptions

__all__ = ["Source", "ViewState"]


class ViewState(Protocol):
    """A view's state of one namespace: made with the source, closed with it."""

    def close(self) -> None:
        """Stop what it runs (a refresher, a sampler)."""
        ...


S = TypeVar("S", bound=ViewState)
E = TypeVar("E", bound=KeptEntry)


class Source:
    """One namespace of an exporter: *reader* reads it; *building* is the process's lock of one
    body at a time; *labelled* when the exporter serves several (every series then carries
    ``redis_stats_namespace``)."""

    def __init__(
        self, reader: StatsReader, options: ServeOptions, kept: Kept, building: Any, *, labelled: bool
    ) -> None:
        self.reader = reader
        # One body (a /metrics text, a /snapshot document, a window sample) is built at a time in
        # the process. Its read, decode and rendering are Python under the GIL: several at once
        # finish no sooner in all, but each holds its read, its decoded form and its text at the
        # same time (at a thousand engines, tens of MB each: four slice scrapes, a whole /metrics
        # and the page's poll together took the process past its limit). Serving a built body is
        # not held.
        self.building = building
        self.options = options
        self.namespace = reader.config.namespace
        self.labels = {NAMESPACE_LABEL: self.namespace} if labelled else {}
        # Engines of the namespace served (None: all; a one-namespace exporter's --engines/--slice).
        self.part = None if labelled else options.part
        whole_writers = options.slice is None or options.slice.index == 0
        self.collector = RedisCollector(
            reader, engines=self.part, writers=whole_writers, namespace_label=labelled
        )
        self._kept = kept
        self._states: dict[type[Any], Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    def new_reader(self) -> StatsReader:
        """Another reader of this namespace on the same client and catalogue: its own plans and
        caches (a view whose reads would otherwise replace the whole scrape's plan)."""
        return StatsReader(self.reader.config, self.reader.catalog, client=self.reader.client)

    def state(self, kind: Callable[[Source], S]) -> S:
        """The state *kind* keeps of this namespace, made with ``kind(self)`` at first use."""
        found = self._states.get(kind)  # type: ignore[call-overload]
        if found is not None:
            return found  # type: ignore[no-any-return]
        made = kind(self)  # outside the lock: a state may ask for another one as it is made
        with self._lock:
            found = self._states.get(kind)  # type: ignore[call-overload]
            if found is None and not self._closed:
                self._states[kind] = found = made  # type: ignore[index]
        if found is not made:  # another request made it first, or the source closed: not kept
            made.close()
        return found if found is not None else made

    def kept(self, kind: str, key: Hashable, make: Callable[[], E]) -> E:
        """The server's kept *kind* entry of this namespace for *key* (bounded in bytes, dropped
        when idle), made by *make* when there is none."""
        return self._kept.get((kind, self.namespace, key), make)

    def close(self) -> None:
        """Close every view's state and drop what the server keeps of this namespace."""
        with self._lock:
            self._closed = True
            states, self._states = list(self._states.values()), {}
        for state in states:
            state.close()
        self._kept.drop(namespace=self.namespace)
