"""The exporter's own metrics: its process, its background threads, its connections and its views.

A registry of its own (never the host's global one, which a host such as vLLM serves on its own
port), served after the data on ``/metrics`` when the exporter is made with ``self_metrics`` (the
standalone ``redis-stats exporter``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from redis_stats.background import background_errors

__all__ = ["background_family", "own_registry", "streams_families"]


def background_family() -> Metric:
    """``redis_stats_background_errors_total{thread,kind}``: the exceptions this process's
    background threads and tasks survived (:mod:`redis_stats.background`)."""
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


class _Collected:
    """A collector of whatever *families* yields at each collection."""

    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self._families = families

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._families()


def refused_family(refused: int) -> Metric:
    """``redis_stats_exporter_connections_refused_total``: connections past ``max_connections``."""
    fam = CounterMetricFamily(
        "redis_stats_exporter_connections_refused",
        "Connections refused because max_connections were already being served (answered 503, "
        "or closed unanswered when more than 128 refused ones were waiting).",
    )
    fam.add_metric([], float(refused))
    return fam


def streams_families(open_now: int, refused: int) -> list[Metric]:
    """``redis_stats_exporter_streams_open`` and ``..._streams_refused_total``: the long-lived
    answers (``/watch`` streams and long polls) on their own slots (``max_streams``)."""
    held = GaugeMetricFamily(
        "redis_stats_exporter_streams_open",
        "Streams and long polls (/watch subscribers) open now, on their own slots apart from "
        "max_connections (at most max_streams).",
    )
    held.add_metric([], float(open_now))
    fam = CounterMetricFamily(
        "redis_stats_exporter_streams_refused",
        "Streams and long polls refused (503) because max_streams were open already: subscribers "
        "at their limit, never a scrape or a health check refused.",
    )
    fam.add_metric([], float(refused))
    return [held, fam]


def own_registry(
    collectors: list[Any],
    states: Callable[[], list[Any]],
    refused: Callable[[], int],
    streams: Callable[[], tuple[int, int]] = lambda: (0, 0),
) -> CollectorRegistry:
    """The exporter's registry: its process (``process_*``, ``python_*``), its background errors,
    the connections its server *refused*, *collectors* (its namespaces, what it keeps), and the
    figures of whatever view state *states* lists at each collection that has any (``collect``)."""
    registry = CollectorRegistry(auto_describe=False)
    for own in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, *collectors):
        registry.register(own)
    registry.register(
        _Collected(
            lambda: iter([background_family(), refused_family(refused()), *streams_families(*streams())])
        )
    )

    def of_states() -> Iterator[Metric]:
        for state in states():
            if hasattr(state, "collect"):
                yield from state.collect()

    registry.register(_Collected(of_states))
    return registry
