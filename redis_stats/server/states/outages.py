"""The engines that went down: when each stopped heartbeating, and when it was back.

The live page lists the engines that went down in the last minutes. It traced them from its own
polls, so a reload lost the list (and an outage that ended before the page opened was never on
it). An :class:`OutageTrace` keeps that trace in the exporter, from every snapshot its namespace's
window takes (its sampler's and each request's): an engine seen down opens an outage from its
last heartbeat (``time - age``), the first snapshot that sees it up again closes it, and one no
longer listed (gc removed it meanwhile) is closed as ``gone``. An engine restarted between two
snapshots never looked down and is not traced. Outages that ended more than *seconds* ago go; at
most :data:`MAX_OUTAGES` are kept (past it the oldest ended go first, then the oldest still open),
and how many went is counted.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from redis_stats.snapshot import Snapshot

__all__ = ["MAX_OUTAGES", "OUTAGE_BYTES", "OutageTrace"]

MAX_OUTAGES = 4096
"""Outages kept at most per namespace (a thousand engines all down at once fit four times)."""

OUTAGE_BYTES = 200
"""Estimated bytes of one kept outage (a list of six and its numbers; its endpoint and writers
are the snapshot's own strings)."""


class OutageTrace:
    """The outages seen in the snapshots :meth:`see` is given, those ended within *seconds* of the
    newest (server clock); thread safe."""

    def __init__(self, seconds: float, *, most: int = MAX_OUTAGES) -> None:
        self.seconds = seconds
        self.most = most
        self.dropped = 0  # outages dropped past *most*
        self._open: dict[int, list[Any]] = {}  # engine -> its open outage
        # [engine, from, to or None, gone, endpoint, writers], in the order opened
        self._all: list[list[Any]] = []
        self._newest = float("-inf")
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._all)

    @property
    def bytes(self) -> int:
        """The estimated bytes of the kept outages."""
        return len(self) * OUTAGE_BYTES

    def see(self, snap: Snapshot) -> None:
        """Trace *snap*: open an outage for each engine down without one, close those up again or
        no longer listed. An older read finishing late is ignored; a clock gone back past the
        whole trace (another Redis) starts it again."""
        t = snap.time
        with self._lock:
            if t < self._newest - self.seconds:
                self._open.clear()
                self._all.clear()
            elif t < self._newest:
                return
            self._newest = t
            for e in snap.engines.values():
                found = self._open.get(e.engine)
                if not e.up and found is None:
                    start = t - e.age if math.isfinite(e.age) else t  # its last heartbeat
                    outage = [e.engine, start, None, False, e.endpoint, e.writers]
                    self._open[e.engine] = outage
                    self._all.append(outage)
                elif e.up and found is not None:
                    found[2] = t
                    del self._open[e.engine]
            for engine in [e for e in self._open if e not in snap.engines]:
                outage = self._open.pop(engine)
                outage[2], outage[3] = t, True
            self._trim(t)

    def _trim(self, t: float) -> None:
        """Drop what ended more than *seconds* ago, then past *most* the oldest ended, then the
        oldest open (the lock held)."""
        keep = [o for o in self._all if o[2] is None or o[2] >= t - self.seconds]
        over = len(keep) - self.most
        if over > 0:
            ended = [o for o in keep if o[2] is not None]
            ended.sort(key=lambda o: o[2])
            gone = {id(o) for o in ended[:over]}
            if len(gone) < over:
                opened = [o for o in keep if o[2] is None][: over - len(gone)]
                gone |= {id(o) for o in opened}
                for o in opened:
                    self._open.pop(o[0], None)
            keep = [o for o in keep if id(o) not in gone]
            self.dropped += over
        self._all = keep

    def document(self) -> list[dict[str, Any]]:
        """Every kept outage, still open first, then the latest back; within each the latest
        down first: ``{"engine", "from", "to" (None: still down), "gone", "endpoint", "writers"}``
        (where it ran when it went down)."""
        with self._lock:
            rows = [list(o) for o in self._all]
        rows.sort(key=lambda o: (o[2] is not None, -(o[2] or 0.0), -o[1], o[0]))
        return [
            {"engine": e, "from": start, "to": end, "gone": gone, "endpoint": where, "writers": list(writers)}
            for e, start, end, gone, where, writers in rows
        ]
