"""The namespaces a Redis holds: found by their keys (``SCAN``), on every master of a Cluster.

A namespace exists in Redis as soon as a writer has flushed to it: its data keys all start with
``rs:{NS}:v<schema>:`` (docs/key-schema.md), and ``…:writers`` (a writer's heartbeat) or
``…:meta`` (the stored catalogue) is always among them. Keys of schema 1 (redis_stats before
issue 15: ``rs:{NS}:meta``, no version) are found too, and said to be another version's.
``redis-stats namespaces`` lists them; ``inspect``, ``top`` and ``gc`` name them when given a
namespace that holds nothing.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass
from typing import Any

import redis

from redis_stats import codec
from redis_stats._core.read.liveness import Liveness, declared, judged_ms
from redis_stats.codec import FLUSH_FIELD, STALE_FIELD
from redis_stats.config import is_namespace
from redis_stats.connection import is_cluster
from redis_stats.keys import SCHEMA_VERSION, Keys, parse_shard_counts

__all__ = [
    "NamespaceInfo",
    "NamespaceScan",
    "closest_live",
    "describe_namespaces",
    "find_namespaces",
    "namespace_holds_data",
    "scan_namespaces",
    "unusable_line",
]

# The keys that mark a namespace: any flush writes the writers' heartbeats, and the first one the
# catalogue (meta). A namespace cannot contain braces (config checks it), so the text between
# ``rs:{`` and the first ``}:`` is the namespace; then ``v<schema>:`` and the marker, or the marker
# alone for schema 1, which had no version in its keys.
_MARKERS = ("meta", "writers", "engines")
_OURS = tuple(f"v{SCHEMA_VERSION}:{m}" for m in _MARKERS)
_SCHEMA_1 = (
    "holds only data of an older redis_stats (schema 1, keys rs:{{{ns}}}:meta ...): read it with that "
    "version, or delete those keys once every process runs this one"
)


@dataclass(frozen=True)
class NamespaceInfo:
    """What one namespace holds, at a glance."""

    namespace: str
    engines: int
    engines_up: int
    writers: int
    writers_live: int
    last_heartbeat_age: float | None
    """Seconds since the newest engine heartbeat (server time); None when no engine has one."""
    problem: str | None = None
    """Why the namespace could not be read (a key of the wrong type), if it could not."""


def _scan(client: Any, pattern: str) -> list[str]:
    """Every key matching *pattern*; on a Cluster, every master's (``SCAN`` is per node)."""
    from redis.cluster import RedisCluster

    if is_cluster(client):
        return list(client.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES))
    return list(client.scan_iter(match=pattern, count=1000))


@dataclass(frozen=True)
class NamespaceScan:
    """What one ``SCAN`` of ``rs:{*}:*`` found: the namespaces with data of this schema version
    (*current*), those with schema 1 data (*older*), and the key prefixes ``rs:{...}`` of this
    layout that are no namespace name this version accepts (*unusable*: a space, a ``*``, a
    quote; written by hand or by another program): no command can be given them, so none lists
    them as namespaces."""

    current: frozenset[str]
    older: frozenset[str]
    unusable: frozenset[str]


def find_namespaces(client: Any) -> list[str]:
    """The namespaces with data in this Redis (database), sorted. One SCAN pass over ``rs:{*}``."""
    scan = scan_namespaces(client)
    return sorted(scan.current | scan.older)


def scan_namespaces(client: Any) -> NamespaceScan:
    """One ``SCAN`` pass over ``rs:{*}`` (every master of a Cluster), sorted into
    :class:`NamespaceScan`."""
    found: dict[str, set[str]] = {"current": set(), "older": set(), "unusable": set()}
    for key in _scan(client, "rs:{*}:*"):
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        inner = key[len("rs:{") :]
        end = inner.find("}:")
        if end <= 0:
            continue
        rest = inner[end + 2 :]
        # A shard's tag is "<namespace>#<shard>.<salt>" ('#' is never part of a namespace).
        name = inner[:end].split("#", 1)[0]
        which = "current" if rest in _OURS else "older" if rest in _MARKERS else None
        if which is not None:
            found[which if is_namespace(name) else "unusable"].add(name)
    return NamespaceScan(*(frozenset(found[k]) for k in ("current", "older", "unusable")))


def namespace_holds_data(client: Any, namespace: str) -> bool:
    """True when the namespace has a writer, an engine or a stored catalogue.

    Only commands the least-privilege reader ACL has (docs/acl.md: ``+zrange +hget``, no
    ``EXISTS``), so a reader can run ``top`` as before.
    """
    keys = Keys(namespace)
    return bool(
        client.zrange(keys.writers, 0, 0)
        or client.zrange(keys.engines, 0, 0)
        or client.hget(keys.meta, "schema")
        or client.hget(keys.meta, "shards")  # a sharded namespace whose shard 0 is empty
    )


def _listed(scan: NamespaceScan) -> tuple[list[str], frozenset[str]]:
    """The namespaces a scan found (sorted), and those holding only schema 1 data."""
    return sorted(scan.current | scan.older), scan.older - scan.current


def describe_namespaces(
    client: Any, stale_after: float, names: list[str] | None = None, *, scan: NamespaceScan | None = None
) -> list[NamespaceInfo]:
    """Engines (up), writers (live) and newest heartbeat of each namespace (*names*, or those
    *scan* found, or those a scan finds now), by the rule every reader applies
    (:mod:`redis_stats._core.read.liveness`); *stale_after* (seconds) only for writers that stored
    none."""
    only_older: frozenset[str] = frozenset()
    if names is None:
        names, only_older = _listed(scan or scan_namespaces(client))
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    infos = []
    for ns in names:
        if ns in only_older:
            infos.append(NamespaceInfo(ns, 0, 0, 0, 0, None, problem=_SCHEMA_1.format(ns=ns)))
            continue
        keys = Keys(ns)
        try:
            engines, writers, owners, stats = _liveness_inputs(client, keys)
        except redis.ResponseError as exc:  # one bad key costs its namespace's line only
            infos.append(NamespaceInfo(ns, 0, 0, 0, 0, None, problem=str(exc).split("\n")[0][:120]))
            continue
        # The rule every reader applies (from what the writers stored), not a setting of ours.
        rule = Liveness.of(now_ms, stats, stale_after * 1000)
        live = {w for w, score in writers.items() if rule.writer_live(w, score)}
        beats = list(engines.values())
        newest = max(beats) if beats else None
        infos.append(
            NamespaceInfo(
                namespace=ns,
                engines=len(engines),
                engines_up=sum(rule.engine_up(s, owners.get(e, ()), live) for e, s in engines.items()),
                writers=len(writers),
                writers_live=len(live),
                last_heartbeat_age=None if newest is None else max(0.0, (now_ms - newest) / 1000),
            )
        )
    return infos


def declared_stale(client: Any, shard: Keys) -> dict[str, float | None]:
    """Every writer *shard* lists -> the ``stale_after`` (ms) it declared in its stats hash there
    (:func:`~redis_stats._core.read.liveness.declared`), None when nothing usable is there (garbage,
    or not its home shard: the others hold none). A key of the wrong type declares nothing; a
    failure to reach the shard is raised."""
    try:
        writers: Any = client.zrange(shard.writers, 0, -1)
    except redis.exceptions.ResponseError:  # not a sorted set: no writer is listed in it
        return {}
    pipe = client.pipeline(transaction=False)
    for w in writers:  # two HGETs (the least-privilege ACLs grant HGET, not HMGET)
        pipe.hget(shard.writer_stats(w), STALE_FIELD)
        pipe.hget(shard.writer_stats(w), FLUSH_FIELD)
    replies = pipe.execute(raise_on_error=False)
    # (an error reply: a wrong type); a stale_ms below the writer's own flush_ms is not usable
    return {w: declared(stale, flush)[0] for w, stale, flush in zip(writers, replies[0::2], replies[1::2])}


def judged_stale(client: Any, shards: list[Keys]) -> dict[str, float]:
    """Every writer any of *shards* lists -> the ``stale_after`` (ms) every reader judges it by
    (:func:`~redis_stats._core.read.liveness.judged_ms` of what it declared in its home shard): gc and
    ``drop-namespace`` judge each writer by the readers' rule, so they never take a writer a
    reader calls live for gone. A shard that cannot be reached adds nothing (its collection
    fails too, and says so)."""
    declared: dict[str, float | None] = {}
    for shard in shards:
        try:
            found = declared_stale(client, shard)
        except redis.exceptions.RedisError:
            continue
        for w, ms in found.items():
            if declared.get(w) is None:
                declared[w] = ms
    return {w: judged_ms(ms) for w, ms in declared.items()}


def _liveness_inputs(
    client: Any, keys: Keys
) -> tuple[dict[str, float], dict[str, float], dict[str, set[str]], dict[str, dict[str, str]]]:
    """Of every shard of a namespace (the K values its writers listed in shard 0's catalogue):
    each engine's newest heartbeat, each writer's latest entry, the writers holding chunks in each
    engine, and the ``stale_ms`` each writer stored (an engine is counted once, in two shards only
    while K changed; a writer once)."""
    engines: dict[str, float] = {}
    writers: dict[str, float] = {}
    owners: dict[str, set[str]] = {}
    stats: dict[str, dict[str, str]] = {}
    for shard in keys.all_shards(parse_shard_counts(client.hget(keys.meta, "shards"))):
        shard_engines = client.zrange(shard.engines, 0, -1, withscores=True)
        shard_writers = client.zrange(shard.writers, 0, -1, withscores=True)
        for e, score in shard_engines:
            engines[e] = max(score, engines.get(e, score))
        for w, score in shard_writers:
            if abs(score) >= abs(writers.get(w, 0.0)):
                writers[w] = score
        _read_details(
            client, shard, [w for w, _ in shard_writers], [e for e, _ in shard_engines], owners, stats
        )
    return engines, writers, owners, stats


def _read_details(
    client: Any,
    shard: Keys,
    writers: list[str],
    engines: list[str],
    owners: dict[str, set[str]],
    stats: dict[str, dict[str, str]],
) -> None:
    """Add to *stats* the ``stale_ms`` and ``flush_ms`` each of *writers* stored in *shard*, and
    to *owners* the writers holding chunks in each of *engines* (one pipeline; an unreadable key
    adds nothing)."""
    pipe = client.pipeline(transaction=False)
    for w in writers:  # two HGETs (the least-privilege ACLs grant HGET, not HMGET)
        pipe.hget(shard.writer_stats(w), STALE_FIELD)
        pipe.hget(shard.writer_stats(w), FLUSH_FIELD)
    for e in engines:
        pipe.hkeys(shard.counters(e))
    replies = pipe.execute(raise_on_error=False)
    for w, stale, flush in zip(writers, replies[0::2], replies[1 : 2 * len(writers) : 2]):
        held = {f: v for f, v in ((STALE_FIELD, stale), (FLUSH_FIELD, flush)) if isinstance(v, str)}
        if held:
            stats.setdefault(w, {}).update(held)
    for e, names in zip(engines, replies[2 * len(writers) :]):
        if isinstance(names, list):
            found = owners.setdefault(e, set())
            found.update(owner for name in names if (owner := codec.chunk_writer(name)) is not None)


def unusable_line(prefix: str) -> str:
    """What ``redis-stats namespaces`` says of a key prefix that is no namespace name: what it is
    and how to remove it (no redis-stats command takes the name)."""
    pattern = shlex.quote(f"rs:{{{prefix}}}:*")
    return (
        f"{prefix!r}: keys rs:{{...}}:* under a name that is no namespace name (1-128 of A-Z a-z "
        "0-9 . _ - / :), not written by redis_stats; no command reads them; to delete them: "
        f"redis-cli --scan --pattern {pattern} | xargs redis-cli del"
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary(info: NamespaceInfo) -> str:
    """One line: ``demo: 2 engines (2 up), 4 writers (4 live), last heartbeat 0.3 s ago``."""
    if info.problem is not None:
        return f"{info.namespace}: unreadable ({info.problem})"
    if info.engines == 0 and info.writers == 0:
        # Left so by an older version's gc (it kept a namespace while a closed writer's tombstone
        # remained), or holding a catalogue only: one gc deletes a namespace with neither.
        command = f"redis-stats gc --namespace {shlex.quote(info.namespace)}"
        return f"{info.namespace}: empty (no engine, no writer): `{command}` removes it"
    beat = (
        "no heartbeat"
        if info.last_heartbeat_age is None
        else f"last heartbeat {info.last_heartbeat_age:.1f} s ago"
    )
    return (
        f"{info.namespace}: {_plural(info.engines, 'engine')} ({info.engines_up} up), "
        f"{_plural(info.writers, 'writer')} ({info.writers_live} live), {beat}"
    )


def closest_live(wanted: str, infos: list[NamespaceInfo]) -> NamespaceInfo | None:
    """The namespace of *infos* (other than *wanted*) whose name is most like *wanted*
    (``difflib``'s ratio), among those with an engine up; among every readable one when none has
    one up; None when there is none. What a hint for a misspelt namespace names: ``lama`` is
    ``llama`` (2 engines up), not the alphabetically first namespace with nothing live."""
    readable = sorted(
        (i for i in infos if i.problem is None and i.namespace != wanted), key=lambda i: i.namespace
    )
    pool = [i for i in readable if i.engines_up] or readable
    if not pool:
        return None
    return max(pool, key=lambda i: difflib.SequenceMatcher(None, wanted, i.namespace).ratio())
