"""The asyncio twins: writer, reader, lease and reporter on ``redis.asyncio``, with no thread.

They share every rule with the threaded classes through the sans-I/O cores
(:class:`~redis_stats.writer.WriterCore`, :class:`~redis_stats.reader.ReaderCore`,
:class:`~redis_stats.leader.LeaseState`, :class:`~redis_stats.reporting.ReportCore`):
only the waiting differs. Recording stays synchronous and in memory (``child.inc(1)`` in a
coroutine is fine); flushing is a task on the running loop.

    async def main():
        writer = AsyncStatsWriter(config, catalog, engines=[0])
        writer.start()                       # needs a running loop
        writer.counter("tokens").labels(engine=0).inc(5)
        await writer.close()

**Fork.** An event loop does not survive ``os.fork()``, so neither does a flusher task. Make the
asyncio writer in each process, after the fork, on that process's loop (gunicorn/uvicorn
workers: in the worker's startup, not at import with ``--preload``). A writer inherited
across a fork becomes, in the child, a new writer with nothing pending (it never re-sends the
parent's data) and no task: call :meth:`AsyncStatsWriter.start` from the child's running loop,
or its records there are never flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from redis.exceptions import ExecAbortError, NoScriptError, OutOfMemoryError, ResponseError

from redis_stats._core.snapshot import Snapshot
from redis_stats._scripts import AsyncScript, load_script
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import AsyncClient, make_async_client
from redis_stats.keys import Keys
from redis_stats.leader import Leader, LeaseState
from redis_stats.reader import ReaderCore, refused_for_memory
from redis_stats.reporting import LogLines, ReportCore
from redis_stats.writer import WriterCore

__all__ = ["AsyncLeaseLeader", "AsyncStatsReader", "AsyncStatsReporter", "AsyncStatsWriter"]

log = logging.getLogger("redis_stats.aio")


class AsyncStatsWriter(WriterCore):
    """The asyncio twin of :class:`~redis_stats.writer.StatsWriter`: a flusher task, same
    batches, same exactly-once protocol. Call :meth:`start` from a running loop."""

    def __init__(
        self,
        config: StatsConfig | None = None,
        catalog: Catalog | None = None,
        *,
        engines: tuple[int, ...] | list[int] = (),
        writer_id: str | None = None,
        role: str = "",
        owner: str = "",
        client: AsyncClient | None = None,
    ) -> None:
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        super().__init__(config, catalog, engines=engines, writer_id=writer_id, role=role, owner=owner)
        self._own_client = client is None
        self._client: Any = None
        self._script: Any = None
        self._use_client(client if client is not None else make_async_client(self.config))  # no I/O yet

    def _use_client(self, client: Any) -> None:
        self._client = client
        self._script = AsyncScript(client, load_script("flush"))

    def _forked(self) -> None:
        super()._forked()
        # The parent's loop, task and sockets do not exist here: start() on the child's loop.
        self._flush_lock = asyncio.Lock()
        self._task = None
        if self._own_client:
            self._client = None

    def start(self) -> None:
        """Start the flusher task on the running loop (idempotent). Needs no Redis connection."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis_stats-flusher")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_interval)
            await self.flush()

    async def flush(self, *, closing: bool = False) -> bool:
        """Send what is pending now, in one script call; True if Redis confirmed it. Never raises
        for a Redis problem."""
        async with self._flush_lock:
            if self._client is None:  # first flush in a forked child
                self._use_client(make_async_client(self.config))
            keys, args = self.prepare_flush(closing=closing)
            started = time.perf_counter()
            try:
                reply = await self._call(keys, args)
            except Exception as exc:  # never raise into the host
                self.flush_failed(exc)
                return False
            self.flush_succeeded(reply, time.perf_counter() - started)
            return True

    async def _call(self, keys: list[str], args: list[str]) -> Any:
        if not self.config.wait_replicas:
            return await self._script(keys, args)
        wanted, timeout = self.config.wait_replicas, self.config.wait_timeout_ms
        if hasattr(self._client, "get_node_from_key"):  # Cluster: WAIT on the node of our slot
            reply = await self._script(keys, args)
            node = self._client.get_node_from_key(keys[0])
            acked = await self._client.execute_command("WAIT", wanted, timeout, target_nodes=node)
        else:  # script and WAIT pipelined on one connection: one round trip
            for attempt in (1, 2):
                pipe = self._client.pipeline(transaction=False)
                pipe.evalsha(self._script.sha, len(keys), *keys, *args)
                pipe.execute_command("WAIT", wanted, timeout)
                reply, acked = await pipe.execute(raise_on_error=False)
                if isinstance(reply, NoScriptError) and attempt == 1:
                    await self._client.script_load(self._script.source)
                    continue
                break
        return self.script_and_wait(reply, acked)

    async def close(self, timeout: float | None = None) -> bool:
        """Stop the task and flush what is left, for at most *timeout* seconds (default
        ``config.close_timeout``); True when everything recorded was confirmed. Marks the writer
        closed in Redis. At the deadline an attempt still waiting on Redis is cancelled, one
        warning says what was lost, and close returns."""
        if self._closed:
            return not self.pending()
        budget, deadline = self.close_budget(timeout)
        self._closed = True
        if self._task is not None:
            self._task.cancel()  # also interrupts a flush waiting on a hung socket
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            done = await asyncio.wait_for(self._final_flush(deadline), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            done = False
        if not done:
            self.warn_lost(budget, log)
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
        return done

    async def _final_flush(self, deadline: float) -> bool:
        if self._client is None and not self.pending():
            return True  # a forked child that recorded nothing: nothing of its own to send
        while True:
            done, pause = self.final_flush_step(await self.flush(closing=True), deadline)
            if done is not None:
                return done
            await asyncio.sleep(pause)

    aclose = close  # every async class closes with ``await x.aclose()``, as redis.asyncio does

    async def __aenter__(self) -> AsyncStatsWriter:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


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
        if hasattr(self._client, "get_node_from_key"):  # Cluster: the script, on the slot's node
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

    async def _meta(self) -> Any:
        try:
            meta = await self._client.hgetall(self.keys.meta)
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


class AsyncLeaseLeader:
    """The asyncio twin of :class:`~redis_stats.leader.LeaseLeader`: a renewal task."""

    def __init__(self, client: Any, keys: Keys, holder: str, *, ttl: float = 10.0) -> None:
        self.state = LeaseState(keys, holder, ttl)
        self.client = client
        self._script = AsyncScript(client, load_script("lease"))
        self._task: asyncio.Task[None] | None = None

    @property
    def on_acquire(self) -> Any:
        """Called when this process becomes the holder."""
        return self.state.on_acquire

    @on_acquire.setter
    def on_acquire(self, callback: Any) -> None:
        self.state.on_acquire = callback

    def start(self) -> None:
        """Start renewing every ``ttl / 3`` on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis_stats-lease")

    async def _run(self) -> None:
        while True:
            await self.renew()
            await asyncio.sleep(self.state.ttl / 3)

    async def renew(self) -> bool:
        """Take or renew the lease once; True if this process holds it now."""
        sent = time.monotonic()
        keys, args = self.state.call("acquire")
        try:
            token = int(await self._script(keys, args))
        except Exception as exc:
            return self.state.unanswered(exc)
        return self.state.answered(token, sent)

    def is_leader(self) -> bool:
        """True until the locally computed end of the lease."""
        return self.state.is_leader()

    def close(self) -> None:
        """Stop renewing (the lease expires by itself; :meth:`aclose` also releases it)."""
        if self._task is not None:
            self._task.cancel()

    async def aclose(self) -> None:
        """Stop renewing and release the lease if held."""
        self.close()
        if self.state.valid_until:
            self.state.valid_until = 0.0
            with contextlib.suppress(Exception):
                await self._script(*self.state.call("release"))


class AsyncStatsReporter:
    """The asyncio twin of :class:`~redis_stats.reporting.StatsReporter` (same lines, same rules)."""

    def __init__(
        self,
        reader: AsyncStatsReader,
        leader: Leader,
        *,
        lines: LogLines,
        interval: float = 10.0,
        logger: logging.Logger | None = None,
    ) -> None:
        self.reader = reader
        self.leader = leader
        self.interval = interval
        # The shared sans-I/O core (not the threaded StatsReporter: no thread, Event or Lock
        # here, and its tick() would call this reader's coroutine without awaiting it).
        self._core = ReportCore(reader, leader, lines=lines, interval=interval, logger=logger)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        if hasattr(leader, "on_acquire"):
            # A new lease holder prints at once: schedule a tick on the loop.
            leader.on_acquire = lambda: asyncio.get_running_loop().create_task(self.tick())

    async def tick(self) -> list[str]:
        """Read, and if leader log the interval since the previous read; returns the INFO lines."""
        async with self._lock:
            try:
                snap = await self.reader.snapshot()
            except Exception as exc:
                return self._core.read_failed(exc)
            return self._core.consume(snap)

    def start(self) -> None:
        """Tick every interval on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis_stats-reporter")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()

    async def close(self) -> None:
        """Stop ticking and give up leadership."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        aclose = getattr(self.leader, "aclose", None)
        if aclose is not None:
            await aclose()
        else:
            self.leader.close()

    aclose = close  # every async class closes with ``await x.aclose()``, as redis.asyncio does
