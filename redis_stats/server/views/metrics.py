"""``GET /metrics``: every engine's series for Prometheus, or part of them.

- no parameter: the namespace's every engine (one Redis read); an exporter of several namespaces
  serves them all, each family once, every series labelled ``redis_stats_namespace``
  (:class:`AllNamespaces`), and ``?namespace=NS`` one of them as an exporter of it alone would;
- ``?slice=i/N``: the engines ``e % N == i`` only, read by Redis' own choice (one exporter scraped
  as N targets; redis_stats/prometheus/filters.py); the slices of a namespace share two readers
  (:class:`SliceReaders`: a plan per slice), and each slice asked for has its renderer kept by
  the server as any per-parameter state (bounded in bytes, dropped when idle);
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
from redis_stats.prometheus.collector import ReadErrors, RedisCollector
from redis_stats.prometheus.exposition import TextRenderer, merge_texts
from redis_stats.prometheus.filters import select_samples, without_engine_label
from redis_stats.prometheus.openmetrics import OPENMETRICS_1_0, negotiate, openmetrics_from_text
from redis_stats.reader import SNAPSHOT_LEAN
from redis_stats.server.http import HTTPError, Request, Response, encode_body
from redis_stats.server.source import Source
from redis_stats.server.views.endpoints import EndpointViews, EngineMoved, UnknownEndpoint, endpoint_param

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

# What one slice's kept renderer holds: its catalogue's headers, and per character of its last
# text the text around the numbers (its heads and text plan) measured with tracemalloc
# (tests/server/test_kept_views.py and test_attack_memory.py keep the estimate honest).
SLICE_BYTES = 16 * 1024

KEPT_SLICES = 16
"""Slices of a namespace whose renderers are kept at most (a sliced layout scrapes 4 or 8); the
renderer of any other is made for its request alone. A renderer spares a scrape ~40 % of its time
(~90 ms of ~150 for a quarter of 1,024 engines x 2), and one made and dropped per request leaves
no memory behind, where a thousand kept ones left the process' memory fragmented when dropped."""
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
    if not (engine.isascii() and engine.isdigit() and len(engine) <= 18 and str(int(engine)) == engine):
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


class SliceReaders:
    """What every ``?slice=`` of one namespace shares (a view state): two readers, a plan per
    slice each (slice 0 reads every writer's stats for the writers' self-metrics it shows; the
    others, :data:`~redis_stats.reader.SNAPSHOT_LEAN`, only the liveness fields of the writers
    holding chunks in their engines), and the count of their failed reads. Per slice only its
    renderer is kept (:class:`_SliceText`: the text around its numbers, for its next scrape), of
    :data:`KEPT_SLICES` slices at most."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.first = source.new_reader()
        self.others = source.new_reader()
        self.others.snapshot_fetch = SNAPSHOT_LEAN
        self.errors = ReadErrors()

    def collector(self, part: EngineSlice) -> tuple[RedisCollector, _SliceText]:
        """The collector of slice *part* for one request, and its kept renderer."""
        source = self.source
        text = source.kept("slice", part, lambda: _SliceText(source), most=KEPT_SLICES)
        return RedisCollector(
            self.first if part.index == 0 else self.others,
            engines=part,
            writers=part.index == 0,
            namespace_label=bool(source.labels),
            renderer=lambda labels: text.renderer,
            errors=self.errors,
        ), text

    def close(self) -> None:
        """Nothing runs (its readers' client is the namespace's: never closed here)."""


class _SliceText:
    """One ``?slice=``'s renderer, kept by the server (bounded in bytes, dropped when idle)."""

    def __init__(self, source: Source) -> None:
        self.size = 0
        self.renderer = TextRenderer(source.labels)

    def kept_bytes(self) -> int:
        """An estimate of its renderer's bytes: the text around its last text's numbers."""
        return SLICE_BYTES + SLICE_BYTES_PER_CHARACTER * self.size

    def close(self) -> None:
        """Nothing runs."""


def _slice_of(source: Source, part: EngineSlice) -> tuple[RedisCollector, _SliceText]:
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
    return source.state(SliceReaders).collector(part)


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
    parts, kept = _collectors(sources, query.slice)
    if not several:
        return parts[0], kept
    return AllNamespaces(parts, app.state(Clashes).clashed), kept


def _collectors(sources: list[Source], part: EngineSlice | None) -> tuple[list[Any], list[Any]]:
    """Each namespace's collector of the whole view, or of slice *part* (and its kept renderer)."""
    if part is None:
        return [s.collector for s in sources], []
    slices = [_slice_of(s, part) for s in sources]
    return [collector for collector, _ in slices], [text for _, text in slices]


def _endpoint_target(
    app: App, request: Request, query: ScrapeQuery, several: bool, strict: bool = True
) -> tuple[Any, list[Any]]:
    """The collector of an endpoint's or an engine's view (one namespace's); *strict*: see
    :meth:`EndpointViews.collector`."""
    if several:
        raise HTTPError(
            400,
            "an endpoint view is one namespace's: this exporter serves several, give "
            "?namespace=NS (GET /namespaces lists them)",
        )
    try:
        views = app.source(request).state(EndpointViews)
        collector = views.collector(query.endpoint, query.engine, strict=strict)
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
        try:
            text, rendered = _text(collector, query, content_type, encoder, own)
        except EngineMoved:  # the map was behind: once more, from a new map (as read then)
            collector, kept = _endpoint_target(app, request, query, several=False, strict=False)
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
