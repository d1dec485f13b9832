"""The Redis key layout of one namespace, in one place (see docs/key-schema.md).

Every key of namespace NS starts with ``rs:{NS}:``. The braces are a Redis Cluster hash tag: all
keys of a namespace hash to one slot, so one script can touch all of them atomically, while many
namespaces spread over the cluster. The keys that hold data start with ``rs:{NS}:v<schema>:``, so
that processes of two redis_stats versions with different layouts can share a namespace during a
rolling upgrade without reading or overwriting each other's data; the lease keys (log leader, gc
lock), whose format every version shares, are right under ``rs:{NS}:``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SCHEMA_VERSION", "Keys"]

# Bumped when the layout or the field encoding changes incompatibly; stored in meta["schema"].
# 2: each writer's absolute values in chunks of the engine's hash (docs/key-schema.md, issue 15);
# 1: deltas merged into one field per series by the flush script, gauges in their own hash.
SCHEMA_VERSION = "2"


@dataclass(frozen=True)
class Keys:
    """Names of every key of one namespace."""

    namespace: str

    @property
    def root(self) -> str:
        """``rs:{NS}:``, the start of every key of the namespace, of any schema version (and the
        ACL key pattern ``rs:{NS}:*``)."""
        return f"rs:{{{self.namespace}}}:"

    @property
    def prefix(self) -> str:
        """``rs:{NS}:v<schema>:``, the start of every key holding data of this schema version."""
        return f"{self.root}v{SCHEMA_VERSION}:"

    @property
    def meta(self) -> str:
        """Hash: ``schema`` version, ``_v`` catalogue version, ``m:<metric>`` -> spec JSON."""
        return self.prefix + "meta"

    @property
    def engines(self) -> str:
        """Sorted set: engine index -> last heartbeat (server time, ms)."""
        return self.prefix + "engines"

    @property
    def writers(self) -> str:
        """Sorted set: writer id -> last heartbeat (server time, ms; negative once closed)."""
        return self.prefix + "writers"

    @property
    def seq(self) -> str:
        """Hash: writer id -> last applied flush sequence number."""
        return self.prefix + "seq"

    @property
    def leader(self) -> str:
        """String with a TTL: the holder of the log lease and its fencing token."""
        return self.root + "leader"

    @property
    def leader_epoch(self) -> str:
        """Integer: the last fencing token handed out with the log lease."""
        return self.root + "leader_epoch"

    @property
    def gc_lock(self) -> str:
        """String with a TTL: the process currently collecting garbage."""
        return self.root + "gc"

    @property
    def claims(self) -> str:
        """Hash: engine -> ``<owner>|<ms>``, the instance that last claimed the engine."""
        return self.prefix + "claims"

    @property
    def conflicts(self) -> str:
        """Hash: engine -> ``<owner a>|<owner b>|<ms>``, when two live instances claimed it."""
        return self.prefix + "conflicts"

    def writer_stats(self, writer_id: str) -> str:
        """Hash: one writer's self-metrics (flushes, errors, drops, flush durations, ...)."""
        return f"{self.prefix}w:{writer_id}"

    def counters(self, engine: int | str) -> str:
        """Hash: the series of one engine: each writer's chunks (counters, histograms, gauges)
        and the base fields gc folded departed writers into."""
        return f"{self.prefix}e:{engine}:c"

    def gauges(self, engine: int | str) -> str:
        """Hash: gauges of one engine in schema 1 (schema 2 keeps them in the writers' chunks;
        gc still removes this key with its engine)."""
        return f"{self.prefix}e:{engine}:g"
