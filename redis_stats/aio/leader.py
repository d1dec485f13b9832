"""The asyncio lease: :class:`AsyncLeaseLeader`, the shared LeaseState renewed by a task."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis_stats._core.lease import LeaseHolder, LeaseState
from redis_stats._scripts import AsyncScript, load_script
from redis_stats.keys import Keys

__all__ = ["AsyncLeaseLeader"]


class AsyncLeaseLeader(LeaseHolder):
    """The asyncio twin of :class:`~redis_stats.leader.LeaseLeader`: a renewal task."""

    def __init__(self, client: Any, keys: Keys, holder: str, *, ttl: float = 10.0) -> None:
        self.state = LeaseState(keys, holder, ttl)
        self.client = client
        self._script = AsyncScript(client, load_script("lease"))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start renewing every ``ttl / 3`` on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis_stats-lease")

    async def _run(self) -> None:
        while True:
            await self.renew()
            await asyncio.sleep(self.state.period)

    async def renew(self) -> bool:
        """Take or renew the lease once; True if this process holds it now."""
        keys, args, sent = self.state.renewal()
        try:
            reply = await self._script(keys, args)
        except Exception as exc:
            reply = exc
        return self.state.renewed(reply, sent)

    def close(self) -> None:
        """Stop renewing (the lease expires by itself; :meth:`aclose` also releases it)."""
        if self._task is not None:
            self._task.cancel()

    async def aclose(self) -> None:
        """Stop renewing and release the lease if held."""
        self.close()
        release = self.state.release()
        if release is not None:
            with contextlib.suppress(Exception):  # the lease expires by itself anyway
                await self._script(*release)
