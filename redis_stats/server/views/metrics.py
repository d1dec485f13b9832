"""``GET /metrics``: every engine's series for Prometheus, or part of them.

- no parameter: the namespace's every engine (one Redis read); an exporter of several namespaces
  serves them all, each family once, every series labelled ``redis_stats_namespace``
  (:class:`AllNamespaces`), and ``?namespace=NS`` one of them as an exporter of it alone would;
- ``?slice=i/N``: the engines ``e % N == i`` only, read by Redis' own choice (one exporter scraped
  as N targets; redis_stats/prometheus/filters.py); each slice asked for has a reader of its own,
  kept by the server as any per-parameter state (bounded in bytes, dropped when idle);
- ``?endpoint=<id>`` / ``?engine=<n>``: the endpoint views (redis_stats/server/views/endpoints.py);
- ``?name[]=<sample>`` (repeatable): only those samples.

The format is negotiated from ``Accept`` (redis_stats/prometheus/openmetrics.py): Prometheus text
0.0.4 from the fast renderer, OpenMetrics 1.0 rewritten from it, another OpenMetrics version
written by prometheus_client over the collector. The body is gzipped (a slice at a time, as it is
encoded) when the client accepts it. One body is built at a time in the process (its memory).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from redis_stats._core.read.slices import EngineSlice
from redis_stats.prometheus.collector import RedisCollector
from redis_stats.prometheus.exposition import merge_texts
from redis_stats.prometheus.filters import select_samples, without_engine_label
from redis_stats.prometheus.openmetrics import OPENMETRICS_1_0, negotiate, openmetrics_from_text
from redis_stats.server.http import HTTPError, Request, Response, encode_body
from redis_stats.server.source import Source
from redis_stats.server.views.endpoints import EndpointViews, UnknownEndpoint, endpoint_param

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = [
    "SCRAPE_BUCKETS",
    "AllNamespaces",
    "Clashes",
    "ScrapeQuery",
    "ScrapeStats",
    "answer",
    "parse_query",
]

log = logging.getLogger("redis_stats.exporter")

# Buckets of redis_stats_exporter_scrape_duration_seconds: a scrape takes milliseconds for a few
# engines and up to seconds for a thousand on a loaded host.
SCRAPE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# What one slice's reader and renderer hold per character of its last text (the renderer's kept
# heads and text plan, the decoder's layouts), beyond its packed read: ~1.8 measured with
# tracemalloc (tests/server/test_kept_views.py keeps the estimate honest).
SLICE_BYTES_PER_CHARACTER = 2


@dataclass(frozen=True)
class ScrapeQuery:
    """What a ``/metrics`` request asks for: a slice, sample names (None: all), an endpoint or an
    engine."""

    slice: EngineSlice | None = None
    names: frozenset[str] | None = None
    endpoint: str | None = None
    """``?endpoint=<id>``: that endpoint's view (redis_stats/server/views/endpoints.py)."""
    engine: int | None = None
    """``?engine=<n>``: that engine's view, without the ``engine`` label."""


def parse_query(request: Request) -> ScrapeQuery:
    """The ``slice``, ``name[]``, ``endpoint`` and ``engine`` parameters; a ``400`` naming a bad one."""
    text, endpoint, engine = request.one("slice"), request.one("endpoint"), _engine_param(request)
    try:
        part = None if text is None else EngineSlice.parse(text)
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None
    if sum(x is not None for x in (part, endpoint, engine)) > 1:
        raise HTTPError(400, "give one of slice, endpoint and engine: each is a view of its own")
    names = request.params.get("name[]")
    return ScrapeQuery(
        part, frozenset(names) if names is not None else None, endpoint_param(endpoint), engine
    )


def _engine_param(request: Request) -> int | None:
    engine = request.one("engine")
    if engine is None:
        return None
    if not (engine.isascii() and engine.isdigit() and str(int(engine)) == engine):
        raise HTTPError(400, f"engine={engine!r} is not an engine index (a decimal integer, e.g. engine=3)")
    return int(engine)


class ScrapeStats:
    """Duration and size of the exporter's ``/metrics`` answers, as metrics (thread safe).

    A scrape's own duration and size are known only after its body is built, so each body carries
    the figures of the scrapes before it (as prometheus_client's own collectors do).
    """

    def __init__(self, app: App | None = None) -> None:
        self._lock = threading.Lock()
        self._buckets = [0] * len(SCRAPE_BUCKETS)
        self._count = 0
        self._sum = 0.0
        self._bytes = 0.0
        self._last_bytes = 0.0

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

    def close(self) -> None:
        """Nothing runs."""


class Clashes:
    """Families left out of a namespace on the whole ``/metrics`` of several: counted, and logged
    once each (``redis_stats_exporter_family_type_clashes_total{family}``)."""

    def __init__(self, app: App | None = None) -> None:
        self._counts: Counter[str] = Counter()

    def clashed(self, names: list[str]) -> None:
        """Count families a namespace declared with another type than the one served."""
        for name in names:
            if not self._counts[name]:
                log.warning(
                    "family %s has another type in one namespace than in another: left out of the "
                    "namespace whose type is not served (it would merge two types in one family)",
                    name,
                )
            self._counts[name] += 1

    def describe(self) -> list[Metric]:
        """Nothing ahead (registering must stay cheap)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The clashes so far."""
        clashes = CounterMetricFamily(
            "redis_stats_exporter_family_type_clashes",
            "Families left out of a namespace's series on the whole /metrics: another namespace "
            "declares the same name with another type.",
            labels=["family"],
        )
        for name, n in sorted(self._counts.items()):
            clashes.add_metric([name], float(n))
        yield clashes

    def close(self) -> None:
        """Nothing runs."""


class AllNamespaces:
    """The whole ``/metrics`` of an exporter of several namespaces: every namespace's collector
    (each labelling its series with its ``redis_stats_namespace``), as one collector with
    :class:`RedisCollector`'s two outputs. Each family once: two namespaces' series of one family
    under one ``# HELP``/``# TYPE``; of a family two namespaces declare with two types, the type
    with series wins (exposition.merge_texts), the other's lines are left out and counted."""

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
                elif found.type == family.type:
                    found.samples += family.samples
                elif not found.samples and family.samples:  # a bare declaration: the series win
                    merged[family.name] = family
                    clashes.append(family.name)
                else:
                    clashes.append(family.name)
        if clashes:
            self._clashed(clashes)
        yield from merged.values()


class _Slice:
    """One ``?slice=``'s collector, kept by the server: a reader of its own (its plan and caches
    hold that slice's engines only) on the namespace's Redis client."""

    def __init__(self, source: Source, part: EngineSlice) -> None:
        self.size = 0
        self.reader = source.new_reader()
        self.collector = RedisCollector(
            self.reader, engines=part, writers=part.index == 0, namespace_label=bool(source.labels)
        )

    def kept_bytes(self) -> int:
        """An estimate of its reader's and renderer's bytes, from its last text's size."""
        return self.reader.packed_bytes + SLICE_BYTES_PER_CHARACTER * self.size

    def close(self) -> None:
        """Nothing runs (its client is the namespace's: never closed here)."""


def _slice_of(source: Source, part: EngineSlice) -> _Slice:
    options = source.options
    if not source.labels and (options.slice is not None or options.engines is not None):
        served = (
            f"slice {options.slice}"
            if options.slice is not None
            else f"engines {list(options.engines or ())}"
        )
        raise HTTPError(
            400,
            f"this exporter serves {served} only; ?slice= needs an exporter of the whole fleet "
            "(no --slice, no --engines)",
        )
    return source.kept("slice", part, lambda: _Slice(source, part))


class _Both:
    """A collector and the exporter's own metrics as one (for prometheus_client's writers)."""

    def __init__(self, collector: Any, own: Any) -> None:
        self.collector = collector
        self.own = own

    def collect(self) -> Iterator[Metric]:
        yield from self.collector.collect()
        if self.own is not None:
            yield from self.own.collect()


def _target(app: App, request: Request, query: ScrapeQuery) -> tuple[Any, list[Any]]:
    """What the request reads and renders, and the kept entries to tell the text's size."""
    several = app.sources.several and request.one("namespace") is None
    if query.endpoint is not None or query.engine is not None:
        return _endpoint_target(app, request, query, several)
    sources = app.sources.all() if several else [app.source(request)]
    if query.slice is None:
        parts, kept = [s.collector for s in sources], []
    else:
        slices = [_slice_of(s, query.slice) for s in sources]
        parts, kept = [s.collector for s in slices], slices
    if not several:
        return parts[0], kept
    return AllNamespaces(parts, app.state(Clashes).clashed), kept


def _endpoint_target(app: App, request: Request, query: ScrapeQuery, several: bool) -> tuple[Any, list[Any]]:
    """The collector of an endpoint's or an engine's view (one namespace's)."""
    if several:
        raise HTTPError(
            400,
            "an endpoint view is one namespace's: this exporter serves several, give "
            "?namespace=NS (GET /namespaces lists them)",
        )
    try:
        collector = app.source(request).state(EndpointViews).collector(query.endpoint, query.engine)
    except UnknownEndpoint as exc:
        raise HTTPError(404, str(exc)) from None
    return collector, []


def _text(collector: Any, query: ScrapeQuery, content_type: str, encoder: Any, own: Any) -> tuple[str, int]:
    """The body's text for *content_type* (and the size of the text its collector rendered)."""
    if not content_type.startswith("application/openmetrics-text") or "version=1.0.0;" in content_type:
        text = collector.render_text() + (generate_latest(own).decode() if own is not None else "")
        rendered = len(text)
        if query.names is not None:
            text = select_samples(text, query.names)
        if content_type.startswith("application/openmetrics-text"):
            # Prometheus' default: the fast text as OpenMetrics 1.0 (the same samples)
            text = openmetrics_from_text(text)
    else:  # another version: prometheus_client writes it
        text = encoder(_Both(collector, own)).decode()
        rendered = len(text)
        if query.names is not None:
            text = select_samples(text, query.names)
    if query.engine is not None:  # one engine's view: without its engine label
        text = without_engine_label(text, query.engine)
    return text, rendered


def answer(app: App, request: Request) -> Response:
    """``/metrics`` for the request's ``Accept`` header and query (module docstring)."""
    query = parse_query(request)
    collector, kept = _target(app, request, query)
    encoder, content_type = negotiate(request.header("Accept"))
    openmetrics = content_type.startswith("application/openmetrics-text")
    if openmetrics and (query.endpoint is not None or query.engine is not None):
        # An endpoint's view is its text (the one series per family is made there), so
        # OpenMetrics 1.0 of it whatever version was asked: prometheus_client's writer of
        # another version would go by the engines' own series.
        content_type = OPENMETRICS_1_0
    # The exporter's own metrics are the whole exporter's: not in one namespace's ?namespace=
    # of an exporter of several, which is served as an exporter of it alone (without them) would.
    own = app.own_registry if not (app.sources.several and request.one("namespace")) else None
    with app.building:
        started = time.perf_counter()
        text, rendered = _text(collector, query, content_type, encoder, own)
        body, size = encode_body(text, request.gzip_ok)
        del text  # before the next body is built: at a thousand engines tens of MB
        app.state(ScrapeStats).observe(time.perf_counter() - started, size)
    for entry in kept:  # their sizes grew with this text: within the budget again
        entry.size = rendered
    if kept:
        app.kept.sweep()
    return Response(
        200,
        body,
        content_type if openmetrics else CONTENT_TYPE_PLAIN_0_0_4,
        vary="Accept, Accept-Encoding",
        gzipped=request.gzip_ok,
    )
