"""``redis-stats inspect``: what a namespace holds — keys, engines, writers, series, memory, and
what a reader skips (each bad key and field by name)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from redis.crc import key_slot
from redis.exceptions import ResponseError, SlotNotCoveredError

from redis_stats import codec
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import is_cluster, make_client
from redis_stats.errors import SchemaMismatch
from redis_stats.keys import Keys, parse_shard_counts
from redis_stats.reader import StatsReader
from redis_stats.snapshot import Skipped, Snapshot

__all__ = ["inspect_namespace"]


def _plural(n: int, word: str, words: str = "") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def _or_why(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, or why Redis refused it (a key of the wrong type: see "skipped" below)."""
    try:
        return call(*args)
    except ResponseError as exc:
        return f"unreadable ({str(exc).split(' ', 1)[0]})"


def stored_shard_counts(client: Any, keys: Keys) -> set[int]:
    """The K values shard 0's catalogue lists (none when it cannot be read)."""
    found = _or_why(client.hget, keys.meta, "shards")
    return parse_shard_counts(found)


def _engine_fields(client: Any, shards: list[Keys], engine: int) -> Any:
    """The field names of *engine*'s hash, over every shard holding one (two only while K changed),
    or why one cannot be read, with its key (the key of the shard holding it)."""
    names: list[str] = []
    for shard in shards:
        key = shard.counters(engine)
        found = _or_why(client.hkeys, key)
        if not isinstance(found, list):
            return f"{found} in {key}"
        names += found
    return names


def _shard_lines(client: Any, keys: Keys, shard_counts: list[int]) -> Iterator[str]:
    """One line per shard, named by its place in each split (``s of K``; shard 0 is every K's):
    its hash tag, its slot, and (on a Cluster) the master holding it, or "no node" when none
    serves that slot (a Cluster missing slots). Two splits whose shard has the same tag (see
    :meth:`Keys.all_shards`) are one shard: one line, with both names."""
    labels: dict[Keys, list[str]] = {keys: ["0 (every K)"]}
    for k in sorted(set(shard_counts) - {1}):
        for s in range(1, k):
            labels.setdefault(keys.shard(s, k), []).append(f"{s} of K={k}")
    yield f"  shards: {len(labels)} (K = {', '.join(map(str, shard_counts))}; engine e in shard e % K)"
    for shard, names in labels.items():
        slot = key_slot(shard.seq.encode())
        where = ""
        if is_cluster(client):
            try:  # redis-py raises for a slot no node serves (a Cluster missing slots)
                node = client.get_node_from_key(shard.seq)
            except SlotNotCoveredError:
                node = None
            where = f", on {node.host}:{node.port}" if node is not None else ", no node"
        yield f"    shard {' = '.join(names)}: keys {shard.prefix}*, slot {slot}{where}"


def inspect_namespace(config: StatsConfig, catalog: Catalog | None = None) -> Iterator[str]:
    """Human-readable lines describing the namespace of *config*.

    The metrics are those the namespace stores (every writer stores its catalogue); *catalog*
    adds local definitions (``redis-stats inspect`` passes vLLM's, the integration's default).
    """
    client = make_client(config)
    keys = Keys(config.namespace)
    header = f"namespace {config.namespace!r} at {config.safe_url} (key prefix {keys.prefix})"
    try:
        snap = StatsReader(config, catalog, client=client).snapshot()
    except SchemaMismatch as exc:
        yield header
        yield f"  {exc}"
        return
    yield header
    reader = StatsReader(config, catalog, client=client)
    reader.shard_counts = reader.shard_counts | stored_shard_counts(client, keys)
    shards = reader.shard_keys
    if len(shards) > 1:
        yield from _shard_lines(client, keys, sorted(reader.shard_counts))
    yield _catalogue_line(client, keys)
    yield from _memory_lines(client)
    yield from _lease_lines(client, keys)
    yield from _engine_lines(client, shards, snap)
    yield from _writer_lines(snap)
    yield from _skipped_lines(snap)


def _catalogue_line(client: Any, keys: Keys) -> str:
    meta = _or_why(client.hgetall, keys.meta)
    if not isinstance(meta, dict):
        return f"  catalogue {keys.meta}: {meta}"
    specs = [f for f in meta if f.startswith("m:")]
    return (
        f"  schema {meta.get('schema', '?')}, catalogue version {meta.get('_v', '?')}, "
        f"{len(specs)} metrics stored"
    )


def _memory_lines(client: Any) -> Iterator[str]:
    """The server's maxmemory policy and the keys it evicted so far (``INFO``): the store needs
    ``noeviction`` or a ``volatile-*`` policy (docs/redis-servers.md, "Redis memory:
    maxmemory-policy"). Said only where the user may run ``INFO`` on one server (a Cluster answers
    per node: not summed here)."""
    try:
        memory, stats = client.info("memory"), client.info("stats")
    except Exception as exc:  # no +info for this user, or a Cluster's per-node answer
        yield f"  memory: INFO not available ({type(exc).__name__})"
        return
    policy = memory.get("maxmemory_policy")
    if policy is None or "evicted_keys" not in stats:
        return
    limit = int(memory.get("maxmemory", 0) or 0)
    evicted = stats["evicted_keys"]
    line = f"  memory: maxmemory {limit or 'none'}, policy {policy}, {evicted} keys evicted since start"
    if limit and policy.startswith("allkeys"):
        line += " (allkeys-* evicts this store's keys too: use noeviction or volatile-*)"
    yield line


def _lease_lines(client: Any, keys: Keys) -> Iterator[str]:
    """Who holds the log lease, when one does."""
    leader = _or_why(client.get, keys.leader)
    if leader and leader.startswith("unreadable"):
        yield f"  log lease {keys.leader}: {leader}"
    elif leader:
        holder, _, token = leader.rpartition("|")
        yield f"  log lease: {holder} (fencing token {token}, {client.pttl(keys.leader)} ms left)"


def _engine_lines(client: Any, shards: list[Keys], snap: Snapshot) -> Iterator[str]:
    yield f"  engines: {len(snap.engines)}"
    for e in sorted(snap.engines.values(), key=lambda e: e.engine):
        names = _engine_fields(client, shards, e.engine)
        state = "up" if e.up else "DOWN"
        series = len(e.counters) + len(e.gauges) + len(e.histograms)
        layout = _storage(names) if isinstance(names, list) else f"its hash {names}"
        yield (
            f"    engine {e.engine}: {state}, last heartbeat {e.age:.1f} s ago, "
            f"{_plural(series, 'series', 'series')}, {layout}"
        )


def _storage(names: list[str]) -> str:
    """How an engine's hash stores its series: by how many writers, in how many chunks."""
    chunks = [f for f in names if f.startswith(codec.CHUNK_PREFIX) and not f.endswith(codec.NAMES_SUFFIX)]
    writers = {codec.chunk_writer(f) for f in chunks}
    # The nouns of docs/architecture.md: series, writers, chunks; what gc folded in from
    # departed writers is counted as series too (key-schema's "base fields").
    folded = sum(not f.startswith(codec.CHUNK_PREFIX) for f in names)
    layout = f"stored by {_plural(len(writers), 'writer')} in {_plural(len(chunks), 'chunk')}"
    if folded:
        layout += f", {_plural(folded, 'series', 'series')} folded in from departed writers by gc"
    return layout


def _writer_lines(snap: Snapshot) -> Iterator[str]:
    live = Counter(w.live for w in snap.writers.values())
    yield f"  writers: {len(snap.writers)} ({live[True]} live)"
    for wid, w in sorted(snap.writers.items(), key=lambda kv: kv[1].age):
        state = "closed" if w.closed else "live" if w.live else "stale"
        # Keys this writer found gone (evicted, deleted) and stored again: lost:<kind> -> count.
        lost = ", ".join(f"{k[5:]} {v}" for k, v in sorted(w.stats.items()) if k.startswith("lost:"))
        yield f"    {wid}: {state}, last heartbeat {w.age:.1f} s ago" + (
            f", found its keys gone: {lost}" if lost else ""
        )


def _skipped_lines(snap: Snapshot) -> Iterator[str]:
    """What the reader could not decode: counts, then each bad key and field it names."""
    if not snap.skipped:
        return
    yield f"  skipped (could not decode): {dict(sorted(snap.skipped.items()))}"
    where = snap.skipped.where if isinstance(snap.skipped, Skipped) else []
    for reason, key, field in where:
        yield f"    {reason}: key {key}" + (f" field {field!r}" if field else " (the whole key)")
    more = sum(snap.skipped.values()) - len(where)
    if more > 0:
        yield f"    ... and {more} more"
