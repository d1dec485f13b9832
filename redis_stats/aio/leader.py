"""The asyncio lease: :class:`AsyncLeaseLeader`, the shared LeaseState renewed by a task."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from redis_stats._scripts import AsyncScript, load_script
from redis_stats.keys import Keys
from redis_stats.leader import LeaseState

__all__ = ["AsyncLeaseLeader"]


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
