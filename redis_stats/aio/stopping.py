"""Stopping the asyncio twins' tasks within a deadline, whatever Redis does.

A close must return within its budget: Redis may be frozen (SIGSTOP), restarting or slow. One
``task.cancel()`` is not enough to stop a task that waits on Redis: redis-py may turn the
cancellation into its own error (a flush then logs "Timeout reading ..." and goes on), and a
close that awaited such a task without a bound waited for ever. So each background loop checks a
flag of its own (set by close before anything else), and close cancels the task again every
:data:`RECANCEL` seconds and waits for it only until the deadline (:func:`stop_task`); what close
awaits itself runs under :func:`within`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["CLOSE_GRACE", "RECANCEL", "stop_task", "within"]

T = TypeVar("T")

RECANCEL = 0.05
"""Seconds between two cancellations of a task that has not ended yet."""

CLOSE_GRACE = 0.1
"""Seconds a close still gives the client's own close (its sockets) once the budget is spent."""


async def stop_task(task: asyncio.Task[Any] | None, deadline: float) -> bool:
    """Cancel *task* (again every :data:`RECANCEL` s) until it ends or the monotonic *deadline*
    passes; True if it ended. A task left running at the deadline stays cancelled: its loop's
    flag ends it after the step it is in."""
    if task is None:
        return True
    while not task.done():
        task.cancel()  # at least once, even with no time left
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.wait({task}, timeout=min(left, RECANCEL))
    return True


async def within(coro: Coroutine[Any, Any, T], deadline: float, default: T) -> T:
    """What *coro* returns if it ends by the monotonic *deadline* (its exception, if it raised);
    else *default*, and *coro* is cancelled and left to end by itself (never awaited past the
    deadline: a cancellation the library under it turns into an error must not hold the caller)."""
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
    except asyncio.CancelledError:
        task.cancel()  # the caller itself was cancelled: so is what it waited for
        raise
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(_retrieve)
    return default


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Take a left task's outcome, so asyncio does not log "exception was never retrieved"."""
    if not task.cancelled():
        task.exception()
