"""The periodic stats log, computed from deployment-wide totals in Redis and printed once.

Every interval the reporter reads one snapshot and hands it, with the previous one, to its
*lines* (a :class:`LogLines`: which lines an interval makes). vLLM's lines live with the
integration (:class:`redis_stats.integrations.vllm.logline.VllmLogLines`); this module knows no
metric name.

Every process may run a reporter (so a new leader has a previous snapshot ready), but only the
leader (:mod:`redis_stats.leader`) emits. Throughput counts every API server and node, because the
counters in Redis do.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generic, Protocol, TypeVar

from redis_stats.background import survive
from redis_stats.config import StatsConfig
from redis_stats.errors import error_kind
from redis_stats.leader import Leader
from redis_stats.outage import Outage
from redis_stats.reader import StatsReader
from redis_stats.snapshot import Snapshot

__all__ = ["LogLines", "ReportCore", "StatsReporter"]

log = logging.getLogger("redis_stats.reporter")


class LogLines(Protocol):
    """Which lines the interval between two snapshots makes: ``(level, %-format, args)`` each."""

    def __call__(self, previous: Snapshot, current: Snapshot) -> list[tuple[int, str, list[Any]]]:
        """The lines to log (the leader logs them; INFO and above are also returned by tick)."""
        ...


class _Configured(Protocol):
    """What the report core needs of a reader: its config, to name the URL a failed read used."""

    @property
    def config(self) -> StatsConfig:
        """The reader's settings."""
        ...


_ReaderT = TypeVar("_ReaderT", bound=_Configured)


class ReportCore(Generic[_ReaderT]):
    """The reporter's decisions without I/O: given each snapshot, what the leader logs.

    :class:`StatsReporter` (a thread) and :class:`~redis_stats.aio.AsyncStatsReporter` (a task)
    read the snapshots and hand them to :meth:`consume` or :meth:`read_failed`.
    """

    def __init__(
        self,
        reader: _ReaderT,
        leader: Leader,
        *,
        lines: LogLines,
        interval: float = 10.0,
        logger: logging.Logger | None = None,
    ) -> None:
        self.reader = reader
        self.leader = leader
        self.lines = lines
        self.interval = interval
        self.logger = logger or log
        self._previous: Snapshot | None = None
        self._older: Snapshot | None = None
        # Snapshot time of a lease takeover's report (it comes between two regular ticks): the
        # regular tick that follows within half an interval must not report that interval again.
        self._takeover_at: float | None = None
        # The reads that fail: logged by the leader (its line stops), at DEBUG by the others.
        config = reader.config
        self.outage = Outage(
            f"reads of namespace {config.namespace!r} from {config.safe_url} for the periodic log",
            self.logger,
            retry=f"tried again every {interval:g} s; no line is logged meanwhile",
        )
        self._attach()

    def _attach(self) -> None:
        """What a reporter that reads by itself sets up once constructed (the core: nothing)."""

    def close_deadline(self, timeout: float | None) -> float:
        """The monotonic deadline of a close given *timeout* (None: the reader's ``close_timeout``)."""
        budget = self.reader.config.close_timeout if timeout is None else max(0.0, timeout)
        return time.monotonic() + budget

    def read_failed(self, exc: BaseException) -> list[str]:
        """The read of this tick failed: the leader logs the outage's start (and its end when a
        read works again), the others at DEBUG; nobody crashes."""
        level = logging.WARNING if self.leader.is_leader() else logging.DEBUG
        self.outage.failed(error_kind(exc), str(exc), level=level)
        return []

    def consume(self, snap: Snapshot, *, takeover: bool = False) -> list[str]:
        """Take a new snapshot; if leader, log the interval since the previous one (sans-I/O:
        the asyncio reporter shares it). *takeover*: this tick is the one a new lease holder
        runs at once; the regular tick after it logs nothing if it comes within half an interval."""
        self.outage.succeeded()
        previous, older = self._previous, self._older
        self._older, self._previous = previous, snap
        takeover_at, self._takeover_at = self._takeover_at, None
        if previous is None or not self.leader.is_leader():
            return []
        if takeover:
            self._takeover_at = snap.time
        elif takeover_at is not None and snap.time - takeover_at < self.interval / 2:
            return []  # the takeover's report covered this interval: print it once
        if older is not None and snap.time - previous.time < self.interval / 2:
            # An early tick (a lease takeover): measure over a full-length window instead.
            previous = older
        return self._emit(previous, snap)

    def _emit(self, previous: Snapshot, snap: Snapshot) -> list[str]:
        out: list[str] = []
        for level, fmt, args in self.lines(previous, snap):
            self.logger.log(level, fmt, *args)
            if level >= logging.INFO:
                out.append(fmt % tuple(args))
        return out


class StatsReporter(ReportCore[StatsReader]):
    """Reads a snapshot every interval; the leader logs what *lines* makes of the interval
    (``lines=VllmLogLines()``: vLLM's line per engine and an aggregate).

    Call :meth:`tick` from your own timer (the vLLM plugin calls it from ``log()``), or
    :meth:`start` a thread that ticks every *interval* seconds.
    """

    def _attach(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()
        if hasattr(self.leader, "on_acquire"):
            self.leader.on_acquire = self._takeover_tick  # a new lease holder prints at once

    def start(self) -> None:
        """Tick every interval from a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="redis_stats-reporter", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()  # never raises (see _tick)

    def close(self, timeout: float | None = None) -> None:
        """Stop ticking and give up leadership, within *timeout* seconds (default the reader's
        ``close_timeout``) whatever Redis does: a tick still waiting on Redis is left to the
        daemon thread."""
        deadline = self.close_deadline(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        self.leader.close(max(0.0, deadline - time.monotonic()))

    def tick(self) -> list[str]:
        """Read, compute the interval since the last tick, and log if leader.

        Returns the lines logged at INFO (idle engines' DEBUG lines are not returned).
        """
        return self._tick(takeover=False)

    def _takeover_tick(self) -> list[str]:
        return self._tick(takeover=True)

    def _tick(self, *, takeover: bool) -> list[str]:
        with self._tick_lock:  # log() and a lease takeover may tick from two threads
            try:
                snap = self.reader.snapshot()
            except Exception as exc:
                return self.read_failed(exc)
            with survive("reporter", self.logger):  # the lines of a value nobody foresaw
                return self.consume(snap, takeover=takeover)
            return []
