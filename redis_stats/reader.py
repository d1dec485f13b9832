"""StatsReader: one round trip to Redis returns a consistent :class:`~redis_stats._core.snapshot.Snapshot`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from redis.exceptions import ExecAbortError, OutOfMemoryError, ResponseError

from redis_stats._core.snapshot import Snapshot, SnapshotDecoder
from redis_stats._scripts import ReadOnlyScript, load_script
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, make_client
from redis_stats.keys import Keys

__all__ = ["ReaderCore", "StatsReader"]

Plan = tuple[tuple[str, ...], tuple[str, ...]]  # (engines, writers) a transaction read asks for


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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.config.safe_url!r}, namespace={self.config.namespace!r})"

    def read_args(self, engines: Iterable[int] | None = None) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of ``read.lua``: every engine, or only *engines*."""
        keys = [self.keys.engines, self.keys.writers, self.keys.meta, self.keys.conflicts]
        args = [self.keys.prefix, self._decoder.meta_version]
        if engines is not None:
            args += [str(int(e)) for e in engines]
        return keys, args

    def decode(self, reply: Any) -> Snapshot:
        """The snapshot in a reply of ``read.lua`` (or of :meth:`assemble`)."""
        return self._decoder.decode(reply)

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

    def assemble(
        self, results: list[Any], engines: Iterable[int] | None = None, planned: Plan | None = None
    ) -> list[Any] | None:
        """The EXEC results as a read.lua-shaped reply, or None when the engine or writer lists
        differ from *planned*, the lists the transaction was built for (then read again with
        :meth:`transaction`: :attr:`planned` now holds the new ones).

        With *engines*, only those engines' hashes are asked for and returned. A command that
        failed (a key of the wrong type) stays in the reply as its exception, for the decoder
        to skip and count: it costs that key only.
        """
        results = [_flat(r) for r in results]  # a client of the caller's may speak RESP3
        now, engine_flat, writer_flat, version, conflicts = results[:5]
        if engines is not None and engine_flat.__class__ is list:
            wanted = {str(int(e)) for e in engines}
            engine_flat = [
                x for e, score in zip(engine_flat[0::2], engine_flat[1::2]) if e in wanted for x in (e, score)
            ]
        found = (
            tuple(engine_flat[0::2]) if engine_flat.__class__ is list else (),
            tuple(writer_flat[0::2]) if writer_flat.__class__ is list else (),
        )
        if found != (self._planned if planned is None else planned):
            self._planned = found
            return None
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        return [now_ms, engine_flat, writer_flat, version or "", None, conflicts, *results[5:]]

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

    def read(self, engines: Iterable[int] | None = None) -> list[Any]:
        """One consistent read of the namespace, as a read.lua-shaped reply."""
        if hasattr(self._client, "get_node_from_key"):  # Cluster: the script, on the slot's node
            on_slot: list[Any] = self._script(*self.read_args(engines))
            return on_slot
        try:
            for _ in range(3):
                planned = self._planned
                reply = self.assemble(self._transaction(self.transaction(planned)), engines, planned)
                if reply is not None:
                    if reply[3].__class__ is str and reply[3] != self.meta_version:
                        reply[4] = self._meta()  # the catalogue changed: fetch it (rare)
                    return reply
        except (OutOfMemoryError, ExecAbortError) as exc:
            if not refused_for_memory(exc):
                raise
            # Over maxmemory (noeviction) Redis 7.0 refuses to queue any command in MULTI, but
            # runs a script that only reads: the same consistent snapshot, some server time more.
        scripted: list[Any] = self._script(*self.read_args(engines))
        return scripted  # or the fleet changes faster than we read

    def _meta(self) -> Any:
        try:
            return [x for kv in self._client.hgetall(self.keys.meta).items() for x in kv]
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

    def snapshot(self, engines: Iterable[int] | None = None) -> Snapshot:
        """All engines (or only *engines*) at one instant, in one round trip."""
        return self.decode(self.read(engines))

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
