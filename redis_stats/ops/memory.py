"""The store's memory as Prometheus sees it: ``used_memory``, ``maxmemory``, its eviction policy
and the keys it evicted, from ``INFO`` (what an alert needs before writes are refused or keys go).

A flush that Redis refuses for ``maxmemory`` is counted only once a later flush gets through
(``redis_stats_writer_flush_errors_total{kind="oom"}``), and a key evicted under an ``allkeys-*``
policy only once its writer notices (``redis_stats_writer_keys_lost_total``): neither warns
*before*. The server's own figures do, so every fleet-wide view serves them
(``redis_stats_store_*``, docs/self-metrics.md; alerts: docs/runbooks.md).

``INFO`` is asked at most every :data:`EVERY` seconds per reader, whatever the scrapes (each view
of one reader shares one :class:`StoreMemory`: :func:`store_memory`), and not again for
:data:`REFUSED_BACKOFF` seconds after a refusal (a reader user without ``+info``: the families
are then left out, said once at INFO). On a Cluster the node asked is the one holding the
namespace's first shard (``INFO`` answers per node).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from redis_stats.connection import is_cluster
from redis_stats.errors import error_kind
from redis_stats.keys import Keys

__all__ = ["EVERY", "REFUSED_BACKOFF", "StoreMemory", "store_memory"]

log = logging.getLogger("redis_stats.collector")

EVERY = 15.0
"""Least seconds between two ``INFO`` reads of one reader (a scrape every 15 s asks once)."""

REFUSED_BACKOFF = 300.0
"""Seconds without asking again after ``INFO`` was refused (a user without ``+info``, a store
that has no ``INFO``)."""

RETRIED = frozenset({"connection", "timeout"})
"""Failures after which ``INFO`` is asked again at the next due read (Redis down is not a
refusal: its figures are back with the first scrape that reads it)."""


class StoreMemory:
    """The server's memory figures, read at most every :data:`EVERY` s (thread-safe)."""

    def __init__(self, client: Any, keys: Keys, *, every: float = EVERY) -> None:
        self.client = client
        self.keys = keys
        self.every = every
        self._lock = threading.Lock()
        self._figures: dict[str, Any] | None = None
        self._next = 0.0  # monotonic time of the next INFO read
        self._refused: set[str] = set()

    def figures(self) -> dict[str, Any] | None:
        """``used_memory``, ``maxmemory``, ``maxmemory_policy`` and ``evicted_keys`` as of the
        last read (None when none succeeded lately); reads again when due."""
        with self._lock:
            due = time.monotonic() >= self._next
            if due:
                self._next = time.monotonic() + self.every  # one reader asks; the others use these
        if due:
            self._read()
        return self._figures

    def _read(self) -> None:
        try:
            memory, stats = self._info("memory"), self._info("stats")
            figures = {
                "used_memory": float(memory["used_memory"]),
                "maxmemory": float(memory.get("maxmemory", 0) or 0),
                "maxmemory_policy": str(memory.get("maxmemory_policy", "")),
                "evicted_keys": float(stats.get("evicted_keys", 0)),
            }
        except Exception as exc:  # no +info for this user, Redis down, a store without INFO
            kind = error_kind(exc)
            if kind not in self._refused:
                self._refused.add(kind)
                log.info(
                    "the store's memory (redis_stats_store_*) is not served: INFO failed (%s: %s); "
                    "a reader user needs +info (docs/acl.md)",
                    kind,
                    exc,
                )
            with self._lock:
                self._figures = None
                if kind not in RETRIED:  # refused: not asked again for a while
                    self._next = time.monotonic() + REFUSED_BACKOFF
            return
        self._figures = figures

    def _info(self, section: str) -> dict[str, Any]:
        if is_cluster(self.client):  # the node of the namespace's (first shard's) slot
            node = self.client.get_node_from_key(self.keys.meta)
            found: dict[str, Any] = self.client.info(section, target_nodes=node)
            return found
        answer: dict[str, Any] = self.client.info(section)
        return answer

    def families(self) -> list[Metric]:
        """The ``redis_stats_store_*`` families (none when ``INFO`` is not available)."""
        figures = self.figures()
        if figures is None:
            return []
        used = GaugeMetricFamily(
            "redis_stats_store_used_memory_bytes", "Memory the store's Redis uses (INFO used_memory)."
        )
        used.add_metric([], figures["used_memory"])
        limit = GaugeMetricFamily(
            "redis_stats_store_maxmemory_bytes",
            "The store's maxmemory (0: no limit); past it Redis refuses writes or evicts keys.",
        )
        limit.add_metric([], figures["maxmemory"])
        policy = GaugeMetricFamily(
            "redis_stats_store_maxmemory_policy",
            "The store's maxmemory-policy (always 1); allkeys-* evicts this store's keys.",
            labels=["policy"],
        )
        policy.add_metric([figures["maxmemory_policy"]], 1.0)
        evicted = CounterMetricFamily(
            "redis_stats_store_evicted_keys", "Keys the store's Redis evicted since it started (any key)."
        )
        evicted.add_metric([], figures["evicted_keys"])
        return [used, limit, policy, evicted]


_shared: weakref.WeakKeyDictionary[Any, StoreMemory] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def store_memory(reader: Any) -> StoreMemory:
    """The :class:`StoreMemory` of *reader*'s store, one per reader (its views share it)."""
    with _shared_lock:
        found = _shared.get(reader)
        if found is None:
            found = _shared[reader] = StoreMemory(reader.client, Keys(reader.config.namespace))
        return found
