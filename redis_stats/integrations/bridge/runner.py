"""Bridge: several sources, each scraped by its own thread at an interval, until closed.

A thread per source keeps a source that hangs (up to its timeout) from delaying the others'
scrapes and heartbeats.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from .source import BridgedSource

__all__ = ["Bridge"]

log = logging.getLogger("redis_stats.bridge")


class Bridge:
    """Scrapes every source of *sources* each *interval* seconds (default: the first source's
    ``flush_interval``), from one thread per source, until :meth:`close`."""

    def __init__(self, sources: Sequence[BridgedSource], *, interval: float | None = None) -> None:
        if not sources:
            raise ValueError("a bridge needs at least one source")
        self.sources = list(sources)
        self.interval = float(interval if interval is not None else self.sources[0].config.flush_interval)
        if not self.interval > 0:
            raise ValueError(f"interval={interval!r} must be a positive number of seconds")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __repr__(self) -> str:
        return f"Bridge({[s.safe_url for s in self.sources]!r}, interval={self.interval})"

    def start(self) -> Bridge:
        """Start one scraping thread per source (idempotent)."""
        if not self._threads:
            for i, source in enumerate(self.sources):
                thread = threading.Thread(
                    target=self._run, args=(source,), name=f"redis_stats-bridge-{i}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return self

    def _run(self, source: BridgedSource) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                source.scrape()
            except Exception:  # a bug must not end this source's thread: log it, go on
                log.exception("source %s: unexpected error in a scrape", source.safe_url)
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def stop(self) -> None:
        """Ask the threads to stop after their scrape (safe in a signal handler); :meth:`close`
        then closes the writers."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`stop` or :meth:`close` is called (True) or *timeout* passes (False)."""
        return self._stop.wait(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Stop the threads and close every source's writer (marked closed in Redis). True
        when every writer's last flush was confirmed."""
        self._stop.set()
        # A scrape in progress ends within its fetch timeout plus two flushes (a correction's).
        budget = max(
            s.timeout + 2 * (s.config.connect_timeout_ms + s.config.socket_timeout_ms) / 1000
            for s in self.sources
        )
        budget += 1.0
        for thread in self._threads:
            thread.join(budget)
        return all([source.close(timeout) for source in self.sources])

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
