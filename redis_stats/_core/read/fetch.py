"""What one read fetches of a shard, as commands, and its results as a reply.

A :class:`Fetch` says what a feed reads of each shard (the snapshot's every series, the lean
snapshot's, the load feed's); :meth:`Fetch.reads` lists those reads for a plan (the engines and
writers the last read found), :func:`transaction` and :func:`script_calls` carry them as one
``MULTI`` or as ``read.lua`` calls, and :func:`shard_reply` takes one shard's results apart into
a :class:`~redis_stats._core.read.decoder.ShardReply` and the plan of the next read. No I/O:
redis_stats/reader.py runs the loop (docs/architecture.md, "The read path").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis_stats._core.read.decoder import ShardReply
from redis_stats._core.read.slices import is_among
from redis_stats.codec import LIVENESS_FIELDS, chunk_writer
from redis_stats.keys import Keys

Plan = tuple[tuple[str, ...], tuple[str, ...]]
"""The engines and writers of one shard a read asks for: those its last read found."""

MAX_SCRIPT_WORDS = 3_900
"""The words of one ``read.lua`` call's keys and their own arguments at most: a call is
``EVALSHA_RO sha numkeys keys... how fields... own...``, one word per key and one more per key
read by its own field (``f``: that field is an argument), and some managed stores (ElastiCache
Serverless) refuse a command of more than 3,999 words. The rest (the command, the SHA, the key
count, ``how`` and the few ``g`` field names) fits in the 99 left. A shard with more is read in
several calls, each atomic in itself."""

_FIXED = 5  # the reads every shard starts with (Fetch.reads): engines, writers, _v, shards, own


KeyRead = tuple[str, str, str]
"""One read of a key: ``(how, key, field)``, how as read.lua's letters: ``"z"`` a sorted set,
``"h"`` a hash, ``"k"`` its field names, ``"g"`` one *field* (one of a few that many keys
share: a digit in read.lua's letters), ``"f"`` one *field* of this key's own (a writer's entry
of the seq hash)."""


@dataclass(frozen=True)
class Fetch:
    """What a read fetches of each shard besides its lists: the feed's *own* hash (a
    :class:`~redis_stats.keys.Keys` property), how each engine's hash is read (*engine*:
    ``"h"`` its fields and values, ``"k"`` its field names), whether each engine's *base* hash
    is read too (departed writers' totals), how each writer's stats hash is read (*writer*:
    ``"h"`` whole, ``"g"`` its :data:`~redis_stats._core.read.liveness.LIVENESS_FIELDS` only:
    ``stale_ms``, ``flush_ms``, ``endpoint``, one ``HGET`` each of the same declared key), and
    whether each writer's entry of the shard's seq hash is read with its stats (*seq*: its
    newest applied flush, one ``HGET`` of its own field: never the whole hash, which keeps a
    tombstone of every writer that died)."""

    name: str
    own: str
    engine: str
    base: bool
    writer: str
    seq: bool = False
    bookings: bool = False
    """Read the shard's routers' bookings and leases too (the ``bookings`` hash, the ``routers``
    zset: small, the unconfirmed dispatches only), after the lists."""
    owners: bool = False
    """Read only the writers holding chunks in the engines read (found in their hashes' field
    names), not every writer listed: a view of a few engines that shows no writer's self-metrics
    (an endpoint view); its reply lists those writers only."""
    writer_fields: tuple[str, ...] = field(init=False)
    """The fields read of each writer's stats hash: :data:`LIVENESS_FIELDS` when *writer* is
    ``"g"``, none (the whole hash) when ``"h"``; set from *writer* when the fetch is made."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "writer_fields", LIVENESS_FIELDS if self.writer == "g" else ())

    def reads(self, keys: Keys, plan: Plan) -> list[list[KeyRead]]:
        """The reads of one shard for *plan*, in groups that one call must hold together: the
        lists, then each engine's (its hash, and its base hash), then each writer's."""
        out = [
            [
                ("z", keys.engines, ""),
                ("z", keys.writers, ""),
                ("g", keys.meta, "_v"),
                ("g", keys.meta, "shards"),
                ("h", getattr(keys, self.own), ""),
            ]
        ]
        if self.bookings:
            out[0] += [("h", keys.bookings, ""), ("z", keys.routers, "")]

        for e in plan[0]:
            group = [(self.engine, keys.counters(e), "")]
            if self.base:  # an engine's two hashes in one call: gc moves values from one to the other
                group.append(("h", keys.base(e), ""))
            out.append(group)
        wanted = self.writer_fields or ("",)
        for w in plan[1]:
            stats = keys.writer_stats(w)
            group = [(self.writer, stats, f) for f in wanted]
            if self.seq:
                group.append(("f", keys.seq, w))
            out.append(group)
        return out


SNAPSHOT = Fetch("snapshot", "conflicts", "h", True, "h")
"""Every series: the engines' hashes and base hashes, the writers' stats, the conflicts."""

SNAPSHOT_LEAN = Fetch("snapshot-lean", "conflicts", "h", True, "g", owners=True)
"""Every series as :data:`SNAPSHOT`, but of the writers holding chunks in the engines read only,
and of each only what liveness and the endpoint views need (``stale_ms``, ``flush_ms``,
``endpoint``), not its self-metrics: for a view that shows no ``redis_stats_writer_*`` (an
endpoint view), whose read of a few engines of a large fleet was otherwise mostly every writer's
stats (6,144 reads of writers' fields for a 4-engine endpoint at 2,048 writers)."""

LOAD = Fetch("load", "load", "k", False, "g", seq=True, bookings=True)
"""The load feed: the load hash, each writer's entry of the seq hash (its newest flush), the engines' field
names (their chunk writers), the writers' ``stale_ms``, ``flush_ms`` and ``endpoint``; never an
engine's values (an engine hash holds ~28 KB at vLLM's catalogue)."""


def transaction(shard_reads: list[list[list[KeyRead]]]) -> list[tuple[Any, ...]]:
    """One ``MULTI`` … ``EXEC`` of every shard's reads, after ``TIME``: each read as the native
    command read.lua runs for it."""
    cmds: list[tuple[Any, ...]] = [("MULTI",), ("TIME",)]
    cmds += [
        ("ZRANGE", key, 0, -1, "WITHSCORES")
        if how == "z"
        else ("HGET", key, field)
        if how in "gf"
        else ("HGETALL" if how == "h" else "HKEYS", key)
        for groups in shard_reads
        for group in groups
        for how, key, field in group
    ]
    cmds.append(("EXEC",))
    return cmds


def script_calls(groups: list[list[KeyRead]]) -> list[tuple[list[str], list[str]]]:
    """One shard's reads as ``read.lua`` calls (KEYS, ARGV) of at most :data:`MAX_SCRIPT_WORDS`
    words of keys and own fields each, a group never split over two calls."""
    parts: list[list[KeyRead]] = [[]]
    words = 0
    for group in groups:
        size = len(group)
        for how, _, _ in group:
            if how == "f":  # its field is an argument of its own
                size += 1
        if parts[-1] and words + size > MAX_SCRIPT_WORDS:
            parts.append([])
            words = 0
        parts[-1] += group
        words += size
    calls = []
    for part in parts:
        fields = list(dict.fromkeys(field for how, _, field in part if how == "g"))
        how = "".join(str(1 + fields.index(field)) if h == "g" else h for h, _, field in part)
        own = [field for h, _, field in part if h == "f"]
        calls.append(([key for _, key, _ in part], [how, *fields, *own]))
    return calls


def time_ms(time: Any) -> float:
    return int(time[0]) * 1000 + int(time[1]) // 1000


def shard_reply(
    fetch: Fetch, keys: Keys, plan: Plan, now_ms: float, results: list[Any], wanted: Any
) -> tuple[ShardReply, Plan]:
    """One shard's results (in the order of :meth:`Fetch.reads` for *plan*, each flat: RESP2's
    shape) as its reply, and what it found: the plan of the next read. Of what the lists hold and
    *plan* did not (or the reverse), the reply shows what was both listed and read."""
    engine_flat, writer_flat, version, listed, own = results[:_FIXED]
    bookings = routers = None
    if fetch.bookings:
        bookings, routers = results[_FIXED : _FIXED + 2]
        results = results[:_FIXED] + results[_FIXED + 2 :]
    # The lists in member order, not Redis' (by heartbeat, which a live fleet reorders with every
    # flush): the plan compares equal while the same engines and writers are listed, so a read
    # is not made again for an order and its commands stay packed (in a fleet of 2,048 flushing
    # writers nearly every read was made two or three times: /load's refresh 40 -> 560 ms).
    engine_flat, writer_flat = _by_member(engine_flat), _by_member(writer_flat)
    version = "" if version is None else version  # no catalogue yet
    if wanted is not None and engine_flat.__class__ is list:
        held = is_among(wanted)
        engine_flat = [x for e, s in zip(engine_flat[0::2], engine_flat[1::2]) if held(e) for x in (e, s)]
    each = 2 if fetch.base else 1  # reads per engine
    end = _FIXED + each * len(plan[0])
    hashes, bases, stats = results[_FIXED:end:each], results[_FIXED + 1 : end : each], results[end:]
    found = _found(fetch, engine_flat, writer_flat, hashes)
    stats, seq = _writer_parts(fetch, plan[1], stats)
    if found != plan or fetch.owners:  # what was read of what is still listed (owners: of those)
        read = dict(zip(plan[0], zip(hashes, bases) if fetch.base else hashes))
        engine_flat, parts = _read_of(engine_flat, read)
        hashes, bases = ([p[0] for p in parts], [p[1] for p in parts]) if fetch.base else (parts, [])
        writer_flat, stats = _read_of(writer_flat, dict(zip(plan[1], stats)))
    conflicts, load = (own, None) if fetch.own == "conflicts" else (None, own)
    reply = ShardReply(
        keys,
        now_ms,
        engine_flat,
        writer_flat,
        version,
        listed,
        conflicts,
        load,
        hashes,
        bases,
        stats,
        seq,
        bookings,
        routers,
    )
    return reply, found


def _by_member(flat: Any) -> Any:
    """A zset's flat ``[member, score, ...]`` reply in member order (anything else as it is)."""
    if flat.__class__ is not list or len(flat) < 4:
        return flat
    pairs = sorted(zip(flat[0::2], flat[1::2]), key=lambda pair: str(pair[0]))
    return [x for pair in pairs for x in pair]


def _found(fetch: Fetch, engine_flat: Any, writer_flat: Any, hashes: list[Any]) -> Plan:
    """The plan of the next read: the engines listed (and wanted), and the writers listed, or
    with :attr:`Fetch.owners` those of them holding chunks in the engines read (a new one since:
    read again)."""
    writers = tuple(writer_flat[0::2]) if writer_flat.__class__ is list else ()
    if fetch.owners:
        held = _owners(hashes, fetch.engine)
        writers = tuple(w for w in writers if w in held)
    return tuple(engine_flat[0::2]) if engine_flat.__class__ is list else (), writers


def _owners(hashes: list[Any], how: str) -> set[str]:
    """The writers holding chunks in the engine hashes read (*how*: ``"h"`` flat fields and
    values, ``"k"`` field names), by their chunks' field names."""
    held: set[str] = set()
    for flat in hashes:
        if flat.__class__ is list:
            names = flat[0::2] if how == "h" else flat
            held.update(
                w for name in names if name.__class__ is str and (w := chunk_writer(name)) is not None
            )
    return held


def _writer_parts(fetch: Fetch, writers: tuple[str, ...], results: list[Any]) -> tuple[list[Any], Any]:
    """The writers' part of one shard's results (in the order of *writers*): each writer's stats
    (its hash flat, as a whole-hash read gives it), and, when *fetch* reads them, the writers'
    entries of the seq hash, flat, as that hash read whole would give them (else None)."""
    seq = None
    if fetch.seq:  # each writer's entry of the seq hash, last of its group
        n = len(fetch.writer_fields or ("",))
        entries, results = results[n :: n + 1], [v for i, v in enumerate(results) if (i + 1) % (n + 1)]
        seq = [x for w, v in zip(writers, entries) if v.__class__ is str for x in (w, v)]
    if fetch.writer_fields:  # a writer's fields read one by one: as a hash of those it holds
        results = _fields_of(fetch.writer_fields, results)
    return results, seq


def _fields_of(names: tuple[str, ...], values: list[Any]) -> list[Any]:
    """Each writer's *names* fields, read one by one (``len(names)`` values per writer, in
    order), as the flat hash of those it holds; a writer none of whose fields could be read (its
    key of the wrong type) is that error, as a whole-hash read gives it."""
    n = len(names)
    out: list[Any] = []
    for i in range(0, len(values), n):
        got = values[i : i + n]
        flat = [x for name, v in zip(names, got) if v.__class__ is str for x in (name, v)]
        errors = [v for v in got if isinstance(v, Exception)]
        out.append(errors[0] if errors and not flat else flat)
    return out


def _read_of(flat: Any, read: dict[str, Any]) -> tuple[Any, list[Any]]:
    """A list read flat cut down to the members *read* holds, and their parts in its order."""
    if flat.__class__ is not list:
        return flat, []
    kept = [x for m, s in zip(flat[0::2], flat[1::2]) if m in read for x in (m, s)]
    return kept, [read[m] for m in kept[0::2]]
