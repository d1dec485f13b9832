"""Background work never dies: what a loop survived, counted by thread and kind.

Each background thread or task of the package (a writer's flusher, the lease keeper, the
reporter, the ``/load`` refresher, the exporter's gc and window loops) does its unit of work
under :func:`survive`: an exception its unit did not handle itself (a bug, a value no one
thought of: ``OverflowError``, ``KeyError``) is counted here and logged once per kind with its
traceback, and the loop goes on with its next round. A thread that died would freeze what it
feeds for as long as the process lives (a ``/load`` refresher that died served its last body as
``200`` for ever).

The counts are the process's (every component of it adds to one tally): the exporter serves them
as ``redis_stats_background_errors_total{thread,kind}`` (docs/self-metrics.md).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["background_errors", "survive", "survived"]

_lock = threading.Lock()
_tally: dict[tuple[str, str], int] = {}


def survived(thread: str, exc: BaseException, logger: logging.Logger) -> None:
    """Count *exc*, which the unit of work of background *thread* did not handle; the first of
    each (thread, kind) is logged at ERROR with its traceback, the others at DEBUG."""
    kind = type(exc).__name__
    with _lock:
        n = _tally[thread, kind] = _tally.get((thread, kind), 0) + 1
    if n == 1:
        logger.error(
            "redis_stats background %s: %s: %s (counted in redis_stats_background_errors_total; the "
            "%s goes on with its next round; further %s errors are logged at DEBUG)",
            thread,
            kind,
            exc,
            thread,
            kind,
            exc_info=exc,
        )
    else:
        logger.debug("redis_stats background %s: %s: %s (#%d)", thread, kind, exc, n)


@contextmanager
def survive(thread: str, logger: logging.Logger) -> Iterator[None]:
    """Run one unit of work of background *thread*: an ``Exception`` it raises is counted and
    logged (:func:`survived`) instead of ending the loop. ``BaseException`` (a cancellation,
    ``SystemExit``) goes through: that is how a loop is stopped."""
    try:
        yield
    except Exception as exc:
        survived(thread, exc, logger)


def background_errors() -> dict[tuple[str, str], int]:
    """``(thread, kind) -> count`` of every exception a background loop of this process survived."""
    with _lock:
        return dict(_tally)


def _forked() -> None:
    # The lock may have been held by a thread that does not exist in the child; the counts are
    # the parent's (a counter is per process).
    global _lock
    _lock = threading.Lock()
    _tally.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forked)
