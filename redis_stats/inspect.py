"""``redis-stats inspect``: what a namespace holds — keys, engines, writers, series, memory."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from .config import StatsConfig
from .connection import make_client
from .integrations.vllm import vllm_catalog
from .keys import Keys
from .reader import StatsReader

__all__ = ["inspect_namespace"]


def inspect_namespace(config: StatsConfig) -> Iterator[str]:
    """Human-readable lines describing the namespace of *config*."""
    client = make_client(config)
    keys = Keys(config.namespace)
    snap = StatsReader(config, vllm_catalog(), client=client).snapshot()
    yield f"namespace {config.namespace!r} at {config.safe_url} (key prefix {keys.prefix})"
    meta = client.hgetall(keys.meta)
    specs = [f for f in meta if f.startswith("m:")]
    yield (
        f"  schema {meta.get('schema', '?')}, catalogue version {meta.get('_v', '?')}, "
        f"{len(specs)} metrics stored"
    )
    leader = client.get(keys.leader)
    if leader:
        holder, _, token = leader.rpartition("|")
        yield f"  log lease: {holder} (fencing token {token}, {client.pttl(keys.leader)} ms left)"
    yield f"  engines: {len(snap.engines)}"
    for e in sorted(snap.engines.values(), key=lambda e: e.engine):
        c_key, g_key = keys.counters(e.engine), keys.gauges(e.engine)
        c_fields, g_fields = client.hlen(c_key), client.hlen(g_key)
        state = "up" if e.up else "STALE"
        series = len(e.counters) + len(e.gauges) + len(e.histograms)
        yield (
            f"    engine {e.engine}: {state}, last heartbeat {e.age:.1f} s ago, {series} current series, "
            f"{c_fields} counter fields, {g_fields} gauge fields"
        )
    live = Counter(w.live for w in snap.writers.values())
    yield f"  writers: {len(snap.writers)} ({live[True]} live)"
    for wid, w in sorted(snap.writers.items(), key=lambda kv: kv[1].age):
        state = "closed" if w.closed else "live" if w.live else "stale"
        yield f"    {wid}: {state}, last heartbeat {w.age:.1f} s ago"
    if snap.skipped:
        yield f"  skipped fields (could not decode): {dict(snap.skipped)}"
