"""Any LLM server into the store: scrape its own ``/metrics`` and store it as a writer.

    from redis_stats import StatsConfig
    from redis_stats.integrations.bridge import Bridge, BridgedSource

    config = StatsConfig.from_env()
    source = BridgedSource("http://127.0.0.1:8000/metrics", config, engine_label="engine")
    with Bridge([source]):      # one thread per source, a scrape every flush_interval
        ...

Each source is one writer (one per incarnation of the source); every reader of the namespace
covers its engines. See docs/bridge.md.
"""

from __future__ import annotations

from .body import PROCESS_FAMILIES, Body, BodyError, Family, parse_body
from .fetch import FORMATS, ScrapeError, SourceURL
from .runner import Bridge
from .source import DEFAULT_MAX_BYTES, BridgedSource, SourceStats, exact_amounts

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMATS",
    "PROCESS_FAMILIES",
    "Body",
    "BodyError",
    "Bridge",
    "BridgedSource",
    "Family",
    "ScrapeError",
    "SourceStats",
    "SourceURL",
    "exact_amounts",
    "parse_body",
]
