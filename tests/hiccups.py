"""Redis hiccups for the close tests: a server frozen by SIGSTOP, and a redis-py connection that
turns a cancellation into its own timeout (as redis-py did in issue 32's rounds that hung: the
flush logged "Timeout reading ..." and the cancelled flusher went on)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import redis.asyncio
import redis.exceptions


@contextlib.contextmanager
def frozen(server: Any) -> Iterator[None]:
    """SIGSTOP *server* (an EmbeddedRedis): connections are accepted by the kernel, nothing is
    answered; SIGCONT on the way out, whatever happened."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


class CancelAsTimeout(redis.asyncio.Connection):
    """A real connection whose wait for a reply, when cancelled, raises redis-py's TimeoutError
    instead of the cancellation (the caller's task goes on, as if it had never been cancelled)."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise redis.exceptions.TimeoutError(f"Timeout reading from {self.host}:{self.port}") from None


def cancel_as_timeout(client: Any) -> Any:
    """*client* (a ``redis.asyncio`` client, no connection made yet) with :class:`CancelAsTimeout`
    connections."""
    client.connection_pool.connection_class = CancelAsTimeout
    return client


async def stop_for_good(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel *tasks* until they end (cleanup after a close that did not return), 5 s at most."""
    for task in tasks:
        for _ in range(100):
            if task is None or task.done():
                break
            task.cancel()
            await asyncio.wait({task}, timeout=0.05)
