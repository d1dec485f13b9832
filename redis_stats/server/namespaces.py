"""Which namespaces an exporter serves, and the :class:`~redis_stats.server.source.Source` of each.

An exporter serves one namespace (its reader's), or several: ``redis-stats exporter --namespace A
--namespace B`` those, ``--all-namespaces`` every namespace this Redis holds
(:func:`redis_stats.ops.namespaces.scan_namespaces`: one ``SCAN`` of ``rs:{*}:*``, again at most
every :data:`DISCOVER_EVERY` seconds and only when a request needs the list), at most
*max_namespaces* of them (the first in sorted order; the others named in the log and counted in
``redis_stats_exporter_namespaces{state="over_limit"}``). A key prefix in Redis that is no
namespace name this version accepts (``rs:{a b}:...``: a space) is not served, never fails a
view, and is counted (``state="unusable"``).

``?namespace=NS`` picks a source; without it an exporter of one namespace answers with its own,
and one of several with all of them where a view can (the whole ``/metrics``), else a ``400``.
A source is made by the first request that needs it and dropped :data:`SOURCE_IDLE` seconds
after its last one, or when its namespace leaves Redis: a namespace nobody asks for holds no
reader and reads nothing.
"""

from __future__ import annotations

import difflib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from redis_stats.config import is_namespace
from redis_stats.errors import error_kind
from redis_stats.ops.namespaces import scan_namespaces
from redis_stats.reader import StatsReader
from redis_stats.server.http import HTTPError
from redis_stats.server.kept import Kept
from redis_stats.server.options import ServeOptions
from redis_stats.server.source import Source

__all__ = ["DISCOVER_EVERY", "REDISCOVER_UNKNOWN", "SOURCE_IDLE", "Sources"]

log = logging.getLogger("redis_stats.exporter")

DISCOVER_EVERY = 30.0
"""Seconds a list of the namespaces found in Redis (``--all-namespaces``) is used before a request
that needs it scans again: a namespace appears on the whole ``/metrics`` within this long."""

REDISCOVER_UNKNOWN = 5.0
"""A ``?namespace=`` not in the list scans again if the last scan is older than this (a model just
deployed is served at once), and no sooner: a client asking for names that do not exist cannot
make the exporter scan Redis per request."""

SOURCE_IDLE = 600.0
"""Seconds after its last request that a namespace's source is dropped (made again when asked)."""


class Sources:
    """The namespaces an exporter serves and the source of each (thread-safe).

    *reader* reads the exporter's own namespace; with *options* of several namespaces, its client
    and catalogue read every other.
    """

    def __init__(
        self,
        reader: StatsReader,
        options: ServeOptions,
        kept: Kept,
        building: Any,
        *,
        discover_every: float = DISCOVER_EVERY,
        idle: float = SOURCE_IDLE,
    ) -> None:
        self.reader = reader
        self.options = options
        self.kept = kept
        self.building = building
        self.several = options.several
        self.every = options.all_namespaces
        self.limit = options.max_namespaces
        self.discover_every = discover_every
        self.idle = idle
        self._lock = threading.Lock()  # the lists and sources below
        self._scanning = threading.Lock()  # one SCAN at a time
        own = reader.config.namespace
        self._served: list[str] = sorted(set(options.namespaces or ())) if self.several else [own]
        self._over: list[str] = []
        self._unusable: list[str] = []
        self._scanned = -float("inf")  # monotonic time of the last scan that succeeded or failed
        self._sources: dict[str, tuple[Source, float]] = {}
        if not self.several:  # the one source is made now and never idles out
            self._sources[own] = (Source(reader, options, kept, building, labelled=False), float("inf"))
        self._errors: Counter[str] = Counter()
        self._closed = False

    # -- which namespaces -------------------------------------------------------------------

    def served(self) -> list[str]:
        """The namespaces served now (sorted), scanning Redis first when the list is due."""
        if self.every and time.monotonic() - self._scanned >= self.discover_every:
            self._discover()
        return list(self._served)

    def known(self) -> list[str]:
        """The namespaces served as of the last scan (no scan)."""
        return list(self._served)

    def document(self) -> dict[str, object]:
        """What ``/namespaces`` says: the namespaces served, and whether this exporter serves
        several (then each is picked with ``?namespace=``)."""
        if not self.several:
            return {"namespaces": self.served(), "several": False}
        return {"namespaces": self.served(), "several": True, "all": self.every, "max_namespaces": self.limit}

    # -- one source ---------------------------------------------------------------------------

    def one(self, namespace: str | None) -> Source:
        """The source of *namespace* (None: the exporter's one namespace); a ``404`` for one not
        served, a ``400`` for none given to an exporter of several."""
        if namespace is None:
            if self.several:
                raise HTTPError(
                    400,
                    "this exporter serves several namespaces: give ?namespace=NS "
                    "(GET /namespaces lists them)",
                )
            return self._get(self.reader.config.namespace)
        if namespace not in self._served and self.every:
            if time.monotonic() - self._scanned >= min(self.discover_every, REDISCOVER_UNKNOWN):
                self._discover()
        if namespace not in self._served:
            raise HTTPError(404, self._why_not(namespace))
        return self._get(namespace)

    def all(self) -> list[Source]:
        """Every served namespace's source (made when missing), sorted by namespace. A namespace
        whose source cannot be made is left out (logged, counted): never the others' loss."""
        out = []
        for namespace in self.served():
            try:
                out.append(self._get(namespace))
            except HTTPError:
                raise
            except Exception as exc:
                self._errors[error_kind(exc)] += 1
                log.warning("namespace %r cannot be served: %s", namespace, exc)
        return out

    def _get(self, namespace: str) -> Source:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise HTTPError(503, "the exporter is closing")
            found = self._sources.get(namespace)
            if found is None:
                made = self._make(namespace)
                self._sources[namespace] = (made, now)
            else:
                made = found[0]
                self._sources[namespace] = (made, max(found[1], now))
            gone = [
                ns
                for ns, (_, used) in self._sources.items()
                if ns not in self._served or now - used > self.idle
            ]
            dropped = [self._sources.pop(ns)[0] for ns in gone]
        for source in dropped:  # outside the lock: a source's close takes its own locks
            source.close()
        return made

    def _make(self, namespace: str) -> Source:
        """A source of *namespace* on the exporter's client and catalogue, its own reader."""
        config = self.reader.config.replace(namespace=namespace)
        reader = StatsReader(config, self.reader.catalog, client=self.reader.client)
        return Source(reader, self.options, self.kept, self.building, labelled=True)

    def _why_not(self, namespace: str) -> str:
        if not self.several:
            own = self.reader.config.namespace
            return (
                f"this exporter serves namespace {own!r} only, not {namespace!r} (an exporter of "
                "several: redis-stats exporter --namespace A --namespace B, or --all-namespaces)"
            )
        if namespace in self._over:
            return (
                f"namespace {namespace!r} is one of {len(self._over)} past this exporter's "
                f"max_namespaces={self.limit} (--max-namespaces): serve fewer, or raise it"
            )
        if self.every:
            return (
                f"namespace {namespace!r} holds nothing in this Redis (found at the last scan, "
                f"{time.monotonic() - self._scanned:.0f} s ago){self._closest(namespace)}: GET "
                "/namespaces lists the ones served"
            )
        closest = self._closest(namespace)
        return f"this exporter serves namespaces {self._served} (--namespace), not {namespace!r}{closest}"

    def _closest(self, namespace: str) -> str:
        """``; did you mean 'llama'?`` for the served namespace whose name is closest (``""``: none
        is close)."""
        close = difflib.get_close_matches(namespace, self._served, n=1, cutoff=0.6)
        return f"; did you mean {close[0]!r}?" if close else ""

    def _discover(self) -> None:
        with self._scanning:
            if time.monotonic() - self._scanned < min(self.discover_every, REDISCOVER_UNKNOWN):
                return  # another request just scanned
            try:
                scan = scan_namespaces(self.reader.client)
            except Exception as exc:  # the list stays as it was; the next due request tries again
                self._errors[error_kind(exc)] += 1
                log.warning("listing the namespaces of Redis failed (%s: %s)", error_kind(exc), exc)
                self._scanned = time.monotonic()
                return
            found = sorted(scan.current | scan.older)
            served, over = found[: self.limit], found[self.limit :]
            if over and over != self._over:
                log.warning(
                    "%d namespaces found, more than max_namespaces=%d: not serving %s",
                    len(found),
                    self.limit,
                    ", ".join(over[:20]) + (" ..." if len(over) > 20 else ""),
                )
            unusable = sorted(scan.unusable)
            if unusable and unusable != self._unusable:
                log.warning(
                    "keys of %d prefixes rs:{...} that are no namespace name are not served: %s",
                    len(unusable),
                    ", ".join(repr(n) for n in unusable[:20]),
                )
            with self._lock:
                self._served, self._over, self._unusable = served, over, unusable
            self._scanned = time.monotonic()

    # -- self-metrics and closing ---------------------------------------------------------------

    def describe(self) -> list[Metric]:
        """Nothing ahead (registering must stay cheap)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """``redis_stats_exporter_namespaces{state}``, ``..._namespace_views`` and the failed
        scans: the exporter's own figures (of an exporter of several)."""
        if not self.several:
            return
        states = GaugeMetricFamily(
            "redis_stats_exporter_namespaces",
            "Namespaces this exporter serves; those found past --max-namespaces (not served); key "
            "prefixes rs:{...} that are no namespace name (not served).",
            labels=["state"],
        )
        states.add_metric(["served"], float(len(self._served)))
        states.add_metric(["over_limit"], float(len(self._over)))
        states.add_metric(["unusable"], float(len(self._unusable)))
        yield states
        views = GaugeMetricFamily(
            "redis_stats_exporter_namespace_views",
            "Namespaces with a view made now (asked for within the view idle time).",
        )
        views.add_metric([], float(len(self._sources)))
        yield views
        errors = CounterMetricFamily(
            "redis_stats_exporter_namespace_scan_errors",
            "Scans of Redis for its namespaces (--all-namespaces), or namespaces' views, that "
            "failed, by kind.",
            labels=["kind"],
        )
        for kind, n in sorted(self._errors.items()):
            errors.add_metric([kind], float(n))
        yield errors

    def close(self) -> None:
        """Close every source (and make no more)."""
        with self._lock:
            self._closed = True
            sources, self._sources = [s for s, _ in self._sources.values()], {}
        for source in sources:
            source.close()


def namespace_param(value: str | None) -> str | None:
    """A ``?namespace=`` value checked: a ``400`` naming it when it is no namespace name."""
    if value is not None and not is_namespace(value):
        raise HTTPError(
            400,
            f"namespace {value[:140]!r} is not a namespace name (1 to 128 of A-Z a-z 0-9 . _ - / :); "
            "GET /namespaces lists the ones served",
        )
    return value
