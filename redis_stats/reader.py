"""StatsReader: one consistent read of a namespace, every shard, in one round trip.

A read fetches, of each shard, its engines and writers lists, its catalogue version, the shard
counts its writers listed, one hash of its own feed, and one read of each engine's hash and of
each writer's stats hash. What that is differs by feed
(:class:`~redis_stats._core.read.fetch.Fetch`, with the commands and the reply's parts): the
snapshot (:data:`SNAPSHOT`, every series: ``/metrics``, ``/snapshot``) reads the engines' hashes
whole;
the load feed (:data:`LOAD`, ``/load``) reads their field names only, each writer's
``stale_ms`` and the load hash. Both are read by one loop, :meth:`ReaderCore.read_steps`:

- **the plan**: which engines and writers to read is known only from the lists, so each read is
  planned from the lists the last one returned (per feed and shard), reads the lists again with
  the hashes, and compares: when an engine or writer came or went, it plans again and reads
  again (at most :data:`TRIES` times; then it shows what it read of what is still listed);
- **the carrier**: on one server, one ``MULTI`` / native reads / ``EXEC`` for every shard
  (parsed in C by hiredis); on a Cluster, or when the server refuses ``MULTI`` for ``maxmemory``,
  ``read.lua`` once per shard (``EVALSHA_RO``, in parallel on a Cluster), given every key it
  reads, and split into calls of at most
  :data:`~redis_stats._core.read.fetch.MAX_SCRIPT_WORDS` words;
- **the shards**: K = 1 is a list of one; shard counts a writer listed in shard 0's catalogue
  are read at once, in the same read.

Each shard's results become a :class:`~redis_stats._core.read.decoder.ShardReply` straight off the
wire; the snapshot's are decoded by :class:`~redis_stats._core.read.decoder.SnapshotDecoder`, the
load feed's into a :class:`~redis_stats.load.LoadView` (:func:`redis_stats.load.read_view`).
:class:`ReaderCore` is all of it without I/O, shared with the asyncio twin
(:mod:`redis_stats.aio.reader`); :class:`StatsReader` carries the steps out, blocking.
"""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.exceptions import ExecAbortError, OutOfMemoryError, ResponseError

from redis_stats._core.read.decoder import Decoded, Read, ShardReply, SnapshotDecoder, unreadable
from redis_stats._core.read.fetch import (
    LOAD,
    SNAPSHOT,
    SNAPSHOT_LEAN,
    Fetch,
    KeyRead,
    Plan,
    script_calls,
    shard_reply,
    time_ms,
    transaction,
)
from redis_stats._core.read.slices import Engines, EngineSlice
from redis_stats._core.steps import Steps, run
from redis_stats._scripts import ReadOnlyScript, load_script
from redis_stats.capability import CHECK_STEPS, check_step, check_steps
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, flat_reply, is_cluster, make_client
from redis_stats.errors import refused_for_memory
from redis_stats.keys import MAX_LISTED_SHARDS, Keys, parse_shard_counts
from redis_stats.load import LoadView, read_view
from redis_stats.snapshot import Snapshot

__all__ = [
    "LOAD",
    "SNAPSHOT",
    "SNAPSHOT_LEAN",
    "EngineSlice",
    "Engines",
    "Fetch",
    "ReaderCore",
    "StatsReader",
]

PACKINGS = 8
"""Packed transactions a reader keeps (the last ones used: one per selection it reads)."""

MAX_PLANS = 4096
"""Plans a reader keeps at most (one per feed, shard and selection of engines: a reader that
serves many endpoints' views keeps one per endpoint, a few dozen bytes each with
:attr:`Fetch.owners`); past it the oldest go, and the next read of that selection plans again."""

TRIES = 3
"""Reads of one plan at most before a read shows what it has (the fleet changes faster than it
is read: engines and writers listed since are left out of that read, those gone are dropped)."""

CHECK_EVERY = 60.0
"""Seconds between two capability checks of a reader's server (:mod:`redis_stats.capability`):
its first read checks, a read after a failed one checks, and so does one this long after the last
check (a server that lost its Lua module while a reader ran: its writers' flushes fail, and the
reader says why instead of showing their engines going down one by one)."""


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


class ReaderCore:
    """A reader without its I/O: the plans, the read as steps, the catalogue of every shard, the
    decoding (shared by :class:`StatsReader` and :class:`redis_stats.aio.AsyncStatsReader`).

    *catalog* is the code's own catalogue; metrics it does not define are rendered from the
    catalogue stored in Redis. Safe to share between threads (an exporter reads on each request's
    thread): what a read keeps is replaced whole, one store each; each read checks its reply
    against the plan it was built from.
    """

    snapshot_fetch: Fetch = SNAPSHOT
    """What a read of every series fetches: :data:`SNAPSHOT`, or :data:`SNAPSHOT_LEAN` for a
    reader whose views show no writer self-metrics (set it on a reader of its own)."""

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
        self.shard_counts: frozenset[int] = frozenset({self.config.shards} - {1})
        self._shards: tuple[frozenset[int] | None, list[Keys]] = (None, [])
        # (feed, shard root, selection) -> its last lists (MAX_PLANS at most)
        self._plans: dict[tuple[str, str, Any], Plan] = {}
        self._shard_meta: dict[str, tuple[str, Any]] = {}  # shard root -> (version, catalogue)
        self._owners: dict[tuple[str, ...], frozenset[str]] = {}  # the load feed's (read_view)
        self._lock = threading.Lock()
        self._checked_at = -math.inf  # monotonic time of the last capability check passed

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.config.safe_url!r}, namespace={self.config.namespace!r})"

    @property
    def catalog(self) -> Catalog:
        """The code's own catalogue this reader was made with (another reader of the same
        namespace, e.g. one per slice, is made with it too)."""
        return self._decoder.local

    @property
    def meta_version(self) -> str:
        """The catalogue version the decoder holds."""
        return self._decoder.meta_version

    @property
    def shard_keys(self) -> list[Keys]:
        """The keys of every shard this reader reads: shard 0 (the namespace's own keys), then
        shards 1..K-1 of every K in :attr:`shard_counts`."""
        counts = self.shard_counts
        made_for, shards = self._shards
        if made_for is not counts:  # replaced, never changed, when a K is noted
            shards = self.keys.all_shards(counts)
            self._shards = (counts, shards)  # one store: concurrent reads see a whole pair
        return shards

    def note_shard_counts(self, listed: Any) -> bool:
        """Take the K values listed in shard 0's ``shards`` field; True if one is new."""
        found = parse_shard_counts(listed) - self.shard_counts
        if found:
            with self._lock:
                counts = self.shard_counts | found
                own = {self.config.shards} - {1}
                if sum(k - 1 for k in counts - own) > MAX_LISTED_SHARDS:
                    # K noted from earlier reads and no longer listed (a rewritten, garbled
                    # field) must not add up past the bound parse_shard_counts keeps: the list now.
                    counts = frozenset(parse_shard_counts(listed) | own)
                self.shard_counts = frozenset(counts)
        return bool(found)

    # -- the read, as steps --------------------------------------------------------------------
    #
    # StatsReader and AsyncStatsReader run the same generator and differ only in how they carry
    # out each step it yields (blocking, or awaited). A step is (what, argument); the generator
    # is sent its result, or thrown its exception.
    #   ("transaction", commands)   -> the EXEC results (raises what Redis refused, e.g. -OOM)
    #   ("scripts", [(KEYS, ARGV)]) -> read.lua's replies, in order (in parallel on a Cluster)
    #   ("meta", Keys)              -> that catalogue, flat (or the error reading it, not raised)

    def read_steps(self, fetch: Fetch, engines: Engines, cluster: bool) -> Steps[list[ShardReply]]:
        """The steps of one consistent read of *fetch* of every shard (*engines* only, when
        given: indexes, or an :class:`EngineSlice`, picked from what the store lists), ending
        with a reply per shard, shard 0 first; *cluster*: the client talks to a Redis Cluster.
        A shard that cannot be read fails the whole read (raised)."""
        wanted = engines if engines is None or isinstance(engines, EngineSlice) else list(engines)
        selection = wanted if not isinstance(wanted, list) else tuple(wanted)  # the plan's key
        scripted, shards, tries, learnt = cluster, self.shard_keys, 0, False
        while True:
            plans = [self._plans.get((fetch.name, k.root, selection), ((), ())) for k in shards]
            reads = self._reads_of(fetch, shards, plans)
            results = None
            if not scripted:
                try:
                    results = yield from self._transaction_results(reads)
                except (OutOfMemoryError, ExecAbortError) as exc:
                    if not refused_for_memory(exc):
                        raise
                    # Over maxmemory (noeviction) Redis 7.0 refuses to queue any command in
                    # MULTI, but runs a script that only reads: the same reads, some server time more.
                    scripted = True
            if results is None:
                results = yield from self._script_results(reads)
            replies, stale = [], False
            for k, plan, (now_ms, parts) in zip(shards, plans, results):
                parts = [flat_reply(r) for r in parts]  # a client of the caller's may speak RESP3
                reply, found = shard_reply(fetch, k, plan, now_ms, parts, wanted)
                replies.append(reply)
                if found != plan:
                    self._planned((fetch.name, k.root, selection), found)
                    stale = True
            if not learnt and self.note_shard_counts(replies[0].listed):
                # Shard 0 names shards of another K than this reader's: read them all, now (a
                # reply without them would show a live engine's counters lower than the next).
                shards, tries, learnt = self.shard_keys, 0, True
                continue
            tries += 1
            if not stale or tries == TRIES:
                return replies

    def _planned(self, key: tuple[str, str, Any], plan: Plan) -> None:
        """Keep *plan* for the next read of *key* (within :data:`MAX_PLANS`, the oldest out)."""
        plans = self._plans
        plans[key] = plan
        if len(plans) > MAX_PLANS:
            with self._lock:
                while len(plans) > MAX_PLANS:
                    plans.pop(next(iter(plans)), None)

    # The last read's (fetch, shards, plans), its reads and their transaction's commands (None:
    # not made yet); one store of a whole tuple, never changed in place (readers share it across
    # threads).
    _made: tuple[tuple[Any, ...], list[list[list[KeyRead]]], list[tuple[Any, ...]] | None] = ((), [], None)

    def _reads_of(self, fetch: Fetch, shards: list[Keys], plans: list[Plan]) -> list[list[list[KeyRead]]]:
        """Every shard's reads for *plans*: those of the last read when it had the same fetch,
        shards and plans (the same objects: a plan is kept until the lists change), else made
        again. Making them and their transaction's commands was a tenth of a ``/load`` refresh
        at 2,048 writers."""
        known, reads, _ = self._made
        now = (fetch, *shards, *plans)
        if len(known) != len(now) or any(a is not b for a, b in zip(known, now)):
            reads = [*map(fetch.reads, shards, plans)]
            self._made = (now, reads, None)
        return reads

    def _commands(self, reads: list[list[list[KeyRead]]]) -> list[tuple[Any, ...]]:
        """:func:`transaction` of *reads*, made once for the reads :meth:`_reads_of` keeps."""
        known, kept, cmds = self._made
        if kept is not reads:
            return transaction(reads)
        if cmds is None:
            cmds = transaction(reads)
            self._made = (known, kept, cmds)
        return cmds

    def _transaction_results(self, reads: list[list[list[KeyRead]]]) -> Steps[list[tuple[float, list[Any]]]]:
        """Every shard's reads in one transaction: per shard (server time, its results)."""
        results = yield ("transaction", self._commands(reads))
        now_ms, at, out = time_ms(results[0]), 1, []
        for groups in reads:
            size = sum(map(len, groups))
            out.append((now_ms, results[at : at + size]))
            at += size
        return out

    def _script_results(self, reads: list[list[list[KeyRead]]]) -> Steps[list[tuple[float, list[Any]]]]:
        """Every shard's reads by ``read.lua`` calls: per shard (its first call's server time,
        its results)."""
        calls = [script_calls(shard_reads) for shard_reads in reads]
        replies = yield ("scripts", [call for shard_calls in calls for call in shard_calls])
        out, at = [], 0
        for shard_calls in calls:
            parts = replies[at : at + len(shard_calls)]
            at += len(shard_calls)
            out.append((time_ms(parts[0][0]), [r for part in parts for r in part[1:]]))
        return out

    def check_due_steps(self) -> Steps[None]:
        """The capability check of the server, when one is due (:data:`CHECK_EVERY`)."""
        if time.monotonic() - self._checked_at >= CHECK_EVERY:
            yield from check_steps(self.config, writes=False)
            self._checked_at = time.monotonic()

    def checked_steps(self, fetch: Fetch, engines: Engines, cluster: bool) -> Steps[list[ShardReply]]:
        """:meth:`read_steps`, after the capability check of the server when one is due
        (:data:`CHECK_EVERY`; :mod:`redis_stats.capability`: raises
        :class:`~redis_stats.errors.StoreUnsupported` for a server that cannot hold the store,
        rather than reading an empty namespace there). A failed read makes the next one check."""
        yield from self.check_due_steps()
        try:
            return (yield from self.read_steps(fetch, engines, cluster))
        except Exception:
            self._checked_at = -math.inf  # reconnected next time, maybe to another server
            raise

    def snapshot_steps(self, engines: Engines, cluster: bool) -> Steps[Read]:
        """The steps of one read of every series (:attr:`snapshot_fetch`: :data:`SNAPSHOT`
        unless set otherwise), ending with the :class:`~redis_stats._core.read.decoder.Read` to
        decode; a shard whose catalogue version changed has its catalogue read too (rare: a new
        metric, a new K)."""
        replies = yield from self.checked_steps(self.snapshot_fetch, engines, cluster)
        metas = []
        for reply in replies:
            version = reply.version
            kept = self._shard_meta.get(reply.keys.root)
            if version.__class__ is not str:  # the catalogue hash is unreadable
                metas.append(version)
            elif kept is not None and kept[0] == version:
                metas.append(kept[1])
            else:
                meta = yield ("meta", reply.keys)
                self._shard_meta[reply.keys.root] = (version, meta)
                metas.append(meta)
        notes, versions = [], []
        for reply, meta in zip(replies, metas):
            versions.append(reply.version if reply.version.__class__ is str else "?")
            if isinstance(meta, Exception) and reply is not replies[0]:  # shard 0's: the decoder's
                notes.append((unreadable(meta) or "unreadable", reply.keys.meta))
        version = "|".join(versions) if any(versions) else ""
        meta = [] if version == self._decoder.meta_version else _catalogues(metas)
        return Read(replies, version, meta, tuple(notes))

    def load_steps(self, engines: Engines, cluster: bool) -> Steps[LoadView]:
        """The steps of one read of the load feed (:data:`LOAD`), ending with its
        :class:`LoadView` (of *engines* only, when given)."""
        replies = yield from self.checked_steps(LOAD, engines, cluster)
        view, self._owners = read_view(replies, self.config.stale_after, self._owners)
        return view

    _packings: tuple[tuple[list[tuple[Any, ...]], Any], ...] = ()

    @property
    def packed_bytes(self) -> int:
        """The bytes of the reads' commands kept packed (part of what a server keeps per reader,
        redis_stats/server/kept.py)."""
        return sum(sum(map(len, packed)) for _, packed in self._packings)

    def _packed(self, conn: Any, cmds: list[tuple[Any, ...]]) -> Any:
        """The transaction's commands as the connection sends them, packed again only when they
        changed: they are the plan's, which changes only when an engine or writer comes or goes
        (packing ~70 commands a read cost a 64-engine scrape ~8 %). The last :data:`PACKINGS`
        are kept: a reader of several selections (slices, endpoints) alternates between them."""
        kept = self._packings
        for known, packed in kept:
            if known == cmds:  # (two selections' commands differ within their first keys)
                return packed
        packed = conn.pack_commands(cmds)
        self._packings = ((cmds, packed), *kept[: PACKINGS - 1])  # one store: a whole tuple
        return packed

    def decoded(self, read: Read) -> Decoded:
        """The decoded form of a read (:meth:`StatsReader.read`): what the snapshot and the
        ``/metrics`` text are made from."""
        return self._decoder.decode(read)

    def decode(self, read: Read) -> Snapshot:
        """The snapshot of a read (see :meth:`decoded`)."""
        return self.decoded(read).snapshot()


class StatsReader(ReaderCore):
    """Reads every engine of one namespace (or the given *engines*) atomically, in one round trip.

    Errors from Redis are raised to the caller (the collector turns them into self-metrics),
    and so is :class:`~redis_stats.errors.StoreUnsupported` for a server that cannot hold the
    store (checked at the first read, after a failed one, and every :data:`CHECK_EVERY` s).
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

    @property
    def client(self) -> Client:
        """The Redis client this reader reads with (another reader may share it)."""
        return self._client  # type: ignore[no-any-return]

    def read(self, engines: Engines = None) -> Read:
        """One consistent read of the namespace: a reply per shard, each consistent in itself
        (decode it with :meth:`decode` or :meth:`decoded`)."""
        return run(self.snapshot_steps(engines, is_cluster(self._client)), self._step)

    def snapshot(self, engines: Engines = None) -> Snapshot:
        """All engines (or only *engines*) at one instant, in one round trip."""
        return self.decode(self.read(engines))

    def load(self, engines: Engines = None) -> LoadView:
        """The load feed (:mod:`redis_stats.load`): every engine's (or *engines*') load and the
        fleet's, from the load entries writers store beside their flushes, in one round trip
        (never the engines' series)."""
        return run(self.load_steps(engines, is_cluster(self._client)), self._step)

    def check_store(self) -> None:
        """Check the server when a check is due (:data:`CHECK_EVERY`; raises
        :class:`~redis_stats.errors.StoreUnsupported`), as every read does first: for a caller
        that does not read (an exporter's health of several namespaces)."""
        try:
            run(self.check_due_steps(), self._step)
        except Exception:
            self._checked_at = -math.inf
            raise

    def _step(self, what: str, arg: Any) -> Any:
        """One step of a read: the capability check's, or :meth:`_carry_out`'s."""
        if what in CHECK_STEPS:
            return check_step(self._client, self.config, what, arg)
        return self._carry_out(what, arg)

    def _carry_out(self, what: str, arg: Any) -> Any:
        """One step of :meth:`ReaderCore.read_steps`, blocking."""
        if what == "transaction":
            return self._transaction(arg)
        if what == "meta":
            try:
                return [x for kv in self._client.hgetall(arg.meta).items() for x in kv]
            except ResponseError as exc:  # retyped since the read: the decoder skips it
                return exc
        if is_cluster(self._client) and len(arg) > 1:  # one per shard, on their nodes, in parallel
            pool = self._read_pool()
            calls = [pool.submit(self._script, *a) for a in arg]
            return [c.result() for c in calls]
        return [self._script(*a) for a in arg]

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

    def _transaction(self, cmds: list[tuple[Any, ...]]) -> list[Any]:
        pool = self._client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(self._packed(conn, cmds))
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

    def close(self) -> None:
        """Close the connection pool."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._client.close()
