"""The load lanes of several writers of one process, sent together: one round trip a turn.

Each writer's load lane (:mod:`redis_stats.writer.lane`) stores its engines' changed entries with
one ``HSET`` per shard, so a process of one writer over many engines (a vLLM API server of a
data-parallel deployment) already sends them in one call. A process that holds one writer per
engine (``redis-stats simulate``, a host of several engines' writers on one client) made one call
per writer instead: at 12.5 changes a second per engine, Redis spends ~15 µs a call on its
round trip and ~2 µs on an entry (docs/benchmarks.md, "The load lane"). A :class:`LaneGroup` takes
the lane over for the writers added to it: every :data:`~redis_stats.writer.lane.LANE_POLL`
seconds its thread takes the changed entries of every writer and sends them as one ``HSET`` per
load hash (one pipeline: one round trip), at most once per ``load_interval``, as one writer's lane
does.

**Exact as each writer's own lane.** A writer's entries are taken and sent while its flush lock
is held, as its own lane does: a flush of that writer never runs between the two, so Redis never
ends with an older entry of an engine than the writer's newest sent (per engine, the last write
wins in the order the writer made them); a writer whose flush is running is passed over for that
turn (the flush stores its entries). A call that fails (a connection lost, a refusal) is every
one of its writers' failure: each counts it (``flush_errors_total{kind="load_<kind>"}``) and
sends every entry again at the next turn, and its next flush stores them anyway; the calls of a
turn are each one ``HSET``, applied whole or not at all. Every writer counts each call its entries
were in (``redis_stats_writer_load_lane_calls_total``). The routers' bookings of the requests
the stored entries count end as each writer's own lane ends them (``HDEL``, in a second round
trip of the turn, only when there are some), once all of that writer's entries were stored.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from redis_stats._core.write.protocol import MAX_CALL_WORDS
from redis_stats.background import survive
from redis_stats.writer.lane import LANE_POLL

if TYPE_CHECKING:
    from redis_stats.writer.blocking import StatsWriter

__all__ = ["LaneGroup"]

log = logging.getLogger("redis_stats.writer")

_Taken = tuple["StatsWriter", str, list[str]]  # a writer's lane call: (writer, key, fields and values)


class LaneGroup:
    """The load lanes of the writers :meth:`add`-ed to it, sent by one thread on *client* (a
    redis-py client, or Cluster client, to the writers' Redis), at most once per *interval*
    seconds (default: the first writer's ``load_interval``). Writers of one namespace or several;
    each keeps its own flushes. Start it with :meth:`start` (or a ``with`` block), stop it with
    :meth:`close`; a writer closed meanwhile is dropped from it."""

    def __init__(self, client: Any, *, interval: float | None = None) -> None:
        if interval is not None and not interval > 0:
            raise ValueError(f"interval={interval!r} must be a positive number of seconds (the lane's)")
        self.client = client
        self.interval = interval
        self.calls = 0  # round trips made
        self._writers: list[StatsWriter] = []
        self._lock = threading.Lock()  # the list above
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, writer: StatsWriter) -> None:
        """Send *writer*'s load lane from now on (its own flusher no longer does; a writer
        without a load map has none: nothing changes for it)."""
        if writer.load is None:
            return
        with self._lock:
            if writer not in self._writers:
                self._writers.append(writer)
                writer.lane_group = self
                if self.interval is None:
                    self.interval = writer.config.lane_interval or writer.config.load_interval

    def start(self) -> LaneGroup:
        """Start the sending thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="redis_stats-lane-group", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread (what it has not sent the writers' flushes store)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def __enter__(self) -> LaneGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        last = -float("inf")
        while not self._stop.wait(max(LANE_POLL, last + (self.interval or 0.0) - time.monotonic())):
            with survive("lane-group", log):
                now = time.monotonic()
                if self.turn():
                    last = now

    def turn(self) -> bool:
        """One turn: the changed entries of every writer, in one round trip; True if a call was
        made. Never raises for Redis (each writer counts the failure)."""
        with self._lock:
            self._writers = [w for w in self._writers if not w.closed]
            writers = list(self._writers)
        held: list[StatsWriter] = []
        try:
            taken = self._take(writers, held)
            if not taken:
                return False
            calls = _packed(taken)
            results = self._send([("HSET", key, args) for (key, args), _ in calls])
            failed: set[StatsWriter] = set()
            for (_, members), result in zip(calls, results):
                for w in members:
                    w.lane_done(result)
                    if isinstance(result, Exception):
                        failed.add(w)
            self._confirm(held, failed)
            self.calls += 1
            return True
        finally:
            for w in held:
                w.lane_lock.release()

    @staticmethod
    def _take(
        writers: list[StatsWriter], held: list[StatsWriter]
    ) -> list[tuple[StatsWriter, str, list[str]]]:
        """Each writer's lane calls, its lock taken (and added to *held*, for the caller to
        release); a writer whose flush runs is passed over (its entries go with that flush)."""
        taken: list[_Taken] = []
        for w in writers:
            if not w.lane_lock.acquire(blocking=False):  # never wait for a flush, nor hold the turn
                continue
            held.append(w)
            taken += [(w, key, args) for key, args in w.lane_calls()]
        return taken

    def _confirm(self, held: list[StatsWriter], failed: set[StatsWriter]) -> None:
        """The routers' bookings of the requests the stored entries count end now (a writer whose
        entries were not all stored carries their ids to its next entries instead)."""
        confirms = [(w, key, ids) for w in held for key, ids in w.lane_confirms(w not in failed)]
        if not confirms:
            return
        done = self._send([("HDEL", key, ids) for _, key, ids in confirms])
        for (w, _, _), result in zip(confirms, done):
            if isinstance(result, Exception):  # the bookings end by their bounded time
                w.lane_done(result)

    def _send(self, calls: list[tuple[str, str, list[str]]]) -> list[Any]:
        """Every call (command, key, its arguments) in one pipeline: each call's reply or
        exception (a connection lost: every call's)."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for command, key, args in calls:
                pipe.execute_command(command, key, *args)
            return list(pipe.execute(raise_on_error=False))
        except Exception as exc:  # counted by each writer; every entry goes again
            return [exc] * len(calls)


def _packed(
    taken: list[tuple[StatsWriter, str, list[str]]],
) -> list[tuple[tuple[str, list[str]], list[StatsWriter]]]:
    """The writers' calls (writer, key, fields and values) as few ``HSET`` calls as fit in
    :data:`MAX_CALL_WORDS` words each, per key, and the writers in each; a writer's call is
    never split (its entries of a key are stored together, or not at all)."""
    per_call = MAX_CALL_WORDS - 2  # HSET, the key
    by_key: dict[str, list[tuple[tuple[str, list[str]], list[StatsWriter]]]] = {}
    for w, key, args in taken:
        calls = by_key.setdefault(key, [])
        if not calls or len(calls[-1][0][1]) + len(args) > per_call:
            calls.append(((key, []), []))
        (_, fields), members = calls[-1]
        fields += args
        if w not in members:
            members.append(w)
    return [call for calls in by_key.values() for call in calls]
