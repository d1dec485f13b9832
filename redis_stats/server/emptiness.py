"""An exporter serving a namespace that holds nothing says so in its log.

A misspelt ``--namespace`` (or ``REDIS_STATS_NAMESPACE``) used to give an exporter that served
``redis_stats_up 1`` and no engine, and logged nothing. :class:`EmptyWatch` looks at the
namespace an exporter of one namespace serves when it starts and then every few seconds (one
``ZRANGE``/``HGET`` or two each, the least-privilege reader's commands), and when one has held
nothing for :data:`GRACE` seconds (a fleet starting beside its exporter, the demo's, a vLLM pod's
own view, has flushed by then) logs a warning with what this Redis does hold and the namespace
whose name is closest among those with engines up (:func:`redis_stats.ops.namespaces.closest_live`);
when it holds data again, one line says so. Scrapes say it too: ``redis_stats_namespace_empty``
(the collector), which ``RedisStatsNamespaceEmpty`` alerts on.
"""

from __future__ import annotations

import logging
import time

import redis

from redis_stats.errors import error_kind
from redis_stats.ops.namespaces import closest_live, describe_namespaces, namespace_holds_data, summary
from redis_stats.reader import StatsReader

__all__ = ["EmptyWatch"]

log = logging.getLogger("redis_stats.exporter")

GRACE = 30.0
"""Seconds a namespace holds nothing before it is said: its writers' first flushes come sooner."""

LISTED = 10
"""Namespaces of the Redis a warning lists (the rest are counted)."""


class EmptyWatch:
    """Logs each of *namespaces* (read with *reader*'s client) that holds nothing, once until it
    holds data again (:meth:`check`, from one thread)."""

    def __init__(self, reader: StatsReader, namespaces: list[str], grace: float = GRACE) -> None:
        self.reader = reader
        self.namespaces = namespaces
        self.grace = grace
        self.since: dict[str, float] = {}  # namespace -> when it was first seen empty (monotonic)
        self.empty: set[str] = set()  # the ones said to be empty

    def check(self) -> None:
        """Look at every namespace once; a failed read skips it (the reads' own outage log says
        that Redis cannot be read)."""
        client = self.reader.client
        for namespace in self.namespaces:
            try:
                holds = namespace_holds_data(client, namespace)
            except redis.RedisError:
                continue
            if holds:
                self.since.pop(namespace, None)
                if namespace in self.empty:
                    self.empty.discard(namespace)
                    log.info("namespace %r holds data again: its engines are served", namespace)
                continue
            since = self.since.setdefault(namespace, time.monotonic())
            if namespace not in self.empty and time.monotonic() - since >= self.grace:
                self.empty.add(namespace)
                log.warning("%s", self.message(namespace))

    def message(self, namespace: str) -> str:
        """What the log says of an empty *namespace*: what the Redis holds, the closest live."""
        config = self.reader.config
        where = (
            f"namespace {namespace!r} holds nothing at {config.safe_url}: this exporter serves no engine "
            "of it (redis_stats_namespace_empty 1)"
        )
        try:
            others = describe_namespaces(self.reader.client, config.stale_after)
        except redis.RedisError as exc:
            return (
                f"{where}; the other namespaces cannot be listed ({error_kind(exc)}: a user without +scan?)"
            )
        if not others:
            return (
                f"{where}, and no namespace does: nothing has written to this Redis (check the URL's "
                "database number)"
            )
        listed = "; ".join(summary(info) for info in others[:LISTED])
        more = f"; and {len(others) - LISTED} more" if len(others) > LISTED else ""
        closest = closest_live(namespace, others)
        hint = (
            f"; the closest live namespace is {closest.namespace!r}: serve it with --namespace "
            f"{closest.namespace} (or REDIS_STATS_NAMESPACE)"
            if closest is not None
            else ""
        )
        return f"{where}; this Redis holds: {listed}{more}{hint}"
