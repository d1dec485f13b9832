"""The recorded history: one JSON line per event, each process in its own file of the run's
directory, stamped with the machine's monotonic clock (``CLOCK_MONOTONIC`` is one clock for every
process of the host, so lines of different files are ordered against each other).

A line is written and flushed before the act it announces when it is a bound (``rec``: what a
writer is about to have recorded, ``gauge``: a value about to be set) and after it when it is an
acknowledgement (``ack``: Redis confirmed; ``closed``), so a killed process's file never claims
more than happened. A process killed mid-line leaves a partial last line: :func:`load` skips it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["Recorder", "load"]


class Recorder:
    """Appends events of one process to ``<dir>/<name>.jsonl``."""

    def __init__(self, directory: str | Path, name: str) -> None:
        self.name = name
        self.path = str(Path(directory) / f"{name}.jsonl")
        self._file = open(self.path, "a", buffering=1)

    def __call__(self, event: str, **fields: Any) -> float:
        """Write one event of kind *event*; returns its stamp."""
        t = time.monotonic()
        self._file.write(
            json.dumps({"t": t, "k": event, "p": self.name, **fields}, separators=(",", ":")) + "\n"
        )
        return t

    def start(self, **fields: Any) -> None:
        """The process's first line: its pid (the harness signals it by that)."""
        self("start", pid=os.getpid(), **fields)


def load(directory: str | Path) -> list[dict[str, Any]]:
    """Every event of the run, ordered by time."""
    events: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # the partial last line of a killed process
    events.sort(key=lambda e: e["t"])
    return events
