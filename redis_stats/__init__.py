"""redis_stats: a Redis-backed distributed stats store for LLM serving fleets.

Record in any process (:class:`StatsWriter`), read in any other (:class:`StatsReader`), expose
every engine to Prometheus (:class:`RedisCollector`). See docs/architecture.md.
"""

from __future__ import annotations

from .catalog import Catalog, MetricSpec
from .collector import RedisCollector
from .config import StatsConfig
from .errors import CatalogError, ConfigError, RedisStatsError
from .keys import Keys
from .reader import StatsReader
from .snapshot import EngineSnapshot, HistogramValue, Snapshot
from .writer import StatsWriter

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
