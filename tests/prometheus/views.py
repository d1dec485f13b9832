"""The state an exporter's views keep, reached as the views reach it (for tests that look inside)."""

from __future__ import annotations

from typing import Any

from redis_stats.server import Exporter
from redis_stats.server.source import Source
from redis_stats.server.states.endpoints import EndpointMap
from redis_stats.server.states.load_feed import LoadFeed, feed_of
from redis_stats.server.states.sampler import Window, window_of


def source(exporter: Exporter, namespace: str | None = None) -> Source:
    """The source of *namespace* (None: the exporter's one namespace)."""
    return exporter.app.sources.one(namespace)


def window(exporter: Exporter, namespace: str | None = None) -> Window:
    """The /snapshot window of *namespace*, as the view makes it."""
    return window_of(source(exporter, namespace))


def load_feed(exporter: Exporter, namespace: str | None = None) -> LoadFeed:
    """The /load feed of *namespace*."""
    return source(exporter, namespace).state(feed_of)


def endpoint_map(exporter: Exporter, namespace: str | None = None) -> EndpointMap:
    """The endpoint map of *namespace*."""
    return source(exporter, namespace).state(EndpointMap.of)


def snapshot_json(exporter: Exporter, names: Any = None, buckets: bool = True) -> tuple[int, dict[str, Any]]:
    """(status, document) of /snapshot, as the view builds it (starting the sampler)."""
    found = window(exporter)
    found.asked()
    with found.source.building:
        return found.document(names, buckets)
