"""``GET /metrics``: every engine's series for Prometheus, or part of them.

- no parameter: the namespace's every engine (one Redis read); an exporter of several namespaces
  serves them all, each family once, every series labelled ``redis_stats_namespace``
  (:class:`AllNamespaces`), and ``?namespace=NS`` one of them as an exporter of it alone would;
- ``?slice=i/N``: the engines ``e % N == i`` only, read by Redis' own choice (one exporter scraped
  as N targets; redis_stats/prometheus/filters.py); the slices of a namespace share two readers
  (a plan per slice), and each slice asked for has its renderer kept by the server as any
  per-parameter state (bounded in bytes, dropped when idle: redis_stats/server/states/scrapes.py);
- ``?endpoint=<id>`` / ``?engine=<n>``: the endpoint views, one series per protocol family over
  the endpoint's live engines (redis_stats/server/states/endpoints.py);
- ``?name[]=<sample>`` (repeatable): only those samples.

The format is negotiated from ``Accept`` (redis_stats/prometheus/openmetrics.py): Prometheus text
0.0.4 from the fast renderer, OpenMetrics 1.0 rewritten from it, another OpenMetrics version
written by prometheus_client over the collector. The body is gzipped (a slice at a time, as it is
encoded) when the client accepts it. One body is built at a time in the process (its memory).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from redis_stats.prometheus.collector import RedisCollector
from redis_stats.prometheus.exposition import merge_texts
from redis_stats.prometheus.filters import select_samples, without_engine_label
from redis_stats.prometheus.openmetrics import OPENMETRICS_1_0, negotiate, openmetrics_from_text
from redis_stats.reader import EngineSlice
from redis_stats.server.http import HTTPError, Request, Response, encode_body
from redis_stats.server.source import Source
from redis_stats.server.states.endpoints import EndpointViews, EngineMoved, UnknownEndpoint, endpoint_param
from redis_stats.server.states.scrapes import Clashes, ScrapeStats, SliceReaders, SliceText
from redis_stats.server.states.usage import UsageState

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["AllNamespaces", "ScrapeQuery", "answer", "parse_query"]


@dataclass(frozen=True)
class ScrapeQuery:
    """What a ``/metrics`` request asks for: a slice, sample names (None: all), an endpoint or an
    engine."""

    slice: EngineSlice | None = None
    names: frozenset[str] | None = None
    endpoint: str | None = None
    """``?endpoint=<id>``: that endpoint's view (redis_stats/server/states/endpoints.py)."""
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


def _slice_of(source: Source, part: EngineSlice) -> tuple[RedisCollector, SliceText]:
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


class _Extra:
    """The collectors rendered after the namespaces' series: the top tenants of each namespace
    served (``--usage``; one family each, the namespaces' series merged in it) and the exporter's
    own metrics."""

    def __init__(self, usage: list[Any], own: Any) -> None:
        self.usage = usage
        self.own = own

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for collector in self.usage:
            for family in collector.collect():
                found = merged.setdefault(family.name, family)
                if found is not family:
                    found.samples += family.samples
        yield from merged.values()
        if self.own is not None:
            yield from self.own.collect()


def _usage(app: App, request: Request, query: ScrapeQuery) -> list[Any]:
    """The top-tenant collectors of the namespaces a whole ``/metrics`` serves (``--usage``)."""
    whole = query.slice is None and query.endpoint is None and query.engine is None
    if not (app.options.usage and app.options.usage_top and whole):
        return []
    several = app.sources.several and request.one("namespace") is None
    sources = app.sources.all() if several else [app.source(request)]
    return [s.state(UsageState).collector for s in sources]


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
    own: Any = app.own_registry if not (app.sources.several and request.one("namespace")) else None
    usage = _usage(app, request, query)
    if usage:
        own = _Extra(usage, own)
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
