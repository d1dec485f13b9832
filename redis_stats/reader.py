"""StatsReader: one round trip to Redis returns a consistent :class:`~redis_stats._core.snapshot.Snapshot`."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.exceptions import ExecAbortError, OutOfMemoryError, ResponseError

from redis_stats._core import fields
from redis_stats._core.liveness import Liveness
from redis_stats._core.slices import EngineSlice
from redis_stats._core.snapshot import EngineKey, Snapshot, SnapshotDecoder, SplitKey, unreadable
from redis_stats._core.steps import Steps, run
from redis_stats._scripts import ReadOnlyScript, load_script
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, is_cluster, make_client
from redis_stats.keys import MAX_LISTED_SHARDS, Keys, parse_layouts
from redis_stats.load import LoadView, load_view

__all__ = [
    "EngineSlice",
    "Engines",
    "MergedReply",
    "ReaderCore",
    "StatsReader",
    "merge_shards",
    "note_unreadable",
]

log = logging.getLogger("redis_stats.reader")

Plan = tuple[tuple[str, ...], tuple[str, ...]]  # (engines, writers) a transaction read asks for
# One read without its I/O (ReaderCore.read_steps): yields (what, argument) steps, is sent their
# results, returns the read.lua-shaped reply.
ReadSteps = Steps[list[Any]]
LoadSteps = Steps[LoadView]
# What a read reads: every engine (None), these engine indexes, or a slice of the fleet.
Engines = Iterable[int] | EngineSlice | None


def _layouts(meta_flat: Any) -> set[int]:
    """The K values listed in a catalogue's ``shards`` field (see :func:`parse_layouts`)."""
    if meta_flat.__class__ is not list:
        return set()
    for name, value in zip(meta_flat[0::2], meta_flat[1::2]):
        if name == "shards":
            return parse_layouts(value)
    return set()


class MergedReply(list):  # type: ignore[type-arg]
    """A read.lua-shaped reply merged from the shards' replies, with :attr:`unreadable`: the
    ``(reason, key)`` of each shard's list, catalogue or engine hash that could not be read (a
    key of the wrong type) and is therefore not in the reply for the decoder to count; and
    :attr:`hash_keys`: the key each engine's hash of the reply was read from, in their order
    (the decoder names what it skips of a hash by it). Likewise, for what the decoder skips of
    the other parts a shard holds: :attr:`engine_keys`, the ``engines`` zset each engine of the
    reply was listed in; :attr:`writer_keys`, the key each writer's self-metrics were read from;
    :attr:`conflict_keys`, the ``conflicts`` hash each field of the merged one came from. Each is
    None when the merge was not given the shards' keys (the decoder names shard 0's).

    :attr:`shard_writers` (each shard's ``writers`` zset as read, flat, or the error reading it)
    and :attr:`engine_shards` (the shards each engine of the reply was read from, in their
    order) let the decoder judge a writer's gauges in an engine by its heartbeats in the shards
    holding that engine: a writer cut off from one shard alone stays live in the merged list
    (its other shards' heartbeats), but its values in that shard are frozen."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.shard_writers: list[Any] = []
        self.engine_shards: list[tuple[int, ...]] = []
        self.unreadable: list[tuple[str, str]] = []
        self.hash_keys: list[EngineKey] | None = None
        self.engine_keys: list[EngineKey] | None = None
        self.writer_keys: list[str] | None = None
        self.conflict_keys: list[str] | None = None


def merge_shards(replies: list[list[Any]], metas: list[Any], shards: list[Keys] | None = None) -> MergedReply:
    """One read.lua-shaped reply out of one per shard (shard 0 first), each consistent in itself.

    *metas* are the shards' whole catalogues (flat, or the error reading one): the merged one is
    shard 0's, then the specs of the others for metrics shard 0 lacks (the first stored definition
    wins, shard 0 first). Engines and writers are put together: an engine found in two shards
    (only when K changed) gets both hashes, so its writers' chunks add up; a writer found in two
    shards is shown with its latest heartbeat and the self-metrics of the shard holding them (its
    gauges in an engine are judged by its heartbeats in the engine's shards:
    :attr:`MergedReply.shard_writers`, :attr:`MergedReply.engine_shards`). A
    part a shard cannot read (a key of the wrong type) is left out; when no shard can read it, the
    first shard's error stands in its place (the decoder counts it).

    With *shards* (the shards' keys, in the order of *replies*), the reply names the key of each
    engine's hash (:attr:`MergedReply.hash_keys`: a :class:`SplitKey` for an engine found in
    several shards), of the ``engines`` zset each engine was listed in, of each writer's
    self-metrics and of each conflict (:attr:`MergedReply.engine_keys`, ``writer_keys``,
    ``conflict_keys``), and an engine hash or a writer's self-metrics left out because another
    shard's stands in its place is in :attr:`MergedReply.unreadable`, under its own key.
    """
    engines: dict[Any, list[Any]] = {}  # engine -> [score, (shard index, hash), ...]
    writers: dict[Any, list[Any]] = {}  # writer -> [score, shard index, stats]
    conflicts: list[Any] = []
    conflict_keys: list[str] = []
    lost_stats: list[tuple[str, str]] = []  # (why, key) of a writer's unreadable stats left out
    failed: dict[int, Any] = {}
    for at, reply in enumerate(replies):
        engine_flat, writer_flat = reply[1], reply[2]
        if engine_flat.__class__ is list:
            hashes = reply[6 : 6 + len(engine_flat) // 2]
            for engine, score, flat in zip(engine_flat[0::2], engine_flat[1::2], hashes):
                seen = engines.get(engine)
                if seen is None:
                    engines[engine] = [score, (at, flat)]
                    continue
                seen[0] = max(seen[0], score, key=float)
                seen.append((at, flat))
        else:
            failed.setdefault(1, engine_flat)
            hashes = []
        if writer_flat.__class__ is list:
            stats = reply[6 + len(hashes) :]
            for wid, score, flat in zip(writer_flat[0::2], writer_flat[1::2], stats):
                seen = writers.get(wid)
                if seen is None:
                    writers[wid] = [score, at, flat]
                    continue
                if abs(float(score)) > abs(float(seen[0])):
                    seen[0] = score
                left = (at, flat)
                if not (seen[2].__class__ is list and seen[2]):  # its home's (the one not empty)
                    left = (seen[1], seen[2])
                    seen[1], seen[2] = at, flat
                if left[1].__class__ is not list and shards is not None:
                    # A wrong-typed w:<id> another shard's stands in for: counted, by its key.
                    why = unreadable(left[1]) or "unreadable"
                    lost_stats.append((why, shards[left[0]].writer_stats(wid)))
        else:
            failed.setdefault(2, writer_flat)
        if reply[5].__class__ is list:
            conflicts += reply[5]
            if shards is not None and reply[5]:
                conflict_keys += [shards[at].conflicts] * (len(reply[5]) // 2)
        else:
            failed.setdefault(5, reply[5])
    meta: Any = []
    names: set[Any] = set()
    versions = [r[3] if r[3].__class__ is str else "?" for r in replies]
    for i, flat in enumerate(metas):
        if flat.__class__ is not list:
            if i == 0:
                meta = flat
            continue
        if meta.__class__ is not list:
            continue
        for name, value in zip(flat[0::2], flat[1::2]):
            if i and (name in names or name.__class__ is not str or not name.startswith(("m:", "schema"))):
                continue
            names.add(name)
            meta += (name, value)
    out = MergedReply(
        [
            max(int(r[0]) for r in replies),
            [x for e, seen in engines.items() for x in (e, seen[0])] or failed.get(1, []),
            [x for w, (score, _, _) in writers.items() for x in (w, score)] or failed.get(2, []),
            "" if not any(versions) else "|".join(versions),
            meta,
            conflicts or failed.get(5, []),
        ]
    )
    out.shard_writers = [reply[2] for reply in replies]
    engine_shards = out.engine_shards
    hash_keys: list[EngineKey] = []
    engine_keys: list[EngineKey] = []
    listed_in = [keys.engines for keys in shards or ()]  # each shard's engines zset, made once
    for engine, seen in engines.items():
        if len(seen) == 2:  # one shard holds it (every engine, unless K changed)
            at, flat = seen[1]
            engine_shards.append((at,))
            out.append(flat)
            if shards is not None:
                hash_keys.append(shards[at].counters(engine))
                engine_keys.append(listed_in[at])
            continue
        engine_shards.append(tuple(at for at, _ in seen[1:]))
        read = [(at, flat) for at, flat in seen[1:] if flat.__class__ is list]
        lost = [(at, flat) for at, flat in seen[1:] if flat.__class__ is not list]
        if len(read) == 1:
            out.append(read[0][1])
        elif read:  # the writers' chunks and base fields of every shard add up
            out.append([x for _, flat in read for x in flat])
        else:
            out.append(lost[0][1])  # none could be read: the first one's error, for the decoder
        if shards is None:
            continue
        # Listed in several shards' engines zsets: the part holding it (both, for a bad name).
        engine_keys.append(SplitKey((listed_in[at], [engine, seen[0]]) for at, _ in seen[1:]))
        if len(read) > 1:
            hash_keys.append(SplitKey((shards[at].counters(engine), flat) for at, flat in read))
        else:
            hash_keys.append(shards[(read or lost)[0][0]].counters(engine))
        for at, flat in lost if read else lost[1:]:
            out.unreadable.append((unreadable(flat) or "unreadable", shards[at].counters(engine)))
    if shards is not None:
        out.hash_keys = hash_keys
        out.engine_keys = engine_keys
        out.writer_keys = [shards[at].writer_stats(wid) for wid, (_, at, _) in writers.items()]
        out.conflict_keys = conflict_keys
        out.unreadable += lost_stats
    out += [flat for _, _, flat in writers.values()]
    return out


def note_unreadable(reply: Any, skipped: Any) -> None:
    """Count in *skipped* (a snapshot's) the shards' keys the merge of *reply* left out."""
    for why, key in getattr(reply, "unreadable", ()):
        skipped.note(why, key)


def _chunk_writer(name: Any) -> str | None:
    """:func:`fields.chunk_writer`, without its full decode for a field with no escape in it
    (every writer id but one holding ``|``, ``\\`` or a newline)."""
    if name.__class__ is not str:
        return None
    if "\\" in name:
        return fields.chunk_writer(name)
    head, sep, index = name.rpartition("|")
    if not (sep and head.startswith("@|") and index.isdigit() and index.isascii()) or "|" in head[2:]:
        return fields.chunk_writer(name)
    return head[2:]


def _wanted(engines: Iterable[int] | EngineSlice | None) -> Any:
    """The engines a read asks for, fixed once: None (all), a slice, or a list of indexes."""
    return engines if engines is None or isinstance(engines, EngineSlice) else list(engines)


def _in_slice(part: EngineSlice, engine: int) -> bool:
    return part.holds(str(engine))


def refused_for_memory(exc: BaseException) -> bool:
    """True when Redis refused a command for being over ``maxmemory`` (``OOM ...``)."""
    return isinstance(exc, OutOfMemoryError) or "maxmemory" in str(exc)


def _flat(reply: Any) -> Any:
    """A RESP3 map or list of pairs as the flat list RESP2 gives."""
    if isinstance(reply, dict):
        return [x for kv in reply.items() for x in kv]
    if isinstance(reply, list) and reply and isinstance(reply[0], list):
        return [x for pair in reply for x in pair]
    return reply


class ReaderCore:
    """A reader without its I/O: the arguments of ``read.lua`` and the decoding of its reply
    (shared by :class:`StatsReader` and :class:`redis_stats.aio.AsyncStatsReader`).

    *catalog* is the code's own catalogue; metrics it does not define are rendered from the
    catalogue stored in Redis.
    """

    def __init__(self, config: StatsConfig | None = None, catalog: Catalog | None = None) -> None:
        self.config = config or StatsConfig.from_env()
        self.keys = Keys(self.config.namespace)
        self._decoder = SnapshotDecoder(catalog, stale_after=self.config.stale_after, keys=self.keys)
        # Every K a writer listed in shard 0's catalogue (see shards.lua), and our own.
        self.layouts: frozenset[int] = frozenset({self.config.shards} - {1})
        # Per shard read (its root): (catalogue version, the catalogue) last read.
        self._shard_meta: dict[str, tuple[str, Any]] = {}
        self._shard_plans: dict[str, Plan] = {}
        self._load_plans: dict[str, Plan] = {}  # the load feed's, per shard (load_steps)
        self._load_owners: dict[tuple[str, ...], frozenset[str]] = {}  # chunk fields -> writers
        self._lock = threading.Lock()
        # The shard keys of the layouts they were made for: made again only when the layouts
        # change (every read asks for them; K = 64 means 63 Keys each time).
        self._shards: tuple[frozenset[int] | None, list[Keys]] = (None, [])

    @property
    def shard_keys(self) -> list[Keys]:
        """The keys of every shard this reader reads: shard 0 (the namespace's own keys), then
        shards 1..K-1 of every K in :attr:`layouts`."""
        layouts = self.layouts
        made_for, shards = self._shards
        if made_for is not layouts:  # layouts is replaced, never changed, when a K is noted
            shards = self.keys.all_shards(layouts)
            self._shards = (layouts, shards)  # one store: concurrent reads see a whole pair
        return shards

    def note_layouts(self, meta_flat: Any) -> bool:
        """Take the K values listed in shard 0's catalogue *meta_flat*; True if one is new."""
        listed = _layouts(meta_flat)
        found = listed - self.layouts
        if found:
            with self._lock:
                layouts = self.layouts | found
                own = {self.config.shards} - {1}
                if sum(k - 1 for k in layouts - own) > MAX_LISTED_SHARDS:
                    # K noted from earlier reads and no longer listed (a rewritten, garbled
                    # field) must not add up past the bound parse_layouts keeps: the list now.
                    layouts = frozenset(listed | own)
                self.layouts = frozenset(layouts)
        return bool(found)

    def shard_args(self, keys: Keys, engines: Engines = None) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of ``read.lua`` for one shard (*keys*), knowing its catalogue version."""
        version = self._shard_meta.get(keys.root, ("", None))[0]
        args = [keys.prefix, version]
        if isinstance(engines, EngineSlice):  # a slice: read.lua picks its engines
            args += engines.script_args
        elif engines is not None:
            args += [str(int(e)) for e in engines]
        return [keys.engines, keys.writers, keys.meta, keys.conflicts], args

    def merge(self, shard_replies: list[list[Any]], shards: list[Keys]) -> list[Any]:
        """One reply out of the shards' replies (read.lua-shaped; their catalogues are kept
        here and given to the decoder whenever one of them changed)."""
        metas: list[Any] = []
        for keys, reply in zip(shards, shard_replies):
            version, meta = reply[3], reply[4]
            if version.__class__ is not str:  # the catalogue is unreadable: the decoder counts it
                metas.append(version)
                continue
            if meta is None or (meta == [] and version != ""):
                # Not read (the transaction read fetches a catalogue only when its version
                # changed; read.lua returns none at the version we sent): we hold it. Never
                # store "not read" as the catalogue: a later change in another shard would
                # merge without this shard's specs.
                meta = self._shard_meta.get(keys.root, ("", []))[1]
            else:
                self._shard_meta[keys.root] = (version, meta)  # new (or none, or unreadable)
            metas.append(meta)
        merged = merge_shards(shard_replies, metas, shards)
        # A shard's list (or catalogue) that could not be read is counted here, under its own
        # key: the merged reply holds the lists of the shards that could be read (or, when none
        # could, the first one's error, which the decoder would count under shard 0's name).
        for slot in (1, 2, 5):
            if unreadable(merged[slot]) is not None:
                merged[slot] = []
        for keys, reply, meta in zip(shards, shard_replies, metas):
            for part, key in ((reply[1], keys.engines), (reply[2], keys.writers), (reply[5], keys.conflicts)):
                why = unreadable(part)
                if why is not None:
                    merged.unreadable.append((why, key))
            if isinstance(meta, Exception) and merged[4] is not meta:  # shard 0's: the decoder's
                merged.unreadable.append((unreadable(meta) or "unreadable", keys.meta))
        if merged[3] == self._decoder.meta_version:
            merged[4] = []  # the decoder holds it
        return merged

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.config.safe_url!r}, namespace={self.config.namespace!r})"

    def read_args(self, engines: Engines = None) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of ``read.lua``: every engine, or only *engines*."""
        keys = [self.keys.engines, self.keys.writers, self.keys.meta, self.keys.conflicts]
        args = [self.keys.prefix, self._decoder.meta_version]
        if isinstance(engines, EngineSlice):  # a slice: read.lua picks its engines
            args += engines.script_args
        elif engines is not None:
            args += [str(int(e)) for e in engines]
        return keys, args

    def decode(self, reply: Any) -> Snapshot:
        """The snapshot in a reply of ``read.lua`` (or of :meth:`assemble`, or :meth:`merge`)."""
        snap = self._decoder.decode(reply)
        note_unreadable(reply, snap.skipped)
        return snap

    # -- the transaction read (standalone and Sentinel servers) ------------------------------
    #
    # read.lua turns every hash into a Lua table and back, which costs the server about 4x
    # the time of native HGETALLs. So where the client talks to one server, the same consistent
    # snapshot is read with MULTI / native reads / EXEC, packed into one write and parsed in C
    # (hiredis). The engine and writer lists of the previous read say which hashes to ask for;
    # when they changed, the read is repeated with the new lists (a second round trip, rare).
    # Each read carries the plan it was built from: concurrent reads (an exporter serves each
    # request on its own thread) must check their reply against their own plan, not the last one.

    _planned: Plan = ((), ())

    @property
    def planned(self) -> Plan:
        """The (engines, writers) of the last read: what the next transaction asks for."""
        return self._planned

    def transaction(self, planned: Plan | None = None) -> list[tuple[Any, ...]]:
        """The commands of one transaction read, for *planned* (default: :attr:`planned`)."""
        engines, writers = self._planned if planned is None else planned
        k = self.keys
        cmds: list[tuple[Any, ...]] = [
            ("MULTI",),
            ("TIME",),
            ("ZRANGE", k.engines, 0, -1, "WITHSCORES"),
            ("ZRANGE", k.writers, 0, -1, "WITHSCORES"),
            ("HGET", k.meta, "_v"),
            ("HGETALL", k.conflicts),
        ]
        for e in engines:
            cmds.append(("HGETALL", k.counters(e)))
        cmds += [("HGETALL", k.writer_stats(w)) for w in writers]
        cmds.append(("EXEC",))
        return cmds

    def sharded_transaction(self, shards: list[Keys], plans: list[Plan]) -> list[tuple[Any, ...]]:
        """The commands of one transaction read of every shard (all on one server): the four
        reads of each shard's lists, then each one's planned hashes."""
        cmds: list[tuple[Any, ...]] = [("MULTI",), ("TIME",)]
        for k in shards:
            cmds += [
                ("ZRANGE", k.engines, 0, -1, "WITHSCORES"),
                ("ZRANGE", k.writers, 0, -1, "WITHSCORES"),
                ("HGET", k.meta, "_v"),
                ("HGETALL", k.conflicts),
            ]
        for k, (engines, writers) in zip(shards, plans):
            cmds += [("HGETALL", k.counters(e)) for e in engines]
            cmds += [("HGETALL", k.writer_stats(w)) for w in writers]
        cmds.append(("EXEC",))
        return cmds

    def _replan(self, keys: Keys, found: Plan) -> None:
        self._shard_plans[keys.root] = found

    def sharded_assemble(
        self, results: list[Any], shards: list[Keys], plans: list[Plan], engines: Engines = None
    ) -> list[list[Any]] | None:
        """The EXEC results of :meth:`sharded_transaction` as one read.lua-shaped reply per shard,
        or None when a shard's lists differ from its plan (the new plans are kept: read again)."""
        wanted = _wanted(engines)
        at = 1 + 4 * len(shards)
        out, stale = [], False
        for i, (k, plan) in enumerate(zip(shards, plans)):
            size = len(plan[0]) + len(plan[1])
            part = [results[0], *results[1 + 4 * i : 5 + 4 * i], *results[at : at + size]]
            at += size
            reply = self.assemble(part, wanted, plan, replan=functools.partial(self._replan, k))
            if reply is None:
                stale = True
            else:
                out.append(reply)
        return None if stale else out

    def assemble(
        self,
        results: list[Any],
        engines: Engines = None,
        planned: Plan | None = None,
        *,
        replan: Callable[[Plan], None] | None = None,
    ) -> list[Any] | None:
        """The EXEC results as a read.lua-shaped reply, or None when the engine or writer lists
        differ from *planned*, the lists the transaction was built for (then read again with
        :meth:`transaction`: :attr:`planned` now holds the new ones).

        With *engines*, only those engines' hashes are asked for and returned. A command that
        failed (a key of the wrong type) stays in the reply as its exception, for the decoder
        to skip and count: it costs that key only. (With *replan*, the new lists are given to it
        instead of kept in :attr:`planned`: the sharded read keeps one plan per shard.)
        """
        results = [_flat(r) for r in results]  # a client of the caller's may speak RESP3
        now, engine_flat, writer_flat, version, conflicts = results[:5]
        if engines is not None and engine_flat.__class__ is list:
            held: Callable[[str], bool]
            if isinstance(engines, EngineSlice):
                held = engines.holds
            else:
                held = {str(int(e)) for e in engines}.__contains__
            engine_flat = [
                x for e, score in zip(engine_flat[0::2], engine_flat[1::2]) if held(e) for x in (e, score)
            ]
        found = (
            tuple(engine_flat[0::2]) if engine_flat.__class__ is list else (),
            tuple(writer_flat[0::2]) if writer_flat.__class__ is list else (),
        )
        if found != (self._planned if planned is None else planned):
            if replan is not None:
                replan(found)
            else:
                self._planned = found
            return None
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        return [now_ms, engine_flat, writer_flat, version or "", None, conflicts, *results[5:]]

    # -- the read, as steps: the decisions of one read without its I/O ------------------------
    #
    # StatsReader and AsyncStatsReader run the same generator and differ only in how they carry
    # out each step it yields (blocking, or awaited): which commands to send, when to read again,
    # when to fall back to read.lua, when to read the shards a catalogue names live here, once.
    # A step is (what, argument); the generator is sent its result, or thrown its exception.
    #   ("transaction", commands)  -> the EXEC results (raises what Redis refused, e.g. -OOM)
    #   ("script", (KEYS, ARGV))   -> read.lua's reply (on the slot's node on a Cluster)
    #   ("scripts", [(KEYS, ARGV)]) -> their replies, in order (in parallel on a Cluster)
    #   ("meta", Keys)             -> that catalogue, flat (or the error reading it, not raised)

    def read_steps(self, engines: Engines, cluster: bool) -> ReadSteps:
        """The steps of one consistent read of the namespace (every shard), ending with the
        read.lua-shaped reply; *cluster*: the client talks to a Redis Cluster. *engines* may be
        an :class:`EngineSlice` (the engines ``e % N == i``, picked by the read itself)."""
        wanted = _wanted(engines)
        for _ in range(2):
            if len(self.shard_keys) > 1:
                return (yield from self._shard_steps(wanted, cluster))
            reply = yield from self._one_shard_steps(wanted, cluster)
            meta = reply[4]
            if not (meta and self.note_layouts(meta)):
                return reply
            # Shard 0's catalogue names shards (written with another K than ours): read them all.
        return (yield from self._shard_steps(wanted, cluster))

    def _one_shard_steps(self, engines: list[int] | None, cluster: bool) -> ReadSteps:
        if cluster:  # Cluster: the script, on the slot's node
            on_slot: list[Any] = yield ("script", self.read_args(engines))
            return on_slot
        try:
            for _ in range(3):
                planned = self._planned
                reply = self.assemble((yield ("transaction", self.transaction(planned))), engines, planned)
                if reply is not None:
                    if reply[3].__class__ is str and reply[3] != self.meta_version:
                        reply[4] = yield ("meta", self.keys)  # the catalogue changed: fetch it (rare)
                    return reply
        except (OutOfMemoryError, ExecAbortError) as exc:
            if not refused_for_memory(exc):
                raise
            # Over maxmemory (noeviction) Redis 7.0 refuses to queue any command in MULTI, but
            # runs a script that only reads: the same consistent snapshot, some server time more.
        scripted: list[Any] = yield ("script", self.read_args(engines))
        return scripted  # or the fleet changes faster than we read

    def _shard_steps(self, engines: list[int] | None, cluster: bool, again: bool = True) -> ReadSteps:
        """Every shard, merged: one transaction on a single server; one read.lua per shard on a
        Cluster, in parallel. A shard that cannot be read fails the whole read (raised).

        When shard 0's catalogue names shards this read did not cover (a K other than ours: the
        first read of a reader, or a K just added), they are read at once, all together again:
        a reply without them would show a live engine's counters lower than the next read."""
        shards = self.shard_keys
        replies: list[Any] | None = None
        if not cluster:
            try:
                for _ in range(3):
                    plans = [self._shard_plans.get(k.root, ((), ())) for k in shards]
                    results = yield ("transaction", self.sharded_transaction(shards, plans))
                    replies = self.sharded_assemble(results, shards, plans, engines)
                    if replies is not None:
                        break
            except (OutOfMemoryError, ExecAbortError) as exc:
                if not refused_for_memory(exc):
                    raise
                replies = None  # over maxmemory: each shard's script, as for one shard
        if replies is None:  # a Cluster, or the fleet changes faster than we read, or OOM
            replies = yield ("scripts", [self.shard_args(k, engines) for k in shards])
        else:
            for k, reply in zip(shards, replies):
                cached = self._shard_meta.get(k.root, ("", None))[0]
                if reply[3].__class__ is str and reply[3] != cached:
                    reply[4] = yield ("meta", k)  # the catalogue changed: fetch it (rare)
        merged = self.merge(replies, shards)
        if merged[4].__class__ is list and merged[4] and self.note_layouts(merged[4]) and again:
            return (yield from self._shard_steps(engines, cluster, again=False))
        return merged

    # -- the load feed: the load hashes, engines and writers only (redis_stats/load.py) ------

    def load_steps(self, engines: Engines = None, cluster: bool = False) -> LoadSteps:
        """The steps of one read of the load feed, ending with the :class:`LoadView` (of
        *engines* only, when given). On a single server one transaction of native reads covers
        every shard, planned from the last read's lists as the snapshot's transaction read is
        (``("transaction", commands)``); on a Cluster (or over ``maxmemory``, or when the fleet
        changes faster than it is read) one ``load_read.lua`` per shard (``("load", calls)``).
        Shards a writer listed in shard 0's catalogue and this reader did not know are read at
        once, as the snapshot read does."""
        for _ in range(2):
            shards = self.shard_keys
            replies: list[Any] | None = None
            if not cluster:
                try:
                    for _ in range(3):
                        plans = [self._load_plans.get(k.root, ((), ())) for k in shards]
                        results = yield ("transaction", self.load_transaction(shards, plans))
                        replies = self.load_assemble(results, shards, plans)
                        if replies is not None:
                            break
                except (OutOfMemoryError, ExecAbortError) as exc:
                    if not refused_for_memory(exc):
                        raise
            if replies is None:
                calls: list[tuple[list[str], list[str]]] = [
                    ([k.engines, k.writers, k.load, k.meta], [k.prefix]) for k in shards
                ]
                replies = yield ("load", calls)
            listed = replies[0][4] if replies else None
            if not (listed.__class__ is str and self.note_layouts(["shards", listed])):
                break
        assert replies is not None
        return self.load_of(replies, engines)

    def load_transaction(self, shards: list[Keys], plans: list[Plan]) -> list[tuple[Any, ...]]:
        """The commands of one transaction read of the load feed: each shard's lists and load
        hash, then per planned writer its ``stale_ms`` and per planned engine its hash's field
        names (``HKEYS``: never a value)."""
        cmds: list[tuple[Any, ...]] = [("MULTI",), ("TIME",)]
        for k in shards:
            cmds += [
                ("ZRANGE", k.engines, 0, -1, "WITHSCORES"),
                ("ZRANGE", k.writers, 0, -1, "WITHSCORES"),
                ("HGETALL", k.load),
                ("HGET", k.meta, "shards"),
            ]
        for k, (engine_list, writer_list) in zip(shards, plans):
            cmds += [("HGET", k.writer_stats(w), "stale_ms") for w in writer_list]
            cmds += [("HKEYS", k.counters(e)) for e in engine_list]
        cmds.append(("EXEC",))
        return cmds

    def load_assemble(
        self, results: list[Any], shards: list[Keys], plans: list[Plan]
    ) -> list[list[Any]] | None:
        """The EXEC results of :meth:`load_transaction` as one ``load_read.lua``-shaped reply per
        shard, or None when a shard's lists differ from its plan (the new plans are kept)."""
        results = [_flat(r) for r in results]
        now = results[0]
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        at = 1 + 4 * len(shards)
        out, stale = [], False
        for i, (k, (engine_list, writer_list)) in enumerate(zip(shards, plans)):
            engine_flat, writer_flat, flat, listed = results[1 + 4 * i : 5 + 4 * i]
            found = (
                tuple(engine_flat[0::2]) if engine_flat.__class__ is list else (),
                tuple(writer_flat[0::2]) if writer_flat.__class__ is list else (),
            )
            stale_ms = results[at : at + len(writer_list)]
            at += len(writer_list)
            # every field name: load_of takes the chunk writers out (the other names give none)
            owners = [n if n.__class__ is list else [] for n in results[at : at + len(engine_list)]]
            at += len(engine_list)
            if found != (engine_list, writer_list):
                self._load_plans[k.root] = found
                stale = True
                continue
            out.append([now_ms, engine_flat, writer_flat, flat, listed, stale_ms, owners])
        return None if stale else out

    def load_of(self, replies: list[Any], engines: Engines = None) -> LoadView:
        """The :class:`LoadView` of ``load_read.lua``'s replies (one per shard, shard 0 first).

        ``up``, and the writers whose entries count in each engine, are decided by the rule
        every reader applies (:class:`~redis_stats._core.liveness.Liveness`, on what the
        writers stored: their heartbeats, their own ``stale_ms``, the engine's chunk writers),
        with the writers live in the engine's own shard(s), as the snapshot decodes them: so
        ``/load``, ``/snapshot`` and ``redis_stats_engine_up`` never disagree."""
        skipped: dict[str, int] = {}

        def skip(why: str) -> None:
            skipped[why] = skipped.get(why, 0) + 1

        now_ms = max(float(r[0]) for r in replies)
        stats: dict[str, dict[str, str]] = {}
        load_flat: list[Any] = []
        judge = False
        # engine text -> [newest heartbeat, chunk writers, shards it was read from]
        found: dict[str, list[Any]] = {}
        kept, now_kept = self._load_owners, {}
        for at, reply in enumerate(replies):
            engine_flat, writer_flat, flat, stale, owners = reply[1], reply[2], reply[3], reply[5], reply[6]
            for part in (engine_flat, writer_flat, flat):
                if part.__class__ is not list:  # a key of the wrong type: the others are shown
                    skip(unreadable(part) or "unreadable")
            if flat.__class__ is list:
                load_flat += flat
            if writer_flat.__class__ is list:
                judge = True
                for wid, ms in zip(writer_flat[0::2], stale):
                    if ms.__class__ is str:
                        stats.setdefault(wid, {})["stale_ms"] = ms
                    else:
                        stats.setdefault(wid, {})
            if engine_flat.__class__ is not list:
                continue
            for engine, score, held in zip(engine_flat[0::2], engine_flat[1::2], owners):
                # An engine's chunk fields change only when a writer comes or goes: their
                # writers are kept by the fields' text, for the next read (this read's only).
                names = tuple(held)
                writers_of = kept.get(names)
                if writers_of is None:
                    writers_of = frozenset(w for name in names if (w := _chunk_writer(name)) is not None)
                now_kept[names] = writers_of
                seen = found.get(engine)
                if seen is None:
                    found[engine] = [float(score), writers_of, [at]]
                    continue
                seen[0] = max(seen[0], float(score))
                seen[1] = seen[1] | writers_of
                seen[2].append(at)
        self._load_owners = now_kept  # one store: a read at once keeps its own
        rule = Liveness.of(now_ms, stats, self.config.stale_after * 1000.0, judge_owners=judge)
        live_in = [rule.live_in(reply[2]) for reply in replies]
        keep: Callable[[str], bool] | None = None
        if isinstance(engines, EngineSlice):
            keep = engines.holds
        elif engines is not None:
            keep = {str(int(e)) for e in engines}.__contains__
        states: dict[int, tuple[bool, float]] = {}
        live: dict[int, set[str]] = {}
        for engine_text, (score, owners_of, where) in found.items():
            if keep is not None and not keep(engine_text):
                continue
            try:
                engine = int(engine_text)
            except ValueError:
                engine = -1
            if engine < 0 or str(engine) != engine_text:  # "+3" or " 3" would be a second 3
                skip("bad_engine")
                continue
            here = live_in[where[0]] if len(where) == 1 else set().union(*(live_in[at] for at in where))
            states[engine] = (rule.engine_up(score, owners_of, here), rule.age(score))
            live[engine] = here
        return load_view(now_ms, states, live, load_flat, skipped)

    @property
    def meta_version(self) -> str:
        """The catalogue version the decoder holds."""
        return self._decoder.meta_version

    @property
    def decoder(self) -> SnapshotDecoder:
        """The decoder of this reader's replies, which holds the catalogue read so far: a
        renderer of the same replies (the exporter's text path) shares it, so both see one
        catalogue and one cache of parsed chunks."""
        return self._decoder


class StatsReader(ReaderCore):
    """Reads every engine of one namespace (or the given *engines*) atomically, in one round trip.

    Errors from Redis are raised to the caller (the collector turns them into self-metrics).
    """

    def __init__(
        self,
        config: StatsConfig | None = None,
        catalog: Catalog | None = None,
        *,
        client: Client | None = None,
    ) -> None:
        super().__init__(config, catalog)
        self._client: Any = client if client is not None else make_client(self.config)
        self._script = ReadOnlyScript(self._client, load_script("read"))
        self._load_script = ReadOnlyScript(self._client, load_script("load_read"))

    @property
    def client(self) -> Client:
        """The Redis client this reader reads with (another reader may share it)."""
        return self._client  # type: ignore[no-any-return]

    def load(self, engines: Engines = None) -> LoadView:
        """The load feed (:mod:`redis_stats.load`): every engine's (or *engines*') load and the
        fleet's, from the load entries writers store beside their flushes, in one round trip
        per shard (never the engines' series)."""
        return run(self.load_steps(engines, is_cluster(self._client)), self._carry_out)

    def read(self, engines: Engines = None) -> list[Any]:
        """One consistent read of the namespace, as a read.lua-shaped reply (of every shard: each
        shard's part is consistent in itself)."""
        return run(self.read_steps(engines, is_cluster(self._client)), self._carry_out)

    def _carry_out(self, what: str, arg: Any) -> Any:
        """One step of :meth:`ReaderCore.read_steps`, blocking."""
        if what == "transaction":
            return self._transaction(arg)
        if what == "script":
            return self._script(*arg)
        if what == "meta":
            return self._meta(arg)
        script = self._load_script if what == "load" else self._script  # "load": load_read.lua
        if is_cluster(self._client) and len(arg) > 1:  # one per shard, on their nodes, in parallel
            pool = self._read_pool()
            calls = [pool.submit(script, *a) for a in arg]
            return [c.result() for c in calls]
        return [script(*a) for a in arg]

    _pool: ThreadPoolExecutor | None = None
    _pool_pid = 0

    def _read_pool(self) -> ThreadPoolExecutor:
        """The threads of the parallel Cluster read, made at first use, and again in a forked
        child: the parent's threads do not exist there, and its pool, counting them as idle,
        would start none (the child's first read would wait for ever)."""
        pid = os.getpid()
        pool = self._pool
        if pool is not None and self._pool_pid == pid:
            return pool
        with self._lock:
            if self._pool is None or self._pool_pid != pid:
                self._pool = ThreadPoolExecutor(8, thread_name_prefix="redis_stats-read")
                self._pool_pid = pid
            return self._pool

    def _meta(self, keys: Keys | None = None) -> Any:
        try:
            return [x for kv in self._client.hgetall((keys or self.keys).meta).items() for x in kv]
        except ResponseError as exc:  # retyped since the transaction: the decoder skips it
            return exc

    def _transaction(self, cmds: list[tuple[Any, ...]]) -> list[Any]:
        pool = self._client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands(cmds))
            refused: ResponseError | None = None
            for _ in range(len(cmds)):  # +OK, +QUEUED (or why not: -OOM), then EXEC's results
                try:
                    results: list[Any] = conn.read_response()
                except ResponseError as exc:  # read every reply: the connection stays usable
                    refused = refused or exc
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if refused is not None:
            raise refused
        return results  # a failed command (WRONGTYPE) is its exception, for the decoder to skip

    def snapshot(self, engines: Engines = None) -> Snapshot:
        """All engines (or only *engines*) at one instant, in one round trip."""
        return self.decode(self.read(engines))

    def close(self) -> None:
        """Close the connection pool."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._client.close()
