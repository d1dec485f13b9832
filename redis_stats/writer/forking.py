"""What ``os.fork()`` does to every live writer (POSIX: :func:`os.register_at_fork`).

Before the fork, every writer's record lock is taken, so no thread is half-way through an update
when the child's copy is made; after it, released on both sides. In the child each writer then
becomes a new writer (:meth:`~redis_stats.writer.core.WriterCore._forked`: a new id, nothing
pending); the blocking writer also gets fresh locks, and its flusher thread is started by its
first record (no thread may start in an at-fork hook).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the writers looked after (core.py imports this module)
    from redis_stats.writer.core import WriterCore

__all__ = ["track"]

# Every live writer, weakly (the registry must not keep a writer alive), for the fork hooks below.
_LIVE: weakref.WeakSet[WriterCore] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_FORKING: list[WriterCore] = []


def track(writer: WriterCore) -> None:
    """Have the fork hooks look after *writer* from now on (held weakly: it may be collected)."""
    with _LIVE_LOCK:
        _LIVE.add(writer)


def _before_fork() -> None:
    # Hold every writer's record lock across fork(): no thread is half-way through an update
    # when the child's copy is made, and the lock is released (not orphaned) on both sides. It
    # is held for microseconds at a time (a take only swaps under it), so fork() barely waits.
    _LIVE_LOCK.acquire()
    _FORKING[:] = list(_LIVE)
    for writer in _FORKING:
        writer._before_fork()
        writer._acc.lock.acquire()


def _after_fork_in_parent() -> None:
    for writer in _FORKING:
        writer._acc.lock.release()
    _FORKING.clear()
    _LIVE_LOCK.release()


def _after_fork_in_child() -> None:
    for writer in _FORKING:
        writer._acc.lock.release()
    writers, _FORKING[:] = list(_FORKING), []
    _LIVE_LOCK.release()
    for writer in writers:
        try:
            writer._forked()
        except Exception:  # pragma: no cover - a hook must not break the host's fork
            pass


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
    )
