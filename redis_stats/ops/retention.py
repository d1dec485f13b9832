"""Retention: remove engines and writers that stopped heartbeating, one collector at a time.

``collect_garbage`` takes a short lease (``rs:{NS}:gc``, SET NX PX) so that when several processes
run it (every exporter may, on a timer) only one collects at a time, then runs ``gc.lua``, which
removes in one atomic step:

- engines whose last heartbeat is older than ``retention``: their counter and gauge hashes;
- writers silent (or closed) for longer than ``retention``: their chunks on every engine are
  folded into the engines' base fields (counter totals and histograms added, gauges dropped, see
  docs/key-schema.md), their heartbeat and self-metrics go; their sequence number becomes a
  tombstone, so a late flush from them is deduplicated or refused (the writer then continues
  under a new id). Tombstones go after one more retention.

A sharded namespace is collected shard by shard (each shard is self-contained), under the one
lease in shard 0's root.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from redis.exceptions import ResponseError

from redis_stats._scripts import Script, load_script
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, make_client
from redis_stats.keys import Keys, parse_layouts

__all__ = ["GcResult", "collect_garbage"]

GC_LEASE_MS = 60_000


@dataclass
class GcResult:
    """What a collection removed (or, in a dry run, would remove)."""

    engines: list[int] = field(default_factory=list)
    writers: list[str] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    folded: int = 0
    """Series values of removed writers added to base fields."""
    unfolded: int = 0
    """Series values of removed writers that could not be added (garbage in Redis), dropped."""
    skipped: bool = False
    """True when another process held the gc lease: nothing was done."""
    failed: dict[str, str] = field(default_factory=dict)
    """Shards not collected (their key prefix -> why: a key of the wrong type there); the
    others were."""


def namespace_shards(config: StatsConfig, client: Client) -> list[Keys]:
    """The keys of every shard of the namespace: shard 0, and shards 1..K-1 of the configured K
    and of every K its writers listed in shard 0's catalogue (``shards``, see docs/key-schema.md)."""
    keys = Keys(config.namespace)
    try:
        listed = parse_layouts(client.hget(keys.meta, "shards"))
    except ResponseError:  # the catalogue is not a hash: gc.lua does not read it; shard 0 only
        listed = set()
    return keys.all_shards(listed | {config.shards})


def collect_garbage(config: StatsConfig, *, dry_run: bool = False, client: Client | None = None) -> GcResult:
    """Remove what is past ``config.retention`` (or, with *dry_run*, only list it), in every
    shard of the namespace (one ``gc.lua`` call each, under the one lease of shard 0)."""
    client = client if client is not None else make_client(config)
    keys = Keys(config.namespace)
    token = secrets.token_hex(8)
    if not dry_run and not client.set(keys.gc_lock, token, nx=True, px=GC_LEASE_MS):
        return GcResult(skipped=True)
    out = GcResult()
    try:
        script = Script(client, load_script("gc"))
        for shard in namespace_shards(config, client):
            try:
                engines, writers, tombstones, folded, unfolded = script(
                    keys=[shard.engines, shard.writers, shard.seq],
                    args=[shard.prefix, int(config.retention * 1000), "1" if dry_run else "0"],
                )
            except ResponseError as exc:
                # A key of the wrong type (garbage) in one shard costs that shard's collection
                # only: the others are self-contained and still collected.
                out.failed[shard.prefix] = str(exc).split("\n")[0][:200]
                continue
            out.engines += (int(e) for e in engines)
            out.writers += (w for w in writers if w not in out.writers)
            out.tombstones += tombstones
            out.folded += int(folded)
            out.unfolded += int(unfolded)
    finally:
        if not dry_run and client.get(keys.gc_lock) == token:
            client.delete(keys.gc_lock)
    out.engines = sorted(set(out.engines))
    return out
