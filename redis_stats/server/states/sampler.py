"""The recent window of one namespace: the snapshots ``/snapshot`` and ``/history`` are made from.

A :class:`Window` keeps the snapshots its namespace's ``/snapshot`` requests read, and one every
``window / 6`` seconds from the first request on (a sampler thread that stops after
:data:`SAMPLER_IDLE` seconds without a request; the next starts it again), in at most
``window_budget`` bytes (:class:`~redis_stats.server.states.window.SnapshotRing`); the server
keeps it as any per-parameter state (bounded in bytes, dropped when idle: :func:`window_of`). A
window shorter than a tenth of *window* is not reported. Each of those snapshots also gives a
point of the fleet's and the engines' history (:class:`~redis_stats.server.states.fleet_history.
FleetHistory`, ``GET /history``) and is traced for engines going down (:class:`~redis_stats.server.
states.outages.OutageTrace`). An exporter of one namespace given the page's figures starts the
sampler when it starts (the window measured from its start).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from redis_stats.background import survived
from redis_stats.config import mask_url, redact
from redis_stats.errors import error_kind
from redis_stats.server.source import Source
from redis_stats.server.states.fleet_history import FleetHistory
from redis_stats.server.states.outages import OutageTrace
from redis_stats.server.states.window import SnapshotRing, snapshot_document

if TYPE_CHECKING:
    from redis_stats.snapshot import Snapshot

__all__ = ["MIN_SPAN", "SAMPLER_IDLE", "SAMPLE_EVERY", "Window", "redis_address", "window_of"]

log = logging.getLogger("redis_stats.exporter")

# /snapshot reports rates only over at least this fraction of the window (3 s of 30 s); the sampler
# takes a snapshot every SAMPLE_EVERY of the window, so once warm a full window is always there.
MIN_SPAN = 0.1
SAMPLE_EVERY = 1 / 6
# The sampler stops after this many windows without a /snapshot request (at least SAMPLER_IDLE s;
# the next request starts it again): a page closed, or a namespace nobody looks at, reads nothing.
SAMPLER_IDLE_WINDOWS = 4
SAMPLER_IDLE = 60.0


def redis_address(url: str) -> str:
    """Where the view reads, for a page header: scheme, hosts and path only.

    Masked by :func:`~redis_stats.config.mask_url` first (which never lets a password through, even
    a malformed one), then cut to what a reader needs: no user name, no ``***``, no query.
    """
    masked = mask_url(url)
    scheme, sep, rest = masked.partition("://")
    if not sep:
        scheme, rest = "", masked
    if "<" in rest:  # mask_url's own "not shown" forms
        return masked
    authority, slash, path = rest.split("?", 1)[0].split("#", 1)[0].partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}".replace("***", "")


class Window:
    """The recent window of one namespace: its kept snapshots, the sampler that takes them, and the
    fleet's history made from each (:attr:`history`)."""

    def __init__(self, source: Source) -> None:
        options = source.options
        self.source = source
        self.window = options.window
        # One snapshot kept per sampling period at most, for a window and two periods more: a
        # baseline a full window old is there when the next sample lands. Within window_budget
        # bytes (the oldest dropped first: the window reported is then the span that fits).
        spacing = self.window * SAMPLE_EVERY
        self.ring = SnapshotRing(
            keep=self.window + 2 * spacing, max_bytes=options.window_budget, spacing=spacing * 0.9
        )
        self.history = FleetHistory(options.history, spacing=spacing * 0.9, max_bytes=options.history_budget)
        self.outages = OutageTrace(self.history.seconds)
        self._lock = threading.Lock()
        self._sampling = False
        self._asked = 0.0  # monotonic time of the last request (the sampler's idling)
        self._stop = threading.Event()

    @property
    def sampler_idle(self) -> float:
        """Seconds without a ``/snapshot`` request after which the sampler stops."""
        return max(SAMPLER_IDLE, SAMPLER_IDLE_WINDOWS * self.window)

    @property
    def sampling(self) -> bool:
        """Whether the sampler runs (from the first ``/snapshot`` until it idles)."""
        return self._sampling

    def asked(self) -> None:
        """A request came: start the sampler when it does not run."""
        self._asked = time.monotonic()
        with self._lock:  # two first requests at once must not start two samplers
            if self._sampling or self._stop.is_set():
                return
            self._sampling = True
        threading.Thread(target=self._sample_loop, name="redis_stats-window", daemon=True).start()

    def _sample_loop(self) -> None:
        reader, part = self.source.reader, self.source.part
        while not self._stop.wait(self.window * SAMPLE_EVERY):
            with self._lock:
                if time.monotonic() - self._asked > self.sampler_idle:
                    self._sampling = False  # nobody asks: stop reading (a request restarts)
                    return
            try:
                with self.source.building:
                    self.keep(reader.snapshot(part))
            except Exception as exc:  # Redis away: the next request reports it
                if error_kind(exc) != "other":
                    log.debug("window round failed: %s", exc)
                else:
                    survived("window", exc, log)

    def keep(self, snap: Snapshot) -> Snapshot | None:
        """Keep *snap* (the ring, a point of the history); the baseline of its window (None: none)."""
        earlier = self.ring.baseline(snap, self.window, min_span=self.window * MIN_SPAN)
        self.history.add(snap, earlier)
        self.outages.see(snap)
        self.ring.add(snap)
        return earlier

    def document(self, names: list[str] | None, buckets: bool) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) of ``/snapshot`` now (a ``503`` with the reason when the
        store cannot be read)."""
        reader = self.source.reader
        try:
            snap = reader.snapshot(self.source.part)  # thread-safe: each read checks its own plan
        except Exception as exc:
            # redis-py's message names a host or a reply; redacted in case it ever quotes a secret.
            return 503, {"error": error_kind(exc), "detail": redact(str(exc), reader.config.url)}
        earlier = self.keep(snap)
        source = {"namespace": self.source.namespace, "redis": redis_address(reader.config.url)}
        doc = snapshot_document(
            snap,
            earlier,
            requested=self.window,
            summary=self.source.options.summary,
            source=source,
            names=names,
            buckets=buckets,
        )
        # What a window still measuring waits for: a read min_seconds after its first one.
        doc["window"]["first_read"] = self.ring.oldest()
        doc["window"]["min_seconds"] = self.window * MIN_SPAN
        return 200, doc

    def kept_bytes(self) -> int:
        """The bytes of the kept snapshots, history and outages (estimated)."""
        return self.ring.bytes + self.history.bytes + self.outages.bytes

    def close(self) -> None:
        """Stop the sampler."""
        self._stop.set()


def window_of(source: Source) -> Window:
    """The window of *source*'s namespace, kept by the server (made empty when there is none: no
    read, no sampler); asking for it counts as a use."""
    return source.kept("window", None, lambda: Window(source))
