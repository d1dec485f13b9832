"""Removing a whole namespace (``redis-stats drop-namespace``): every key of every shard, refused
while any writer of it is live.

Which keys: each shard's data keys by name (docs/key-schema.md: ``meta``, ``engines``,
``writers``, ``seq``, ``claims``, ``conflicts``, ``load``, ``bridges``, ``bookings``, ``routers``,
the usage ledger's keys of fixed names (its hour and day buckets expire by themselves), each listed
engine's hashes, each listed writer's self-metrics) and shard 0's lease keys (``leader``,
``leader_epoch``, ``gc``); and, where the user may ``SCAN``, whatever else matches the shard's
prefix ``rs:{TAG}:*`` (schema 1 keys, an engine hash whose engine left the list). Each shard
is removed by ``drop.lua``, which checks in the same atomic call that no writer of that shard is
live (heartbeat within the ``stale_after`` it stored, server time) and removes nothing if one is.
Every shard is checked before any is touched; shard 0 goes last, so an interrupted removal can be
run again (shard 0's catalogue lists the other shards).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError, ResponseError

from redis_stats._scripts import Script, load_script
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, is_cluster, make_client
from redis_stats.keys import Keys, parse_shard_counts
from redis_stats.ops.namespaces import judged_stale

__all__ = ["RemovalResult", "remove_namespace"]

# Keys per drop.lua call: a namespace of thousands of engines is removed in several calls, each
# checking the writers again (the writers' list goes with the last).
KEYS_PER_CALL = 1000


@dataclass
class RemovalResult:
    """What a removal did (or, in a dry run, would do)."""

    namespace: str
    keys: int = 0
    """Keys removed (in a dry run: keys that exist and would be removed)."""
    shards: int = 0
    """Shards of the namespace looked at (1 unless it was split)."""
    live_writers: list[str] = field(default_factory=list)
    """Writers live when checked: the removal was refused (nothing removed unless *partial*)."""
    partial: bool = False
    """A writer became live after the first shards were removed: those stay removed."""
    failed: dict[str, str] = field(default_factory=dict)
    """Shards (key prefix -> why) Redis refused the removal in (a right the user lacks, a key of
    the wrong type) or that could not be reached; nothing was removed once one failed."""
    scanned: bool = True
    """False when the user may not SCAN: only the keys known by name were removed."""


def _shards(config: StatsConfig, client: Client) -> list[Keys]:
    """Every shard of the namespace (the configured K and every K shard 0's catalogue lists)."""
    keys = Keys(config.namespace)
    try:
        listed = parse_shard_counts(client.hget(keys.meta, "shards"))
    except ResponseError:  # not a hash: shard 0 only (its keys are removed all the same)
        listed = set()
    return keys.all_shards(listed | {config.shards})


def _members(client: Client, key: str) -> list[str]:
    try:
        found: Any = client.zrange(key, 0, -1)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in found]
    except ResponseError:  # not a sorted set: the key itself is removed, nothing is listed in it
        return []


def _named_keys(client: Client, shard: Keys, root: bool) -> list[str]:
    """The keys of *shard* known by name (docs/key-schema.md), writers' list excluded."""
    names = [shard.meta, shard.engines, shard.seq, shard.claims, shard.conflicts, shard.load, shard.bridges]
    names += [shard.bookings, shard.routers, *shard.usage_fixed()]  # usage's buckets expire alone
    for engine in _members(client, shard.engines):
        names += [shard.counters(engine), shard.base(engine), shard.gauges(engine)]
    names += [shard.writer_stats(w) for w in _members(client, shard.writers)]
    if root:
        names += [shard.leader, shard.leader_epoch, shard.gc_lock]
    return names


def _scanned_keys(client: Client, shard: Keys) -> list[str] | None:
    """Every key matching ``rs:{TAG}:*`` (on a Cluster, its slot's master), or None when the
    user may not SCAN (the least-privilege users of docs/acl.md may not)."""
    pattern = shard.root + "*"  # a namespace holds no glob character (config checks it)
    try:
        if is_cluster(client):
            from redis.cluster import RedisCluster

            found = client.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES)
        else:
            found = client.scan_iter(match=pattern, count=1000)
        return [k.decode() if isinstance(k, bytes) else str(k) for k in found]
    except ResponseError:  # NOPERM
        return None


def _chunks(keys: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(keys), KEYS_PER_CALL):
        yield keys[i : i + KEYS_PER_CALL]


def remove_namespace(
    config: StatsConfig, *, dry_run: bool = False, client: Client | None = None
) -> RemovalResult:
    """Remove every key of ``config.namespace`` in every shard, unless a writer of it is live
    (``config.stale_after``); with *dry_run*, only count the keys and check the writers."""
    client = client if client is not None else make_client(config)
    script = Script(client, load_script("drop"))
    shards = _shards(config, client)
    out = RemovalResult(config.namespace, shards=len(shards))
    plans, stale_ms = _plan(config, client, shards, out)
    if out.failed:
        return out
    # First every shard is checked (a dry run of each): a live writer anywhere refuses it all.
    counts = []
    for shard, others in plans:
        try:
            counts.append(_run(script, shard, others, stale_ms, dry=True, out=out))
        except RedisError as exc:
            out.failed[shard.prefix] = _first_line(exc)
    if out.failed or out.live_writers or dry_run:
        out.keys = sum(counts)
        return out
    _remove(script, plans, stale_ms, out)
    return out


def _first_line(exc: Exception) -> str:
    return str(exc).split("\n")[0][:200]


def _plan(
    config: StatsConfig, client: Client, shards: list[Keys], out: RemovalResult
) -> tuple[list[tuple[Keys, list[str]]], int]:
    """Each shard with the keys to drop besides its writers' index, and the ``stale_ms`` a writer
    must be silent for to count as gone; a shard that cannot be listed goes to ``out.failed``."""
    plans: list[tuple[Keys, list[str]]] = []
    # A writer is live for the stale_after readers judge it by (what it stored, or the one
    # default: _core/read/liveness.py): the check uses the longest of those, and this config's if
    # longer, so no writer a reader calls live is taken for gone.
    judged = judged_stale(client, shards)
    stale_ms = max(int(config.stale_after * 1000), int(max(judged.values(), default=0)))
    for i, shard in enumerate(shards):
        try:
            named = _named_keys(client, shard, root=i == 0)
            scanned = _scanned_keys(client, shard)
        except RedisError as exc:
            out.failed[shard.prefix] = _first_line(exc)
            continue
        if scanned is None:
            out.scanned = False
        others = [k for k in dict.fromkeys(named + (scanned or [])) if k != shard.writers]
        plans.append((shard, others))
    return plans, stale_ms


def _remove(script: Script, plans: list[tuple[Keys, list[str]]], stale_ms: int, out: RemovalResult) -> None:
    """Drop each planned shard, shard 0 last (it lists the others); stop at the first failure or
    live writer, then ``out.partial`` says whether some keys are gone."""
    for shard, others in reversed(plans):
        try:
            removed = _run(script, shard, others, stale_ms, dry=False, out=out)
        except RedisError as exc:
            out.failed[shard.prefix] = _first_line(exc)
            out.partial = out.keys > 0
            return
        out.keys += removed
        if out.live_writers:  # a writer came back between the check and this shard
            out.partial = out.keys > 0
            return


def _run(
    script: Script, shard: Keys, others: list[str], stale_ms: int, *, dry: bool, out: RemovalResult
) -> int:
    """drop.lua over *shard*'s keys in calls of KEYS_PER_CALL; live writers go to *out*."""
    total = 0
    chunks = list(_chunks(others)) or [[]]
    for j, chunk in enumerate(chunks):
        last = j == len(chunks) - 1
        done, value = script(
            keys=[shard.writers, *chunk], args=[stale_ms, "1" if dry else "0", "1" if last else "0"]
        )
        if not int(done):
            out.live_writers += [w.decode() if isinstance(w, bytes) else str(w) for w in value]
            return total
        total += int(value)
    return total
