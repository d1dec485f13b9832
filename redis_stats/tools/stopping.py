"""How a long-running command stops: Ctrl-C and SIGTERM both call one function of its own; and
how it is told to read its files again: SIGHUP (``systemctl reload``, ``kill -HUP``)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["on_sighup", "stop_on_signals"]


@contextmanager
def stop_on_signals(stop: Callable[[], object]) -> Iterator[None]:
    """While inside, SIGINT (Ctrl-C) and SIGTERM (how Kubernetes stops a pod) call *stop*
    instead of raising ``KeyboardInterrupt`` or ending the process; the previous handlers come
    back on the way out. Enter it in the main thread (Python runs signal handlers there only).

    *stop* must be safe in a signal handler (``threading.Event.set``): the command waits for it
    in the main thread, with a timeout, and closes what it runs. Handled explicitly because a
    shell may start the command with SIGINT ignored, and because a ``KeyboardInterrupt`` out of
    a serving loop was seen lost (an exporter kept serving after SIGINT about 1 time in 10).
    """
    previous = {sig: signal.signal(sig, lambda *_: stop()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def on_sighup(call: Callable[[], object]) -> Iterator[None]:
    """While inside, SIGHUP calls *call* (signal-safe, as *stop* above: set an Event and act on
    it in the main loop) instead of ending the process, SIGHUP's default; the previous handler
    comes back on the way out."""
    previous = signal.signal(signal.SIGHUP, lambda *_: call())
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
