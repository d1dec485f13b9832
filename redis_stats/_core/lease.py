"""The sans-I/O half of the log lease: what ``lease.lua`` is asked, what its answers mean, when.

Nothing here touches the network, so the threaded :class:`~redis_stats.leader.LeaseLeader` and
the asyncio :class:`~redis_stats.aio.leader.AsyncLeaseLeader` share every decision and differ
only in how they wait:

- timing: a renewal every :attr:`LeaseState.period` (``ttl / 3``); a holder counts itself leader
  until ``renewal sent + ttl - margin`` on its own monotonic clock (see :mod:`redis_stats.leader`
  for why there is never a moment with two printers);
- acquire / renew: :meth:`LeaseState.renewal` gives the script's KEYS and ARGV and when it was
  sent; :meth:`LeaseState.renewed` reads the reply (the fencing token, 0 when another holds the
  lease, an exception when Redis did not answer) against that call's own send time, so two
  overlapping renewals (the renewal thread or task plus a caller of ``renew()``) never judge a
  reply by the other's, later, send time;
- lose: a reply of 0 ends the tenure at once; no reply keeps it only while it is still valid;
- replicas: with ``wait_replicas`` > 0 the leader sends ``WAIT`` after each take or renewal, and
  :meth:`LeaseState.acknowledged` turns a reply fewer replicas acknowledged into a failure (no
  extension): a replica promoted after a failover holds every renewal that extended a validity,
  so the lease there outlives it too (found by the nemesis run, issue 48, SEED=855465088);
- fencing: a token different from the last one is a new tenure (``on_acquire`` runs once);
- release: :meth:`LeaseState.release` says whether there is anything to release; a reply to a
  renewal sent before it does not make the process leader again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from redis_stats.errors import ReplicationLag, error_kind
from redis_stats.keys import Keys
from redis_stats.outage import Outage

# The logger of the lease, named as when this lived in leader.py (filters keep working).
log = logging.getLogger("redis_stats.leader")


class LeaseState:
    """The lease without its I/O: arguments of ``lease.lua`` and what its answers mean (shared by
    :class:`~redis_stats.leader.LeaseLeader` and :class:`~redis_stats.aio.AsyncLeaseLeader`)."""

    def __init__(
        self, keys: Keys, holder: str, ttl: float, *, wait_replicas: int = 0, wait_timeout_ms: int = 500
    ) -> None:
        if ttl <= 0.3:
            raise ValueError(f"lease ttl={ttl!r} must be more than 0.3 s")
        if wait_replicas < 0 or wait_timeout_ms < 0:
            raise ValueError(
                f"lease wait_replicas={wait_replicas!r}, wait_timeout_ms={wait_timeout_ms!r}: "
                "both must be >= 0"
            )
        self.keys = keys
        self.holder = holder
        self.ttl = ttl
        # A take or renewal counts only once this many replicas acknowledged it (0: once the
        # master applied it, which a failover to a replica that missed it can undo).
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        # Local validity ends this long before the lease could expire in Redis (clock drift, GC).
        self.margin = min(1.0, ttl / 10)
        self.token = 0
        # Called when this process becomes the holder, so a reporter can print at once instead of
        # at its next tick: failover stays within ttl + ttl/3.
        self.on_acquire: Callable[[], Any] | None = None
        self.valid_until = 0.0
        # When this process last released the lease (monotonic): a renewal sent before it, whose
        # reply arrives after it, is not a tenure (see answered()).
        self.released_at = float("-inf")
        # A tenure of this process answered again after it lapsed (its validity ended, or another
        # holder answered meanwhile): the store may have gone back past a newer holder (a lagging
        # replica promoted, an older snapshot), so its token is not larger than every token handed
        # out since. The next call releases it; the one after takes a new, larger token.
        self.reissue = False
        # Renewals that fail: a warning when this process held the lease as they began (its log
        # line stops within the ttl), else INFO; the end at the same level.
        self.outage = Outage(
            f"renewals of the log lease {keys.leader} by {holder}",
            log,
            retry=f"retried every {self.period:g} s",
        )

    @property
    def period(self) -> float:
        """Seconds between renewals: three tries before the lease can expire."""
        return self.ttl / 3

    def call(self, op: str) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ``lease.lua`` for *op* (``acquire`` or ``release``)."""
        ttl_ms = int(self.ttl * 1000) if op == "acquire" else 0
        return [self.keys.leader, self.keys.leader_epoch], [self.holder, ttl_ms, op]

    def renewal(self) -> tuple[list[str], list[Any], float]:
        """KEYS and ARGV of one take-or-renew, and its send time (now): validity is counted from
        this moment (before the server applies it, so the local end comes before the key's
        expiry). The caller hands the send time back to :meth:`renewed` with the reply: it is not
        kept here, since another renewal may be sent before this one's reply arrives. After a
        lapsed tenure came back (:attr:`reissue`), this call is its release instead."""
        op = "release" if self.reissue else "acquire"
        self.reissue = False
        keys, args = self.call(op)
        return keys, args, time.monotonic()

    def wait_args(self, reply: Any) -> tuple[int, int] | None:
        """The arguments of the ``WAIT`` to send after the script answered *reply*, or None: no
        ``wait_replicas``, or nothing to wait for (an error, or 0: the script wrote nothing)."""
        if not self.wait_replicas or isinstance(reply, BaseException):
            return None
        try:
            if int(reply) <= 0:
                return None
        except Exception:
            return None
        return self.wait_replicas, self.wait_timeout_ms

    def acknowledged(self, reply: Any, acked: Any) -> Any:
        """*reply* once ``WAIT`` answered *acked* (a count, or the exception raised instead); a
        :class:`~redis_stats.errors.ReplicationLag` when fewer than ``wait_replicas`` replicas
        acknowledged: then :meth:`renewed` counts it as unanswered. The take or renewal is applied
        on the master, but a failover now could promote a replica without it, where another
        holder could take the lease while this one prints: it does not extend the validity
        (safety over liveness; the holder stops when its last acknowledged validity ends)."""
        if isinstance(acked, BaseException):
            return acked
        try:
            count = int(acked)
        except Exception as exc:
            return exc
        if count < self.wait_replicas:
            return ReplicationLag(
                f"the log lease {self.keys.leader}: {count} of {self.wait_replicas} replicas "
                f"acknowledged its renewal within {self.wait_timeout_ms} ms"
            )
        return reply

    def renewed(self, reply: Any, sent: float) -> bool:
        """The outcome of the :meth:`renewal` sent at *sent*: the script's reply, or the exception
        raised instead. True if this process holds the lease now."""
        if isinstance(reply, BaseException):
            return self.unanswered(reply)
        try:
            token = int(reply)
        except Exception as exc:  # not a token: as if Redis had not answered
            return self.unanswered(exc)
        if self.outage.down:
            self._back(token, sent)
        return self.answered(token, sent)

    def answered(self, token: int, sent: float) -> bool:
        """The script answered *token* to a renewal sent at monotonic time *sent*."""
        if token <= 0:
            self.valid_until = 0.0
            return False
        if sent <= self.released_at:
            # Sent before a release, answered after it (close() with a renewal in flight): Redis
            # may have run it first and the release then, which let another holder in.
            return False
        acquired = token != self.token or not self.is_leader()
        if acquired and 0 < token <= self.token:
            # The tenure this process had, answered after it lapsed: not resumed (see reissue).
            self.reissue = True
            self.valid_until = 0.0
            log.info(
                "%s: the log lease came back with its old fencing token %d: taking a new one",
                self.holder,
                token,
            )
            return False
        self.token = token
        until = sent + self.ttl - self.margin
        # A reply of the same tenure that overtook this one may have proved a later expiry (its
        # own send time was later): an older reply does not shorten it (the key's expiry only
        # moves on). Never longer than the latest send time that got an answer, though.
        self.valid_until = until if acquired else max(self.valid_until, until)
        if acquired:
            log.info("%s holds the log lease (fencing token %d)", self.holder, token)
            if self.on_acquire is not None:
                try:
                    self.on_acquire()
                except Exception:
                    log.exception("on_acquire callback failed")
        return True

    def _back(self, token: int, sent: float) -> None:
        """Redis answers renewals again: the end of their outage, and who holds the lease now."""
        holds = token > 0 and sent > self.released_at
        self.outage.succeeded("this process holds the lease" if holds else "another holds it")

    def unanswered(self, exc: BaseException) -> bool:
        """Redis did not answer: keep the lease only while it is still valid."""
        log.debug("lease renewal failed: %s", exc)
        held = self.is_leader()
        # A warning too when replicas did not acknowledge: this process has the lease on the
        # master but cannot count it (nobody prints), e.g. wait_replicas above the replicas there.
        level = logging.WARNING if held or isinstance(exc, ReplicationLag) else logging.INFO
        self.outage.failed(error_kind(exc), str(exc), level=level)
        return held

    def release(self) -> tuple[list[str], list[Any]] | None:
        """KEYS and ARGV of the release, or None when this process never held the lease (or
        already released it). Either way it stops counting itself leader now."""
        self.released_at = time.monotonic()
        if not self.valid_until:
            return None
        self.valid_until = 0.0
        return self.call("release")

    def is_leader(self) -> bool:
        """True until the locally computed end of the lease."""
        return time.monotonic() < self.valid_until


class LeaseHolder:
    """What both lease leaders show of their :class:`LeaseState` (they add only the waiting)."""

    state: LeaseState

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

    def is_leader(self) -> bool:
        """True until the locally computed end of the lease."""
        return self.state.is_leader()
