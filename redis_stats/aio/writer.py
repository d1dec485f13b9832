"""The asyncio writer: :class:`AsyncStatsWriter`, a flusher task around the shared WriterCore.

**Fork.** An event loop does not survive ``os.fork()``, so neither does a flusher task. Make the
asyncio writer in each process, after the fork, on that process's loop (gunicorn/uvicorn
workers: in the worker's startup, not at import with ``--preload``). A writer inherited
across a fork becomes, in the child, a new writer with nothing pending (it never re-sends the
parent's data) and no task: call :meth:`AsyncStatsWriter.start` from the child's running loop,
or its records there are never flushed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from redis.exceptions import NoScriptError

from redis_stats._core.steps import arun
from redis_stats._scripts import AsyncScript, load_script
from redis_stats.aio.stopping import CLOSE_GRACE, stop_task, within
from redis_stats.background import survive
from redis_stats.capability import CHECK_STEPS, acheck_step
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import AsyncClient, is_cluster, make_async_client
from redis_stats.load import LoadMap
from redis_stats.writer import WriterCore
from redis_stats.writer.lane import lane_sleep

__all__ = ["AsyncStatsWriter"]

# One logger for the asyncio package, named as before the split (filters keep working).
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
        load: LoadMap | None = None,
    ) -> None:
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        super().__init__(
            config, catalog, engines=engines, writer_id=writer_id, role=role, owner=owner, load=load
        )
        self._own_client = client is None
        self._client: Any = None
        self._script: Any = None
        self._use_client(client if client is not None else make_async_client(self.config))  # no I/O yet

    def _use_client(self, client: Any) -> None:
        self._client = client
        self._script = AsyncScript(client, load_script("flush"))
        self._shards_script = AsyncScript(client, load_script("shards"))
        self._named: dict[str, AsyncScript] = {}  # scripts of the attached parts, by name

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
        interval = self.config.flush_interval
        lane = self.config.lane_interval if self.load is not None else 0.0
        due = time.monotonic() + interval
        last_lane = -math.inf
        # close() sets _closed before it cancels: the loop ends after the step it is in even
        # when the cancellation never reaches it (redis-py may report one as a timeout).
        while not self._closed:
            # The load lane as the blocking writer's (StatsWriter._run): a look every LANE_POLL s.
            await asyncio.sleep(lane_sleep(due, lane, last_lane))
            if self._closed:
                return
            now = time.monotonic()
            with survive("flusher", log):  # never raises for Redis; anything else is counted
                if now >= due:
                    await self.flush()
                    due = time.monotonic() + interval
                elif lane and now - last_lane >= lane and await self.flush_load():
                    last_lane = now

    async def flush_load(self) -> bool:
        """The load lane (see StatsWriter.flush_load: the same calls, awaited); True if a call
        was made; never raises."""
        async with self._flush_lock:
            if self._client is None or not self.stats.flushes or self.lane is None:
                return False
            calls = self.lane.calls()
            self.stats.lane_calls += len(calls)  # the lane's attempts, what its errors are a share of
            stored = True
            for key, args in calls:
                try:
                    result = await self._client.execute_command("HSET", key, *args)
                except Exception as exc:  # counted; every entry goes again with the next call
                    result = exc
                stored = stored and not isinstance(result, Exception)
                self.lane.done(result, self.stats)
            for key, ids in self.lane.confirm_calls(stored):  # the routers' bookings these count
                try:
                    await self._client.execute_command("HDEL", key, *ids)
                except Exception as exc:  # the bookings end by their bounded time instead
                    self.lane.done(exc, self.stats)
            return bool(calls)

    async def flush(self, *, closing: bool = False) -> bool:
        """Send what is pending now, in one script call per shard written to (one after the
        other); True if Redis confirmed every one. Never raises for a Redis problem."""
        async with self._flush_lock:
            if self._client is None:  # first flush in a forked child
                self._use_client(make_async_client(self.config))
            return await arun(self.flush_steps(closing=closing), self._carry_out)

    async def _carry_out(self, what: str, arg: Any) -> Any:
        """One step of :meth:`WriterCore.flush_steps`, awaited."""
        if what in CHECK_STEPS:
            return await acheck_step(self._client, self.config, what, arg)
        if what == "shards":
            return await self._shards_script(*arg)
        if what == "script":  # an attached part's (the usage ledger's)
            name, keys, args = arg
            if name not in self._named:
                self._named[name] = AsyncScript(self._client, load_script(name))
            return await self._named[name](keys, args)
        return await self._call(*arg)

    async def _call(self, keys: list[str], args: list[str]) -> Any:
        """One flush (see StatsWriter._call: the same calls, awaited)."""
        wanted, timeout = self.config.wait_replicas, self.config.wait_timeout_ms
        if not wanted:
            return await self._script(keys, args)
        if is_cluster(self._client):  # redis-py pipelines no script on a Cluster
            reply = await self._script(keys, args)
            node = self._client.get_node_from_key(keys[0])
            acked = await self._client.execute_command("WAIT", wanted, timeout, target_nodes=node)
            return self.script_and_wait(reply, acked)
        for attempt in (1, 2):
            pipe = self._client.pipeline(transaction=False)
            pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", wanted, timeout)
            results = await pipe.execute(raise_on_error=False)
            if isinstance(results[0], NoScriptError) and attempt == 1:
                await self._client.script_load(self._script.source)  # the flush did not run: again
                continue
            break
        return self.script_and_wait(results[0], results[1])

    async def close(self, timeout: float | None = None) -> bool:
        """Stop the task and flush what is left, for at most *timeout* seconds (default
        ``config.close_timeout``); True when everything recorded was confirmed. Marks the writer
        closed in Redis. At the deadline an attempt still waiting on Redis is cancelled, one
        warning says what was lost, and close returns (its client's close gets
        :data:`~redis_stats.aio.stopping.CLOSE_GRACE` more at most), whatever Redis does."""
        if self._closed:
            return not self.pending()
        budget, deadline = self.close_budget(timeout)
        self._closed = True  # first: the flusher's loop checks it (see _run)
        done = await within(self._last_flush(deadline), deadline, False)
        if not done:
            self.warn_lost(budget, log)
        if self._client is not None:
            await within(self._client.aclose(), max(deadline, time.monotonic() + CLOSE_GRACE), None)
        return done

    async def _last_flush(self, deadline: float) -> bool:
        """Stop the flusher task (cancelled, again and again, until it ends: a flush waiting on
        a hung socket is interrupted), then the last flush, marking the writer closed."""
        await stop_task(self._task, deadline)
        return await self._final_flush(deadline)

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
