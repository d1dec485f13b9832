"""Who prints the periodic log: the rank-0 process, or the holder of a Redis lease.

The lease (``rs:{NS}:leader``, value ``<holder>|<fencing token>``, with a TTL) is taken and renewed
by ``lease.lua``. A holder counts itself leader only until ``renew sent + ttl - margin`` on its own
monotonic clock; the key expires in Redis no earlier than ``ttl`` after the server applied that
renewal, which is later than when it was sent. So a holder that cannot renew (dead, partitioned,
paused) stops printing *before* anyone else can take the lease: there is never a moment with two
printers. Every new holder gets a larger fencing token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from redis_stats._scripts import Script, load_script
from redis_stats.keys import Keys

if TYPE_CHECKING:
    from redis_stats.config import StatsConfig
    from redis_stats.connection import Client

__all__ = ["Leader", "LeaseLeader", "LeaseState", "NoLeader", "Rank0Leader", "make_leader"]

log = logging.getLogger("redis_stats.leader")


class Leader(Protocol):
    """Decides whether this process prints."""

    def is_leader(self) -> bool:
        """True while this process may print."""
        ...

    def close(self) -> None:
        """Give up leadership (if any)."""
        ...


class Rank0Leader:
    """Static leadership: the process that manages engine *rank* (0 by default) prints."""

    def __init__(self, managed_engines: list[int] | tuple[int, ...], rank: int = 0) -> None:
        self.leader = rank in managed_engines

    def is_leader(self) -> bool:
        """Whether this process manages the chosen rank."""
        return self.leader

    def close(self) -> None:
        """Nothing to release."""


class LeaseState:
    """The lease without its I/O: arguments of ``lease.lua`` and what its answers mean (shared by
    :class:`LeaseLeader` and :class:`redis_stats.aio.AsyncLeaseLeader`)."""

    def __init__(self, keys: Keys, holder: str, ttl: float) -> None:
        if ttl <= 0.3:
            raise ValueError(f"lease ttl={ttl!r} must be more than 0.3 s")
        self.keys = keys
        self.holder = holder
        self.ttl = ttl
        # Local validity ends this long before the lease could expire in Redis (clock drift, GC).
        self.margin = min(1.0, ttl / 10)
        self.token = 0
        # Called when this process becomes the holder, so a reporter can print at once instead of
        # at its next tick: failover stays within ttl + ttl/3.
        self.on_acquire: Callable[[], Any] | None = None
        self.valid_until = 0.0

    def call(self, op: str) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ``lease.lua`` for *op* (``acquire`` or ``release``)."""
        ttl_ms = int(self.ttl * 1000) if op == "acquire" else 0
        return [self.keys.leader, self.keys.leader_epoch], [self.holder, ttl_ms, op]

    def answered(self, token: int, sent: float) -> bool:
        """The script answered *token* to a renewal sent at monotonic time *sent*."""
        if token <= 0:
            self.valid_until = 0.0
            return False
        acquired = token != self.token or not self.is_leader()
        self.token = token
        self.valid_until = sent + self.ttl - self.margin
        if acquired:
            log.info("%s holds the log lease (fencing token %d)", self.holder, token)
            if self.on_acquire is not None:
                try:
                    self.on_acquire()
                except Exception:
                    log.exception("on_acquire callback failed")
        return True

    def unanswered(self, exc: BaseException) -> bool:
        """Redis did not answer: keep the lease only while it is still valid."""
        log.debug("lease renewal failed: %s", exc)
        return self.is_leader()

    def is_leader(self) -> bool:
        """True until the locally computed end of the lease."""
        return time.monotonic() < self.valid_until


class LeaseLeader:
    """Leadership through a Redis lease with a fencing token, renewed by a background thread.

    *ttl* seconds: how long the lease lives without renewal (failover time is at most ``ttl`` plus
    one renewal period). Renewal runs every ``ttl / 3``.
    """

    def __init__(
        self, client: Client, keys: Keys, holder: str, *, ttl: float = 10.0, start: bool = True
    ) -> None:
        self.state = LeaseState(keys, holder, ttl)
        self.client = client
        self._script = Script(client, load_script("lease"))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="redis_stats-lease", daemon=True)
            self._thread.start()

    @property
    def token(self) -> int:
        """The fencing token of the current (or last) tenure."""
        return self.state.token

    @property
    def on_acquire(self) -> Callable[[], Any] | None:
        """Called when this process becomes the holder."""
        return self.state.on_acquire

    @on_acquire.setter
    def on_acquire(self, callback: Callable[[], Any] | None) -> None:
        self.state.on_acquire = callback

    def _run(self) -> None:
        while True:
            self.renew()
            if self._stop.wait(self.state.ttl / 3):
                return

    def renew(self) -> bool:
        """Take or renew the lease once; True if this process holds it now."""
        sent = time.monotonic()
        keys, args = self.state.call("acquire")
        try:
            token = int(self._script(keys=keys, args=args))
        except Exception as exc:
            return self.state.unanswered(exc)
        return self.state.answered(token, sent)

    def is_leader(self) -> bool:
        """True until the locally computed end of the lease."""
        return self.state.is_leader()

    def close(self) -> None:
        """Stop renewing and release the lease if this process still holds it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self.state.valid_until:
            self.state.valid_until = 0.0
            keys, args = self.state.call("release")
            try:
                self._script(keys=keys, args=args)
            except Exception:
                pass


class NoLeader:
    """Nobody prints (``leader=none``): snapshots are still read, for callers of ``tick``."""

    def is_leader(self) -> bool:
        """Always False."""
        return False

    def close(self) -> None:
        """Nothing to release."""


def make_leader(
    config: StatsConfig,
    client: Client,
    engines: list[int] | tuple[int, ...],
    *,
    process_rank: int = 0,
    holder: str = "",
) -> Leader:
    """The leader the config asks for.

    *engines* are the engine indexes this process manages as recorded (``engine_offset`` added).
    With ``rank0`` only the first process (*process_rank* 0, e.g. API server 0) of the node that
    manages ``leader_rank`` prints: with several API servers each manages every local engine.
    """
    if config.leader == "lease":
        return LeaseLeader(client, Keys(config.namespace), holder, ttl=config.lease_ttl)
    if config.leader == "none":
        return NoLeader()
    return Rank0Leader(engines if process_rank == 0 else (), config.leader_rank)
