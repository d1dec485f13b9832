"""The asyncio reader: :class:`AsyncStatsReader`, the shared ReaderCore on ``redis.asyncio``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.exceptions import ResponseError

from redis_stats._core.read.decoder import Read
from redis_stats._core.steps import arun
from redis_stats._scripts import AsyncScript, load_script
from redis_stats.aio.stopping import CLOSE_GRACE, within
from redis_stats.capability import CHECK_STEPS, acheck_step
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import AsyncClient, is_cluster, make_async_client
from redis_stats.load import LoadView
from redis_stats.reader import Engines, ReaderCore
from redis_stats.snapshot import Snapshot

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

    async def load(self, engines: Engines = None) -> LoadView:
        """The load feed (see StatsReader.load: the same steps, awaited)."""
        return await arun(self.load_steps(engines, is_cluster(self._client)), self._carry_out)

    async def read(self, engines: Engines = None) -> Read:
        """One consistent read of the namespace (see StatsReader.read: the same steps, awaited)."""
        return await arun(self.snapshot_steps(engines, is_cluster(self._client)), self._carry_out)

    async def _carry_out(self, what: str, arg: Any) -> Any:
        """One step of :meth:`ReaderCore.read_steps`, awaited."""
        if what in CHECK_STEPS:
            return await acheck_step(self._client, self.config, what, arg)
        if what == "transaction":
            return await self._transaction(arg)
        if what == "meta":
            try:
                meta = await self._client.hgetall(arg.meta)
            except ResponseError as exc:  # retyped since the read: the decoder skips it
                return exc
            return [x for kv in meta.items() for x in kv]
        return list(await asyncio.gather(*(self._script(*a) for a in arg)))  # "scripts"

    async def _transaction(self, cmds: list[tuple[Any, ...]]) -> list[Any]:
        pool = self._client.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(self._packed(conn, cmds))
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

    async def snapshot(self, engines: Engines = None) -> Snapshot:
        """All engines (or only *engines*) at one instant, in one round trip."""
        return self.decode(await self.read(engines))

    async def close(self, timeout: float | None = None) -> None:
        """Close the connection pool, within *timeout* seconds (default ``config.close_timeout``)
        whatever Redis does (a close still waiting on a socket then ends by itself)."""
        budget = self.config.close_timeout if timeout is None else max(0.0, timeout)
        await within(self._client.aclose(), time.monotonic() + max(budget, CLOSE_GRACE), None)

    aclose = close  # every async class closes with ``await x.aclose()``, as redis.asyncio does
