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
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from redis_stats._scripts import Script, load_script
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, make_client
from redis_stats.keys import Keys

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


def collect_garbage(config: StatsConfig, *, dry_run: bool = False, client: Client | None = None) -> GcResult:
    """Remove what is past ``config.retention`` (or, with *dry_run*, only list it)."""
    client = client if client is not None else make_client(config)
    keys = Keys(config.namespace)
    token = secrets.token_hex(8)
    if not dry_run and not client.set(keys.gc_lock, token, nx=True, px=GC_LEASE_MS):
        return GcResult(skipped=True)
    try:
        script = Script(client, load_script("gc"))
        engines, writers, tombstones, folded, unfolded = script(
            keys=[keys.engines, keys.writers, keys.seq],
            args=[keys.prefix, int(config.retention * 1000), "1" if dry_run else "0"],
        )
    finally:
        if not dry_run and client.get(keys.gc_lock) == token:
            client.delete(keys.gc_lock)
    return GcResult(
        sorted(int(e) for e in engines), list(writers), list(tombstones), int(folded), int(unfolded)
    )
