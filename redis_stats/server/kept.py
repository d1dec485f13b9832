"""What the server keeps because a request asked: bounded in bytes, dropped when idle.

A request parameter can make the server keep something for the next request with the same
parameter: a reader and renderer of one ``?slice=``, the renderer of one ``?endpoint=``, the
``/load`` body of one slice, one namespace's ``/snapshot`` window. Any client can ask a thousand
distinct values, so each of these is an entry of one :class:`Kept` per server: an estimate of its
bytes (asked of the entry each time the budget is checked: a renderer grows with what it has
rendered), the time it was last used, and a ``close()`` called when it goes.

Entries go least recently used first once their bytes add up past *budget*, and whenever one
has not been used for *idle* seconds (checked on every insertion and by the server's upkeep
every few seconds). An entry larger than the whole budget is made and used for its request, but
not kept. Once megabytes were dropped, the process gives the memory back to the system
(:func:`release_memory`): after any request pattern its resident size comes back near its
resting size.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Protocol, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["IDLE", "Kept", "KeptEntry", "release_memory"]

log = logging.getLogger("redis_stats.exporter")

IDLE = 60.0
"""Seconds an entry is kept after its last use."""

RELEASE_AFTER = 8 * 2**20
"""Bytes dropped (estimated) after which the process returns freed memory to the system."""


class KeptEntry(Protocol):
    """What :class:`Kept` holds: its estimated size, and what to do when it goes."""

    def kept_bytes(self) -> int:
        """An estimate of the bytes this entry holds (its caches, its last body)."""
        ...

    def close(self) -> None:
        """Called once when the entry is dropped: stop its background work. A request already
        holding it may still use it (and a reader's Redis client is shared: never closed here)."""
        ...


E = TypeVar("E", bound=KeptEntry)


def release_memory() -> None:
    """Collect garbage, then ask the C library to give free memory back to the system
    (``malloc_trim``, glibc only; elsewhere the collection alone)."""
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


class Kept:
    """The entries of one server, each under a key ``(kind, namespace, parameter)``.

    Thread-safe: entries are made outside the lock (a reader's first read can take a while), and
    two requests making the same entry at once keep the first (the second's is closed).
    """

    def __init__(self, budget: int, *, idle: float = IDLE) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"view_budget={budget!r} must be a whole number of bytes >= 0")
        if not idle > 0:
            raise ValueError(f"idle={idle!r} must be a positive number of seconds")
        self.budget = budget
        self.idle = idle
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str, Hashable], tuple[Any, float]] = OrderedDict()
        self._dropped: Counter[tuple[str, str]] = Counter()  # (kind, why) -> entries dropped
        self._unreleased = 0  # bytes dropped since memory was last given back

    def get(self, key: tuple[str, str, Hashable], make: Callable[[], E]) -> E:
        """The entry under *key*, made by *make* when there is none (then the oldest go, as the
        budget says)."""
        now = time.monotonic()
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries[key] = (found[0], now)
                self._entries.move_to_end(key)
                return found[0]  # type: ignore[no-any-return]
        made = make()
        with self._lock:
            found = self._entries.get(key)
            if found is not None:  # another request made it meanwhile: keep theirs
                winner, loser = found[0], made
            else:
                self._entries[key] = (made, now)
                winner, loser = made, None
        if loser is not None:
            loser.close()
        self.sweep()
        return winner  # type: ignore[no-any-return]

    def drop(self, kind: str | None = None, namespace: str | None = None) -> None:
        """Drop the entries of *kind* and/or *namespace* (None: any)."""
        with self._lock:
            keys = [
                k
                for k in self._entries
                if (kind is None or k[0] == kind) and (namespace is None or k[1] == namespace)
            ]
            gone = [(k, self._entries.pop(k)[0]) for k in keys]
        self._closed(gone, "dropped")

    def sweep(self) -> None:
        """Drop the entries idle for :attr:`idle` seconds, then the least recently used until
        the rest fit in :attr:`budget`; give memory back once megabytes went."""
        now = time.monotonic()
        with self._lock:
            idle = [k for k, (_, used) in self._entries.items() if now - used > self.idle]
            gone = [(k, self._entries.pop(k)[0]) for k in idle]
            sizes = [(k, _size(entry)) for k, (entry, _) in self._entries.items()]
            total = sum(size for _, size in sizes)
            over = []
            for k, size in sizes:  # oldest first
                if total <= self.budget:
                    break
                over.append((k, self._entries.pop(k)[0]))
                total -= size
        self._closed(gone, "idle")
        self._closed(over, "budget")

    def _closed(self, gone: list[tuple[tuple[str, str, Hashable], Any]], why: str) -> None:
        released = 0
        for key, entry in gone:
            released += _size(entry)
            self._dropped[key[0], why] += 1
            try:
                entry.close()
            except Exception:  # one entry's close must not keep the others
                log.exception("closing a kept %s failed", key[0])
        if not gone:
            return
        with self._lock:
            self._unreleased += released
            due = self._unreleased >= RELEASE_AFTER
            if due:
                self._unreleased = 0
        if due:
            release_memory()

    def close(self) -> None:
        """Drop every entry."""
        self.drop()

    def __iter__(self) -> Iterator[tuple[tuple[str, str, Hashable], Any]]:
        with self._lock:
            return iter([(k, entry) for k, (entry, _) in self._entries.items()])

    def bytes_by_kind(self) -> dict[str, int]:
        """The estimated bytes held, by kind."""
        out: Counter[str] = Counter()
        for key, entry in self:
            out[key[0]] += _size(entry)
        return dict(out)

    def describe(self) -> list[Metric]:
        """Nothing ahead (registering must stay cheap)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """``redis_stats_exporter_kept_bytes{kind}``, ``..._kept_entries{kind}`` and
        ``..._kept_dropped_total{kind,why}``: the exporter's own figures."""
        sizes: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for key, entry in self:
            sizes[key[0]] += _size(entry)
            counts[key[0]] += 1
        kept = GaugeMetricFamily(
            "redis_stats_exporter_kept_bytes",
            "Bytes (estimated) the exporter keeps for requests' parameters (slices, endpoints, windows, "
            "bodies), by kind; at most the view budget.",
            labels=["kind"],
        )
        entries = GaugeMetricFamily(
            "redis_stats_exporter_kept_entries",
            "Entries kept for requests' parameters, by kind.",
            labels=["kind"],
        )
        for kind in sorted(counts):
            kept.add_metric([kind], float(sizes[kind]))
            entries.add_metric([kind], float(counts[kind]))
        dropped = CounterMetricFamily(
            "redis_stats_exporter_kept_dropped",
            "Kept entries dropped, by kind and why (idle: unused for a minute; budget: the view budget "
            "was full; dropped: their namespace went).",
            labels=["kind", "why"],
        )
        for (kind, why), n in sorted(self._dropped.items()):
            dropped.add_metric([kind, why], float(n))
        yield from (kept, entries, dropped)


def _size(entry: Any) -> int:
    try:
        return int(entry.kept_bytes())
    except Exception:  # an entry that cannot say: counted as nothing, never a failed sweep
        log.debug("a kept entry could not give its size", exc_info=True)
        return 0
