"""Retention: remove engines and writers that stopped heartbeating, one collector at a time.

``collect_garbage`` takes a short lease (``rs:{NS}:gc``, SET NX PX) so that when several processes
run it (every exporter may, on a timer) only one collects at a time, then runs ``gc.lua``, which
removes in one atomic step:

- engines whose last heartbeat is older than ``retention``: their counter and gauge hashes;
- writers silent (or closed) for longer than ``retention``: their chunks on every engine are
  folded into the engines' base fields (counter totals and histograms added, gauges dropped, see
  docs/key-schema.md), their heartbeat and self-metrics go; their sequence number becomes a
  tombstone, so a late flush from them is deduplicated or refused (the writer then continues
  under a new id). A closed writer's tombstone goes after one more retention; one that did not
  close keeps its tombstone while any engine of the shard is left;
- a shard left with no engine and no writer: every key, tombstones included (nothing is left for
  a tombstone to guard), so a namespace nobody writes to is no longer listed.

A sharded namespace is collected shard by shard (each shard is self-contained), under the one
lease in shard 0's root.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError, ResponseError

from redis_stats._scripts import Script, load_script
from redis_stats.config import RETENTION_FACTOR, StatsConfig
from redis_stats.connection import Client, make_client
from redis_stats.keys import Keys, parse_shard_counts
from redis_stats.ops.namespaces import judged_stale

__all__ = ["GcResult", "collect_garbage"]

GC_LEASE_MS = 60_000

# gc.lua is given the keys it may remove: those of the engines and writers past the retention
# when the lists were read, and of any that will be within this many ms (the call decides again,
# and leaves what it was not given the keys of for the next call: see gc.lua).
_AHEAD_MS = 5_000
_CALLS = 3  # calls per shard at most while the lists change under them


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
    """Shards not collected (their key prefix -> why: a key of the wrong type there, a right the
    user lacks, or the shard could not be reached); the others were."""


def namespace_shards(config: StatsConfig, client: Client) -> list[Keys]:
    """The keys of every shard of the namespace: shard 0, and shards 1..K-1 of the configured K
    and of every K its writers listed in shard 0's catalogue (``shards``, see docs/key-schema.md)."""
    keys = Keys(config.namespace)
    try:
        listed = parse_shard_counts(client.hget(keys.meta, "shards"))
    except ResponseError:  # the catalogue is not a hash: gc.lua does not read it; shard 0 only
        listed = set()
    return keys.all_shards(listed | {config.shards})


def collect_garbage(config: StatsConfig, *, dry_run: bool = False, client: Client | None = None) -> GcResult:
    """Remove what is past ``config.retention`` (or, with *dry_run*, only list it), in every
    shard of the namespace (one ``gc.lua`` call each, under the one lease of shard 0).

    A writer that did not close is removed only once it is silent for longer than the retention
    and than :data:`~redis_stats.config.RETENTION_FACTOR` times the ``stale_after`` readers judge
    it by (what it declared, or the one default when that is unusable: gc.lua is given it, see
    ``_core/read/liveness.py``): a retention too short for a writer configured apart from this process
    never removes that writer while readers may still call it live."""
    client = client if client is not None else make_client(config)
    keys = Keys(config.namespace)
    token = secrets.token_hex(8)
    if not dry_run and not client.set(keys.gc_lock, token, nx=True, px=GC_LEASE_MS):
        return GcResult(skipped=True)
    try:
        return _Collection(config, client, dry_run).run()
    finally:
        if not dry_run and client.get(keys.gc_lock) == token:
            client.delete(keys.gc_lock)


class _Collection:
    """One collection of every shard of a namespace, under the lease: shard 0 last (its
    catalogue lists K, dropped only once every other shard is empty)."""

    def __init__(self, config: StatsConfig, client: Client, dry_run: bool) -> None:
        self.config, self.client, self.dry_run = config, client, dry_run
        self.script = Script(client, load_script("gc"))
        self.shards = namespace_shards(config, client)
        self.live: list[dict[str, float] | None] = [None]
        if len(self.shards) > 1:
            self.live = _engine_heartbeats(client, self.shards)
        self.declared = _judged_stale(client, self.shards)
        self.out = GcResult()
        self.stale: dict[str, int] = {}  # engine -> in how many shards gc finds it silent
        self.held: dict[str, int] = {}  # ... and in how many shards collected it is listed
        self.emptied = 0  # shards left with nothing (their keys deleted)

    def run(self) -> GcResult:
        order = list(zip(self.shards, self.live))
        for shard, beats in order[1:] + order[:1]:
            try:
                found = self._collect(shard, beats)
            except RedisError as exc:
                # A key of the wrong type (garbage) in one shard, a right the user lacks, or a
                # shard that cannot be reached (its master down or cut off from this host: a
                # timeout, a refused connection) costs that shard's collection only: the others
                # are self-contained and still collected.
                self.out.failed[shard.prefix] = str(exc).split("\n")[0][:200]
                continue
            self._tally(found, beats)
        # An engine is removed when it is silent in every shard holding it (a dry run's lists
        # were made without the shared heartbeats: the same rule, applied here).
        self.out.engines = sorted(int(e) for e, n in self.stale.items() if n >= self.held.get(e, 0))
        return self.out

    def _collect(self, shard: Keys, beats: dict[str, float] | None) -> list[Any]:
        """``gc.lua``'s answer for *shard*."""
        many = len(self.shards) > 1
        if not self.dry_run and many:
            # After K changed, a live engine's old shard hears from it no more: give that shard
            # the engine's newest heartbeat of any shard, so gc removes an engine only once it
            # is silent everywhere (its old data is part of its live counters). If that fails
            # (NOPERM: no ZADD), the shard is not collected: gc.lua would delete a live
            # engine's old part there.
            _share_heartbeats(self.client, shard, beats, self.live)
        last = shard is self.shards[0]
        drop_meta = not last or self.emptied == len(self.shards) - 1
        for _ in range(_CALLS):
            keys, names = self._plan(shard)
            found: list[Any] = self.script(
                keys=keys,
                args=[
                    int(self.config.retention * 1000),
                    "1" if self.dry_run else "0",
                    "1" if drop_meta else "0",
                    RETENTION_FACTOR,
                    *names,
                    *self.declared,
                ],
            )
            if not int(found[6]):  # nothing deferred: the plan held every key needed
                break
        self.emptied += int(found[5])
        return found

    def _plan(self, shard: Keys) -> tuple[list[str], list[Any]]:
        """gc.lua's KEYS and the names they are for, from the lists as they are now: every
        listed engine's hash and base hash, the gauges hash of each engine past the retention (or nearly),
        the stats hash of each writer past it (or nearly)."""
        seconds, micros = self.client.time()
        cutoff = seconds * 1000 + micros // 1000 - int(self.config.retention * 1000) + _AHEAD_MS
        engines: Any = self.client.zrange(shard.engines, 0, -1, withscores=True)
        writers: Any = self.client.zrange(shard.writers, 0, -1, withscores=True)
        listed = [str(e) for e, _ in engines]
        stale = [str(e) for e, t in engines if t < cutoff]
        gone = [str(w) for w, t in writers if abs(t) < cutoff]
        keys = [
            shard.engines,
            shard.writers,
            shard.seq,
            shard.meta,
            shard.claims,
            shard.conflicts,
            shard.load,
            *(shard.counters(e) for e in listed),
            *(shard.base(e) for e in listed),
            *(shard.gauges(e) for e in stale),
            *(shard.writer_stats(w) for w in gone),
        ]
        return keys, [len(listed), len(stale), len(gone), *listed, *stale, *gone]

    def _tally(self, found: list[Any], beats: dict[str, float] | None) -> None:
        engines, writers, tombstones, folded, unfolded, *_ = found
        for e in engines:
            self.stale[e] = self.stale.get(e, 0) + 1
        for e in beats or engines:
            self.held[e] = self.held.get(e, 0) + 1
        out = self.out
        out.writers += (w for w in writers if w not in out.writers)
        out.tombstones += tombstones
        out.folded += int(folded)
        out.unfolded += int(unfolded)


def _judged_stale(client: Client, shards: list[Keys]) -> list[str]:
    """``writer, stale ms`` pairs: the ``stale_after`` every reader judges each listed writer by
    (:func:`~redis_stats.ops.namespaces.judged_stale`: what it declared in its home shard, or
    the one default), for gc.lua to judge the writer by in every shard."""
    return [x for w, ms in judged_stale(client, shards).items() for x in (w, repr(ms))]


def _engine_heartbeats(client: Client, shards: list[Keys]) -> list[dict[str, float] | None]:
    """Each shard's engines -> last heartbeat (None for a shard whose list cannot be read)."""
    out: list[dict[str, float] | None] = []
    for shard in shards:
        try:
            found: Any = client.zrange(shard.engines, 0, -1, withscores=True)
            out.append({str(e): float(t) for e, t in found})
        except RedisError:  # not a sorted set, or unreachable: gc.lua fails there too, and says so
            out.append(None)
    return out


def _share_heartbeats(
    client: Client, shard: Keys, beats: dict[str, float] | None, live: list[dict[str, float] | None]
) -> None:
    """Raise the heartbeat of each engine of *shard* to its newest in any shard (ZADD XX GT)."""
    if not beats:
        return
    newer: dict[str, float] = {}
    for other in live:
        for engine, t in (other or {}).items():
            if engine in beats and t > max(beats[engine], newer.get(engine, 0.0)):
                newer[engine] = t
    if newer:
        # Raises (a list retyped meanwhile, NOPERM): the caller then leaves this shard alone.
        client.zadd(shard.engines, newer, xx=True, gt=True)
