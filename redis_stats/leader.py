"""Who prints the periodic log: the rank-0 process, or the holder of a Redis lease.

The lease (``rs:{NS}:leader``, value ``<holder>|<fencing token>``, with a TTL) is taken and renewed
by ``lease.lua``. A holder counts itself leader only until ``renew sent + ttl - margin`` on its own
monotonic clock; the key expires in Redis no earlier than ``ttl`` after the server applied that
renewal, which is later than when it was sent. So a holder that cannot renew (dead, partitioned,
paused) stops printing *before* anyone else can take the lease: there is never a moment with two
printers. Every new holder gets a larger fencing token.

Across a failover that promise needs the promoted replica to hold the renewal: with
``wait_replicas`` > 0 a take or renewal counts only once that many replicas acknowledged it
(``WAIT``); with 0 (the default) a failover to a replica that missed the last renewal can give
another holder the lease while this one still prints (docs/reliability.md, issue 48).
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Protocol

from redis_stats._core.lease import LeaseHolder, LeaseState, log
from redis_stats._scripts import Script, load_script
from redis_stats.background import survive
from redis_stats.connection import key_target
from redis_stats.keys import Keys

if TYPE_CHECKING:
    from redis_stats.config import StatsConfig
    from redis_stats.connection import Client

__all__ = ["Leader", "LeaseLeader", "LeaseState", "NoLeader", "Rank0Leader", "make_leader"]


class Leader(Protocol):
    """Decides whether this process prints."""

    def is_leader(self) -> bool:
        """True while this process may print."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Give up leadership (if any), waiting at most *timeout* seconds for Redis."""
        ...


class Rank0Leader:
    """Static leadership: the process that manages engine *rank* (0 by default) prints."""

    def __init__(self, managed_engines: list[int] | tuple[int, ...], rank: int = 0) -> None:
        self.leader = rank in managed_engines

    def is_leader(self) -> bool:
        """Whether this process manages the chosen rank."""
        return self.leader

    def close(self, timeout: float | None = None) -> None:
        """Nothing to release."""


class LeaseLeader(LeaseHolder):
    """Leadership through a Redis lease with a fencing token, renewed by a background thread.

    *ttl* seconds: how long the lease lives without renewal (failover time is at most ``ttl`` plus
    one renewal period). Renewal runs every ``ttl / 3``. :meth:`close` waits at most
    *close_timeout* seconds (``make_leader`` gives the config's ``close_timeout``). With
    *wait_replicas* > 0 a take or renewal extends this process's validity only once that many
    replicas acknowledged it within *wait_timeout_ms* (``make_leader`` gives the config's): set it
    when Redis has replicas and fails over to them.
    """

    def __init__(
        self,
        client: Client,
        keys: Keys,
        holder: str,
        *,
        ttl: float = 10.0,
        start: bool = True,
        close_timeout: float = 1.0,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 500,
    ) -> None:
        self.state = LeaseState(
            keys, holder, ttl, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms
        )
        self.client = client
        self.close_timeout = close_timeout
        self._script = Script(client, load_script("lease"))
        self._stop = threading.Event()
        self._released = threading.Event()  # set by the thread once it has released the lease
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="redis_stats-lease", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with survive("lease", log):  # renew() never raises for Redis; anything else is counted
                self.renew()
            if self._stop.wait(self.state.period):
                break
        # close() stopped the loop: the release is made here, so that close waits for it only
        # until its deadline (a renewal or release stuck on a frozen Redis stays with this thread).
        try:
            with survive("lease", log):
                self._release()
        finally:
            self._released.set()

    def renew(self) -> bool:
        """Take or renew the lease once; True if this process holds it now."""
        keys, args, sent = self.state.renewal()
        try:
            reply = self._script(keys=keys, args=args)
        except Exception as exc:
            reply = exc
        wait = self.state.wait_args(reply)
        if wait is not None:
            try:
                acked = self.client.execute_command("WAIT", *wait, **key_target(self.client, keys[0]))
            except Exception as exc:
                acked = exc
            reply = self.state.acknowledged(reply, acked)
        return self.state.renewed(reply, sent)

    def _release(self) -> None:
        release = self.state.release()
        if release is not None:
            with contextlib.suppress(Exception):  # the lease expires by itself anyway
                self._script(keys=release[0], args=release[1])

    def close(self, timeout: float | None = None) -> None:
        """Stop renewing and release the lease if this process still holds it, waiting at most
        *timeout* seconds (default :attr:`close_timeout`) whatever Redis does: a release Redis
        has not answered by then is left to the daemon thread (and the lease expires after its
        ttl anyway). (Without the thread, ``start=False``, the release is one attempt made here.)"""
        budget = self.close_timeout if timeout is None else max(0.0, timeout)
        self._stop.set()
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._release()
            return
        self._released.wait(budget)


class NoLeader:
    """Nobody prints (``leader=none``): snapshots are still read, for callers of ``tick``."""

    def is_leader(self) -> bool:
        """Always False."""
        return False

    def close(self, timeout: float | None = None) -> None:
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
        return LeaseLeader(
            client,
            Keys(config.namespace),
            holder,
            ttl=config.lease_ttl,
            close_timeout=config.close_timeout,
            wait_replicas=config.wait_replicas,
            wait_timeout_ms=config.wait_timeout_ms,
        )
    if config.leader == "none":
        return NoLeader()
    return Rank0Leader(engines if process_rank == 0 else (), config.leader_rank)
