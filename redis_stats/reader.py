"""StatsReader: one round trip to Redis returns a consistent :class:`~redis_stats.snapshot.Snapshot`.

:class:`ReaderCore` is the read without its I/O, shared with the asyncio twin
(:mod:`redis_stats.aio.reader`): the shards a read covers, the transaction read's commands and
their replies, the read as steps, the catalogues merged over shards. :class:`StatsReader`
carries the steps out, blocking. The load feed's read is :mod:`redis_stats.load_read`'s.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.exceptions import ExecAbortError, OutOfMemoryError, ResponseError

from redis_stats._core.decoder import Decoded, Read, ShardReply, SnapshotDecoder, unreadable
from redis_stats._core.slices import Engines, EngineSlice, is_among
from redis_stats._core.steps import Steps, run
from redis_stats._scripts import ReadOnlyScript, load_script
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, flat_reply, is_cluster, make_client
from redis_stats.errors import refused_for_memory
from redis_stats.keys import MAX_LISTED_SHARDS, Keys, parse_layouts
from redis_stats.load import LoadView
from redis_stats.load_read import LoadRead, LoadSteps
from redis_stats.snapshot import Snapshot

__all__ = ["EngineSlice", "Engines", "ReaderCore", "StatsReader"]

log = logging.getLogger("redis_stats.reader")

Plan = tuple[tuple[str, ...], tuple[str, ...]]  # (engines, writers) a transaction read asks for
# One read without its I/O (ReaderCore.read_steps): yields (what, argument) steps, is sent their
# results, returns the read.
ReadSteps = Steps[Read]


def _layouts(meta_flat: Any) -> set[int]:
    """The K values listed in a catalogue's ``shards`` field (see :func:`parse_layouts`)."""
    if meta_flat.__class__ is not list:
        return set()
    for name, value in zip(meta_flat[0::2], meta_flat[1::2]):
        if name == "shards":
            return parse_layouts(value)
    return set()


def _only(engine_flat: Any, engines: Iterable[int] | EngineSlice | None) -> Any:
    """An ``engines`` zset as read (flat, or its error) cut down to *engines* (None: all)."""
    if engines is None or engine_flat.__class__ is not list:
        return engine_flat
    held = is_among(engines)
    return [x for e, score in zip(engine_flat[0::2], engine_flat[1::2]) if held(e) for x in (e, score)]


def _names(flat: Any) -> tuple[Any, ...]:
    """The members of a zset read flat (none when it could not be read)."""
    return tuple(flat[0::2]) if flat.__class__ is list else ()


def _catalogues(metas: list[Any]) -> Any:
    """The shards' catalogues (flat, or the error reading one; shard 0 first) as one: shard
    0's, then the specs of the others for metrics it lacks. Shard 0's error stands for it."""
    meta: Any = metas[0] if metas else []
    if meta.__class__ is not list:
        return meta
    meta = list(meta)
    names = set(meta[0::2])
    for flat in metas[1:]:
        if flat.__class__ is not list:
            continue
        for name, value in zip(flat[0::2], flat[1::2]):
            if name in names or name.__class__ is not str or not name.startswith(("m:", "schema")):
                continue
            names.add(name)
            meta += (name, value)
    return meta


def _wanted(engines: Iterable[int] | EngineSlice | None) -> Any:
    """The engines a read asks for, fixed once: None (all), a slice, or a list of indexes."""
    return engines if engines is None or isinstance(engines, EngineSlice) else list(engines)


class ReaderCore:
    """A reader without its I/O: the arguments of ``read.lua`` and the decoding of its reply
    (shared by :class:`StatsReader` and :class:`redis_stats.aio.AsyncStatsReader`).

    *catalog* is the code's own catalogue; metrics it does not define are rendered from the
    catalogue stored in Redis.
    """

    def __init__(self, config: StatsConfig | None = None, catalog: Catalog | None = None) -> None:
        self.config = config or StatsConfig.from_env()
        self.keys = Keys(self.config.namespace)
        self._decoder = SnapshotDecoder(
            catalog,
            stale_after=self.config.stale_after,
            keys=self.keys,
            max_label_length=self.config.max_label_length,
        )
        # Every K a writer listed in shard 0's catalogue (see shards.lua), and our own.
        self.layouts: frozenset[int] = frozenset({self.config.shards} - {1})
        # Per shard read (its root): (catalogue version, the catalogue) last read.
        self._shard_meta: dict[str, tuple[str, Any]] = {}
        self._shard_plans: dict[str, Plan] = {}
        self._load = LoadRead()  # the load feed's plans and chunk writers (load_steps)
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

    def merge(self, shard_replies: list[list[Any]], shards: list[Keys]) -> Read:
        """One read out of the shards' replies (read.lua-shaped, shard 0 first). Their
        catalogues are kept here, one per shard, and put together for the decoder whenever one
        of them changed: shard 0's, then the specs of the others for metrics shard 0 lacks (the
        first stored definition wins). Another shard's catalogue that cannot be read is noted
        under its own key (shard 0's is the decoder's to count)."""
        metas = [
            self._shard_catalogue(keys, reply[3], reply[4]) for keys, reply in zip(shards, shard_replies)
        ]
        notes = [
            (unreadable(meta) or "unreadable", keys.meta)
            for keys, meta in zip(shards[1:], metas[1:])
            if isinstance(meta, Exception)
        ]
        versions = [r[3] if r[3].__class__ is str else "?" for r in shard_replies]
        version = "" if not any(versions) else "|".join(versions)
        meta = [] if version == self._decoder.meta_version else _catalogues(metas)
        replies = [ShardReply.of(keys, reply) for keys, reply in zip(shards, shard_replies)]
        return Read(replies, version, meta, tuple(notes))

    def _shard_catalogue(self, keys: Keys, version: Any, meta: Any) -> Any:
        """One shard's catalogue (flat, or the error reading it), kept here by its version."""
        if version.__class__ is not str:  # the catalogue is unreadable
            return version
        if meta is None or (meta == [] and version != ""):
            # Not read (the transaction read fetches a catalogue only when its version changed;
            # read.lua returns none at the version we sent): we hold it. Never store "not read"
            # as the catalogue: a later change in another shard would merge without its specs.
            return self._shard_meta.get(keys.root, ("", []))[1]
        self._shard_meta[keys.root] = (version, meta)  # new (or none, or unreadable)
        return meta

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

    def decoded(self, read: Read | list[Any]) -> Decoded:
        """The decoded form of a read (:meth:`StatsReader.read`; or one reply of ``read.lua``
        for this namespace): what the snapshot and the ``/metrics`` text are made from."""
        if not isinstance(read, Read):
            read = Read([ShardReply.of(self.keys, read)], read[3], read[4])
        return self._decoder.decode(read)

    def decode(self, read: Read | list[Any]) -> Snapshot:
        """The snapshot of a read (see :meth:`decoded`)."""
        return self.decoded(read).snapshot()

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
        results = [flat_reply(r) for r in results]  # a client of the caller's may speak RESP3
        now, engine_flat, writer_flat, version, conflicts = results[:5]
        engine_flat = _only(engine_flat, engines)
        found = (_names(engine_flat), _names(writer_flat))
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
                return Read([ShardReply.of(self.keys, reply)], reply[3], reply[4])
            # Shard 0's catalogue names shards (written with another K than ours): read them all.
        return (yield from self._shard_steps(wanted, cluster))

    def _one_shard_steps(self, engines: list[int] | EngineSlice | None, cluster: bool) -> Steps[list[Any]]:
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

    def _sharded_transaction_steps(
        self, shards: list[Keys], engines: list[int] | EngineSlice | None
    ) -> Steps[list[list[Any]] | None]:
        """Every shard's reply by one transaction (on a single server), or None: the fleet
        changes faster than we read, or the server is over maxmemory (read by scripts then)."""
        try:
            for _ in range(3):
                plans = [self._shard_plans.get(k.root, ((), ())) for k in shards]
                results = yield ("transaction", self.sharded_transaction(shards, plans))
                replies = self.sharded_assemble(results, shards, plans, engines)
                if replies is not None:
                    return replies
        except (OutOfMemoryError, ExecAbortError) as exc:
            if not refused_for_memory(exc):
                raise
        return None  # over maxmemory: each shard's script, as for one shard

    def _changed_catalogues(self, shards: list[Keys], replies: list[list[Any]]) -> Steps[None]:
        """Fetch the catalogue of each shard whose version changed (rare) into its reply."""
        for k, reply in zip(shards, replies):
            cached = self._shard_meta.get(k.root, ("", None))[0]
            if reply[3].__class__ is str and reply[3] != cached:
                reply[4] = yield ("meta", k)

    def _shard_steps(
        self, engines: list[int] | EngineSlice | None, cluster: bool, again: bool = True
    ) -> ReadSteps:
        """Every shard, merged: one transaction on a single server; one read.lua per shard on a
        Cluster, in parallel. A shard that cannot be read fails the whole read (raised).

        When shard 0's catalogue names shards this read did not cover (a K other than ours: the
        first read of a reader, or a K just added), they are read at once, all together again:
        a reply without them would show a live engine's counters lower than the next read."""
        shards = self.shard_keys
        replies = None if cluster else (yield from self._sharded_transaction_steps(shards, engines))
        if replies is None:  # a Cluster, or the fleet changes faster than we read, or OOM
            replies = yield ("scripts", [self.shard_args(k, engines) for k in shards])
        else:
            yield from self._changed_catalogues(shards, replies)
        merged = self.merge(replies, shards)
        if merged.meta.__class__ is list and merged.meta and self.note_layouts(merged.meta) and again:
            return (yield from self._shard_steps(engines, cluster, again=False))
        return merged

    # -- the load feed: the load hashes, engines and writers only (redis_stats/load_read.py) -

    def load_steps(self, engines: Engines = None, cluster: bool = False) -> LoadSteps:
        """The steps of one read of the load feed, ending with the :class:`LoadView` (of
        *engines* only, when given): :meth:`LoadRead.steps <redis_stats.load_read.LoadRead.steps>`
        over this reader's shards."""
        return self._load.steps(self, engines, cluster)

    def load_transaction(self, shards: list[Keys], plans: list[Plan]) -> list[tuple[Any, ...]]:
        """The commands of one transaction read of the load feed (see :class:`LoadRead`)."""
        return self._load.transaction(shards, plans)

    def load_assemble(
        self, results: list[Any], shards: list[Keys], plans: list[Plan]
    ) -> list[list[Any]] | None:
        """The EXEC results of :meth:`load_transaction` as ``load_read.lua``-shaped replies, or
        None when a shard's lists differ from its plan (see :class:`LoadRead`)."""
        return self._load.assemble(results, shards, plans)

    def load_of(self, replies: list[Any], engines: Engines = None) -> LoadView:
        """The :class:`LoadView` of ``load_read.lua``'s replies (one per shard, shard 0 first),
        by the rule every reader applies (see :meth:`LoadRead.view`)."""
        return self._load.view(replies, engines, self.config.stale_after)

    @property
    def catalog(self) -> Catalog:
        """The code's own catalogue this reader was made with (another reader of the same
        namespace, e.g. one per slice, is made with it too)."""
        return self._decoder.local

    @property
    def meta_version(self) -> str:
        """The catalogue version the decoder holds."""
        return self._decoder.meta_version


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

    def read(self, engines: Engines = None) -> Read:
        """One consistent read of the namespace: a reply per shard, each consistent in itself
        (decode it with :meth:`decode` or :meth:`decoded`)."""
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
