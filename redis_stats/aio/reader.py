"""The asyncio reader: :class:`AsyncStatsReader`, the shared ReaderCore on ``redis.asyncio``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis.exceptions import ExecAbortError, OutOfMemoryError, ResponseError

from redis_stats._core.snapshot import Snapshot
from redis_stats._scripts import AsyncScript, load_script
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import AsyncClient, is_cluster, make_async_client
from redis_stats.keys import Keys
from redis_stats.reader import ReaderCore, refused_for_memory

__all__ = ["AsyncStatsReader"]


class AsyncStatsReader(ReaderCore):
    """The asyncio twin of :class:`~redis_stats.reader.StatsReader`."""

    def __init__(
        self,
        config: StatsConfig | None = None,
        catalog: Catalog | None = None,
        *,
        client: AsyncClient | None = None,
    ) -> None:
        super().__init__(config, catalog)
        self._client: Any = client if client is not None else make_async_client(self.config)
        self._script = AsyncScript(self._client, load_script("read"), read_only=True)

    async def read(self, engines: Iterable[int] | None = None) -> list[Any]:
        """One consistent read of the namespace, as a read.lua-shaped reply (see StatsReader.read)."""
        for _ in range(2):
            if len(self.shard_keys) > 1:
                return await self._read_shards(engines)
            reply = await self._read_one(engines)
            meta = reply[4]
            if not (meta and self.note_layouts(meta)):
                return reply
        return await self._read_shards(engines)

    async def _read_shards(self, engines: Iterable[int] | None, again: bool = True) -> list[Any]:
        """Every shard, merged (see StatsReader._read_shards): one transaction on a single
        server; on a Cluster one read.lua per shard, gathered. Shards named by shard 0's
        catalogue that this read did not cover are read at once (all together again)."""
        wanted = None if engines is None else list(engines)
        shards = self.shard_keys
        replies: list[Any] | None = None
        if is_cluster(self._client):
            replies = list(await asyncio.gather(*(self._script(*self.shard_args(k, wanted)) for k in shards)))
        else:
            for _ in range(3):
                plans = [self._shard_plans.get(k.root, ((), ())) for k in shards]
                cmds = self.sharded_transaction(shards, plans)
                replies = self.sharded_assemble(await self._transaction(cmds), shards, plans, wanted)
                if replies is not None:
                    break
            if replies is None:
                replies = [await self._script(*self.shard_args(k, wanted)) for k in shards]
            else:
                for k, reply in zip(shards, replies):
                    cached = self._shard_meta.get(k.root, ("", None))[0]
                    if reply[3].__class__ is str and reply[3] != cached:
                        reply[4] = await self._meta(k)  # the catalogue changed: fetch it (rare)
        merged = self.merge(replies or [], shards)
        if merged[4].__class__ is list and merged[4] and self.note_layouts(merged[4]) and again:
            return await self._read_shards(wanted, again=False)
        return merged

    async def _read_one(self, engines: Iterable[int] | None) -> list[Any]:
        if is_cluster(self._client):  # Cluster: the script, on the slot's node
            on_slot: list[Any] = await self._script(*self.read_args(engines))
            return on_slot
        try:
            for _ in range(3):
                planned = self.planned
                reply = self.assemble(await self._transaction(self.transaction(planned)), engines, planned)
                if reply is not None:
                    if reply[3].__class__ is str and reply[3] != self.meta_version:
                        reply[4] = await self._meta()  # the catalogue changed: fetch it (rare)
                    return reply
        except (OutOfMemoryError, ExecAbortError) as exc:
            if not refused_for_memory(exc):
                raise
            # over maxmemory: MULTI is refused, a script that only reads is not (see StatsReader)
        scripted: list[Any] = await self._script(*self.read_args(engines))
        return scripted

    async def _meta(self, keys: Keys | None = None) -> Any:
        try:
            meta = await self._client.hgetall((keys or self.keys).meta)
        except ResponseError as exc:  # retyped since the transaction: the decoder skips it
            return exc
        return [x for kv in meta.items() for x in kv]

    async def _transaction(self, cmds: list[tuple[Any, ...]]) -> list[Any]:
        pool = self._client.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(conn.pack_commands(cmds))
            refused: ResponseError | None = None
            for _ in range(len(cmds)):  # +OK, +QUEUED (or why not: -OOM), then EXEC's results
                try:
                    results: list[Any] = await conn.read_response()
                except ResponseError as exc:  # read every reply: the connection stays usable
                    refused = refused or exc
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        if refused is not None:
            raise refused
        return results  # a failed command (WRONGTYPE) is its exception, for the decoder to skip

    async def snapshot(self, engines: Iterable[int] | None = None) -> Snapshot:
        """All engines (or only *engines*) at one instant, in one round trip."""
        return self.decode(await self.read(engines))

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    aclose = close  # every async class closes with ``await x.aclose()``, as redis.asyncio does
