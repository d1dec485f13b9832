"""One exporter for every model: which namespaces it serves, and one view of each, made when asked.

``redis-stats exporter --namespace A --namespace B`` serves those namespaces, ``--all-namespaces``
every namespace this Redis holds (:func:`redis_stats.ops.namespaces.find_namespaces`: one ``SCAN``
of ``rs:{*}:*``, again at most every :data:`DISCOVER_EVERY` seconds, and only when a request
needs the list), at most *limit* of them (:data:`MAX_NAMESPACES` by default; the first in sorted
order, the others named in the exporter's log and counted in
``redis_stats_exporter_namespaces{state="over_limit"}``).

Each namespace is served by a view of its own (for the exporter, an ``Exporter`` without a socket:
the same code that serves a one-namespace exporter, so every path and query parameter means the
same with ``?namespace=`` in front of it). A view is made by the first request that needs it and
dropped :data:`VIEW_IDLE` seconds after its last one, or when its namespace leaves Redis: a
namespace nobody asks for holds no reader, no plan, no window and reads nothing. A view's own
background reads stop by themselves when unused (the ``/load`` refresher after ``load_idle``, the
``/snapshot`` sampler after :data:`~redis_stats.prometheus.exporter.SAMPLER_IDLE`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar
from urllib.parse import parse_qs

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from redis_stats.config import is_namespace
from redis_stats.errors import error_kind
from redis_stats.ops.namespaces import find_namespaces
from redis_stats.prometheus.collector import RedisCollector
from redis_stats.prometheus.exposition import merge_texts

__all__ = [
    "DISCOVER_EVERY",
    "MAX_NAMESPACES",
    "VIEW_IDLE",
    "AllNamespaces",
    "NamespaceSet",
    "NotServed",
    "namespace_param",
]

log = logging.getLogger("redis_stats.exporter")

MAX_NAMESPACES = 64
"""The most namespaces one exporter serves by default (``--max-namespaces``): each asked for holds
a reader and its caches (a few MB at 64 vLLM engines, docs/operations.md "Sizing")."""

DISCOVER_EVERY = 30.0
"""Seconds a list of the namespaces found in Redis (``--all-namespaces``) is used before a request
that needs it scans again: a namespace appears on the whole ``/metrics`` within this long."""

REDISCOVER_UNKNOWN = 5.0
"""A ``?namespace=`` not in the list scans again if the last scan is older than this (a model just
deployed is served at once), and no sooner: a client asking for names that do not exist cannot
make the exporter scan Redis per request."""

VIEW_IDLE = 600.0
"""Seconds after its last request that a namespace's view is dropped (made again when asked)."""


class NotServed(LookupError):
    """A ``?namespace=`` this exporter does not serve (HTTP 404, the message says why)."""


def namespace_param(query: str) -> str | None:
    """The ``namespace`` parameter of a query string (None when absent); ValueError for one given
    twice or that is no namespace name."""
    found = parse_qs(query, keep_blank_values=True).get("namespace", [])
    if len(found) > 1:
        raise ValueError(f"namespace given {len(found)} times ({found}); give one")
    if not found:
        return None
    if not is_namespace(found[0]):
        raise ValueError(
            f"namespace {found[0][:140]!r} is not a namespace name (1 to 128 of A-Z a-z 0-9 . _ - / :); "
            "GET /namespaces lists the ones served"
        )
    return found[0]


class _View(Protocol):
    def close(self) -> None: ...


V = TypeVar("V", bound=_View)


class NamespaceSet(Generic[V]):
    """The namespaces an exporter serves and the view of each (thread-safe).

    *names*: the namespaces given (served whether or not they hold anything yet, as a
    one-namespace exporter serves its own), or None for every namespace *client*'s Redis holds,
    found again at most every *discover_every* seconds. *make* builds a namespace's view; at most
    *limit* namespaces are served.
    """

    def __init__(
        self,
        client: object,
        names: Sequence[str] | None,
        make: Callable[[str], V],
        *,
        limit: int = MAX_NAMESPACES,
        discover_every: float = DISCOVER_EVERY,
        idle: float = VIEW_IDLE,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_namespaces={limit!r} must be a whole number >= 1")
        if names is not None:
            bad = [n for n in names if not is_namespace(n)]
            if bad:
                raise ValueError(
                    f"namespaces {bad!r}: not namespace names (1 to 128 of A-Z a-z 0-9 . _ - / :)"
                )
            names = sorted(set(names))
            if len(names) > limit:
                raise ValueError(
                    f"{len(names)} namespaces given, more than max_namespaces={limit}: give fewer, or a "
                    "larger --max-namespaces"
                )
        self.client = client
        self.every = names is None
        self.limit = limit
        self.discover_every = discover_every
        self.idle = idle
        self._make = make
        self._lock = threading.Lock()  # the lists and views below
        self._scanning = threading.Lock()  # one SCAN at a time
        self._served: list[str] = list(names or [])
        self._over: list[str] = []
        self._scanned = -float("inf")  # monotonic time of the last scan that succeeded or failed
        self._views: dict[str, tuple[V, float]] = {}
        self._errors: Counter[str] = Counter()
        self._clashes: Counter[str] = Counter()
        self._closed = False

    def served(self) -> list[str]:
        """The namespaces served now (sorted), scanning Redis first when the list is due."""
        if self.every and time.monotonic() - self._scanned >= self.discover_every:
            self._discover()
        return list(self._served)

    def known(self) -> list[str]:
        """The namespaces served as of the last scan (no scan)."""
        return list(self._served)

    def view(self, namespace: str) -> V:
        """The view of *namespace* (made when it has none); :class:`NotServed` when it is not
        served, with the reason."""
        if namespace not in self._served and self.every:
            if time.monotonic() - self._scanned >= min(self.discover_every, REDISCOVER_UNKNOWN):
                self._discover()
        if namespace not in self._served:
            raise NotServed(self._why_not(namespace))
        return self._get(namespace)

    def views(self) -> list[tuple[str, V]]:
        """Every served namespace with its view (made when missing), sorted by name."""
        return [(ns, self._get(ns)) for ns in self.served()]

    def _get(self, namespace: str) -> V:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise NotServed("the exporter is closing")
            found = self._views.get(namespace)
            made = found[0] if found is not None else self._make(namespace)
            self._views[namespace] = (made, now)
            gone = [
                ns
                for ns, (_, used) in self._views.items()
                if ns not in self._served or now - used > self.idle
            ]
            dropped = [self._views.pop(ns)[0] for ns in gone]
        for view in dropped:  # outside the lock: a view's close joins nothing, but takes its own locks
            view.close()
        return made

    def _why_not(self, namespace: str) -> str:
        if namespace in self._over:
            return (
                f"namespace {namespace!r} is one of {len(self._over)} past this exporter's "
                f"max_namespaces={self.limit} (--max-namespaces): serve fewer, or raise it"
            )
        if self.every:
            return (
                f"namespace {namespace!r} holds nothing in this Redis (found at the last scan, "
                f"{time.monotonic() - self._scanned:.0f} s ago): GET /namespaces lists the ones served"
            )
        return f"this exporter serves namespaces {self._served} (--namespace), not {namespace!r}"

    def _discover(self) -> None:
        with self._scanning:
            if time.monotonic() - self._scanned < min(self.discover_every, REDISCOVER_UNKNOWN):
                return  # another request just scanned
            try:
                found = find_namespaces(self.client)
            except Exception as exc:  # the list stays as it was; the next due request tries again
                self._errors[error_kind(exc)] += 1
                log.warning("listing the namespaces of Redis failed (%s: %s)", error_kind(exc), exc)
                self._scanned = time.monotonic()
                return
            served, over = found[: self.limit], found[self.limit :]
            if over and over != self._over:
                log.warning(
                    "%d namespaces found, more than max_namespaces=%d: not serving %s",
                    len(found),
                    self.limit,
                    ", ".join(over[:20]) + (" ..." if len(over) > 20 else ""),
                )
            with self._lock:
                self._served, self._over = served, over
            self._scanned = time.monotonic()

    def clashed(self, names: list[str]) -> None:
        """Count families a namespace declared with another type than an earlier one's (left out)."""
        for name in names:
            if not self._clashes[name]:
                log.warning(
                    "family %s has another type in one namespace than in another: left out of the "
                    "namespace that declares it second (it would merge two types in one family)",
                    name,
                )
            self._clashes[name] += 1

    def describe(self) -> list[Metric]:
        """Nothing ahead (registering must stay cheap)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """``redis_stats_exporter_namespaces{state}``, ``..._namespace_views``, and the failed
        scans and family clashes: the exporter's own figures, with its process's."""
        states = GaugeMetricFamily(
            "redis_stats_exporter_namespaces",
            "Namespaces this exporter serves, and those found past --max-namespaces (not served).",
            labels=["state"],
        )
        states.add_metric(["served"], float(len(self._served)))
        states.add_metric(["over_limit"], float(len(self._over)))
        yield states
        views = GaugeMetricFamily(
            "redis_stats_exporter_namespace_views",
            "Namespaces with a view made now (asked for within the view idle time).",
        )
        views.add_metric([], float(len(self._views)))
        yield views
        errors = CounterMetricFamily(
            "redis_stats_exporter_namespace_scan_errors",
            "Scans of Redis for its namespaces (--all-namespaces) that failed, by kind.",
            labels=["kind"],
        )
        for kind, n in sorted(self._errors.items()):
            errors.add_metric([kind], float(n))
        yield errors
        clashes = CounterMetricFamily(
            "redis_stats_exporter_family_type_clashes",
            "Families left out of a namespace's series on the whole /metrics: another namespace "
            "declares the same name with another type.",
            labels=["family"],
        )
        for name, n in sorted(self._clashes.items()):
            clashes.add_metric([name], float(n))
        yield clashes

    def close(self) -> None:
        """Close every view (and make no more)."""
        with self._lock:
            self._closed = True
            views, self._views = [v for v, _ in self._views.values()], {}
        for view in views:
            view.close()


class AllNamespaces:
    """The whole ``/metrics`` of an exporter of several namespaces: every namespace's collector
    (each labelling its series with its ``redis_stats_namespace``), as one collector with
    :class:`RedisCollector`'s two outputs. Each family once: two namespaces' series of one family
    under one ``# HELP``/``# TYPE``."""

    def __init__(self, collectors: list[RedisCollector], clashed: Callable[[list[str]], None]) -> None:
        self.collectors = collectors
        self._clashed = clashed

    def render_text(self) -> str:
        """Every namespace's text (one read each, in turn), merged by family."""
        text, clashes = merge_texts([c.render_text() for c in self.collectors])
        if clashes:
            self._clashed(clashes)
        return text

    def collect(self) -> Iterator[Metric]:
        """Every namespace's families, merged by name (for prometheus_client's writers)."""
        merged: dict[str, Metric] = {}
        clashes = []
        for collector in self.collectors:
            for family in collector.collect():
                found = merged.get(family.name)  # (prometheus_client's name: a counter's without _total)
                if found is None:
                    merged[family.name] = family
                elif found.type != family.type:
                    clashes.append(family.name)
                else:
                    found.samples += family.samples
        if clashes:
            self._clashed(clashes)
        yield from merged.values()
