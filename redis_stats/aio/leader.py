"""The asyncio lease: :class:`AsyncLeaseLeader`, the shared LeaseState renewed by a task."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from redis_stats._core.lease import LeaseHolder, LeaseState, log
from redis_stats._scripts import AsyncScript, load_script
from redis_stats.aio.stopping import stop_task, within
from redis_stats.background import survive
from redis_stats.connection import key_target
from redis_stats.keys import Keys

__all__ = ["AsyncLeaseLeader"]


class AsyncLeaseLeader(LeaseHolder):
    """The asyncio twin of :class:`~redis_stats.leader.LeaseLeader`: a renewal task (the same
    *wait_replicas*: a take or renewal counts only once that many replicas acknowledged it)."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        holder: str,
        *,
        ttl: float = 10.0,
        close_timeout: float = 1.0,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 500,
    ) -> None:
        self.state = LeaseState(
            keys, holder, ttl, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms
        )
        self.client = client
        self.close_timeout = close_timeout
        self._script = AsyncScript(client, load_script("lease"))
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        """Start renewing every ``ttl / 3`` on the running loop."""
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis_stats-lease")

    async def _run(self) -> None:
        # close() sets _closing before it cancels: a cancellation redis-py turns into an error
        # still ends the loop.
        while not self._closing:
            with survive("lease", log):  # renew() never raises for Redis; anything else is counted
                await self.renew()
            await asyncio.sleep(self.state.period)

    async def renew(self) -> bool:
        """Take or renew the lease once; True if this process holds it now."""
        keys, args, sent = self.state.renewal()
        try:
            reply = await self._script(keys, args)
        except Exception as exc:
            reply = exc
        wait = self.state.wait_args(reply)
        if wait is not None:  # see LeaseLeader.renew: counts only once replicas hold it
            try:
                acked = await self.client.execute_command("WAIT", *wait, **key_target(self.client, keys[0]))
            except Exception as exc:
                acked = exc
            reply = self.state.acknowledged(reply, acked)
        return self.state.renewed(reply, sent)

    def close(self, timeout: float | None = None) -> None:
        """Stop renewing (the lease expires by itself; :meth:`aclose` also releases it)."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()

    async def aclose(self, timeout: float | None = None) -> None:
        """Stop renewing and release the lease if held, within *timeout* seconds (default
        :attr:`close_timeout`) whatever Redis does (an unreleased lease expires after its ttl)."""
        deadline = time.monotonic() + (self.close_timeout if timeout is None else max(0.0, timeout))
        self.close()
        await stop_task(self._task, deadline)
        release = self.state.release()
        if release is not None:
            with contextlib.suppress(Exception):  # the lease expires by itself anyway
                await within(self._script(*release), deadline, None)
