"""redis_stats: a Redis-backed distributed stats store for LLM serving fleets.

Record in any process (:class:`StatsWriter`), read in any other (:class:`StatsReader`), expose
every engine to Prometheus (:class:`RedisCollector`). See docs/architecture.md.
"""

from __future__ import annotations

from redis_stats.catalog import Catalog, MetricSpec
from redis_stats.config import StatsConfig
from redis_stats.errors import CatalogError, ConfigError, RedisStatsError
from redis_stats.keys import Keys
from redis_stats.prometheus.collector import RedisCollector
from redis_stats.reader import StatsReader
from redis_stats.snapshot import EngineSnapshot, HistogramValue, Snapshot
from redis_stats.writer import StatsWriter

__version__ = "0.1.0"

__all__ = [
    "Catalog",
    "CatalogError",
    "ConfigError",
    "EngineSnapshot",
    "HistogramValue",
    "Keys",
    "MetricSpec",
    "RedisCollector",
    "RedisStatsError",
    "Snapshot",
    "StatsConfig",
    "StatsReader",
    "StatsWriter",
    "__version__",
]
