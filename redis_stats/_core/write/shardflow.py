"""One shard of a namespace as one writer sees it: :class:`ShardFlow`.

A writer of a namespace split into K shards (option ``shards``) keeps K of these; an unsharded
namespace is K = 1, a list of one. Each holds everything the writer knows of its shard: its
totals and the specs it has yet to store there (:mod:`redis_stats._core.write.accumulator` fills them),
its sequence numbers, the batch in flight and the last one Redis confirmed (the flush protocol,
:mod:`redis_stats._core.write.protocol`), its server's clock, and the writer's id there. Nothing here is
shared between shards, so a shard whose call fails keeps and retries its own batch while the
others carry on.

Nothing here locks: :class:`~redis_stats._core.write.accumulator.Accumulator` says which parts it
touches under the record lock (``unsent``) and which only from the collector (everything else).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from redis_stats._core.write.chunks import Totals
from redis_stats.catalog import MetricSpec
from redis_stats.keys import Keys

if TYPE_CHECKING:  # the batch and the answer are the protocol's (protocol.py imports this)
    from redis_stats._core.write.protocol import Batch, FlushResult


_monotonic = time.monotonic
# How far a server's clock may move between two answers before the gauges stored so far are sent
# again stamped in its new time (s). Two anchors differ by up to the two round trips' sum anyway
# (the answer's time is taken somewhere within its round trip); a failover to a server whose clock
# differs by more than this, or a clock stepped, re-stamps every gauge (a resend of the writer's
# gauges, nothing else: harmless when it fires on a slow round trip).
CLOCK_JUMP = 0.5


class ShardFlow:
    """Shard *index* of the namespace, for one writer: its totals, specs to store, sequence,
    batch in flight, last confirmed batch, server clock and the writer's id there."""

    __slots__ = (
        "active",
        "claimed_at",
        "claiming",
        "clock",
        "confirmed",
        "confirmed_ms",
        "in_flight",
        "index",
        "next_seq",
        "owed",
        "resend_all",
        "totals",
        "unsent",
        "unstamped",
        "writer_id",
    )

    def __init__(
        self, index: int, totals: Totals, catalog: Iterable[MetricSpec], writer_id: str = ""
    ) -> None:
        self.index = index
        self.totals = totals  # the writer's absolute state here (only the collector touches it)
        self.writer_id = writer_id  # the writer's id here: a new one if gc removed it (a long pause)
        self.clock: float | None = None  # this server's clock minus time.monotonic() (s; None: unknown)
        # Whether gauge values went out stamped by this host's clock (before the first answer).
        self.unstamped = False
        self.restart(catalog)

    def restart(self, catalog: Iterable[MetricSpec]) -> None:
        """Start afresh, nothing sent yet (a new flow, or a forked child: a new writer whose
        totals start at zero). The clock stays: the server is the same."""
        # Specs yet to store here, by name (every shard holds the catalogue it is written with):
        # written under the record lock.
        self.unsent: dict[str, MetricSpec] = {s.name: s for s in catalog}
        # The totals changed since the last batch was made here (it was in flight meanwhile).
        self.owed = False
        # Whether the writer has sent data here: a call every round from then on (its heartbeat
        # keeps the writer's chunks live for readers and gc).
        self.active = False
        self.next_seq = 1
        self.in_flight: Batch | None = None
        self.resend_all = False  # the next batch carries everything (the store lost it, a new id)
        # The last batch Redis confirmed applied here (number, server time; 0: none under this
        # id, or the store lost it: the next batch carries everything).
        self.confirmed = 0
        self.confirmed_ms = 0
        # When Redis last applied this writer's claims of its engines here (monotonic s), and
        # whether the batch in flight carries them: claims are renewed, not sent every flush.
        self.claimed_at = -math.inf
        self.claiming = False
        self.totals.reset()

    def keys(self, namespace: Keys, shards: int) -> Keys:
        """This shard's keys of *namespace* split into *shards* (tags are cached by keys.py)."""
        return namespace.shard(self.index, shards)

    # -- the server's clock --------------------------------------------------------------------

    def server_ms(self, stamp: float) -> float:
        """The monotonic *stamp* in this server's time (ms); before its first answer, in this
        host's time (the one estimate there is; sent again once the server's is known)."""
        offset = self.clock
        if offset is None:
            self.unstamped = True
            offset = time.time() - _monotonic()
        return (stamp + offset) * 1000.0

    def anchor(self, server_ms: int) -> bool:
        """This server answered at *server_ms* (its clock): anchor stamps to it (within the round
        trip; again at every answer, so a pause or a failover is followed at the next flush).
        True if the values stored so far carry stamps of another clock, and must go again stamped
        in this one: sent before the first answer (this host's clock), or the server's clock moved
        by more than :data:`CLOCK_JUMP` (a failover to a server whose clock differs, or a clock
        set): stamps stored in one server's time are never compared with another's."""
        clock = server_ms / 1000.0 - _monotonic()
        jumped = self.clock is not None and abs(clock - self.clock) > CLOCK_JUMP
        self.clock = clock
        restamp, self.unstamped = self.unstamped or jumped, False
        return restamp

    # -- the protocol --------------------------------------------------------------------------

    def send(self, batch: Batch) -> None:
        """*batch* is this shard's next one: in flight until answered, under the next number."""
        self.in_flight, self.resend_all = batch, False
        batch.confirmed, batch.confirmed_ms = self.confirmed, self.confirmed_ms
        self.next_seq += 1

    def answered(self, result: FlushResult) -> Batch | None:
        """The answer to the batch in flight: returns it (None if none) when it was applied (now
        or by an earlier attempt); when nothing of it was (gc removed the writer here, or the
        store is behind what it confirmed), the next batch carries everything and this returns
        None."""
        batch, self.in_flight = self.in_flight, None
        if result.writer_removed or result.store_behind:
            if result.writer_removed:
                # What Redis held of this writer was folded into the base fields: keep only the
                # rest, for the new id (the batch's chunks are in the totals, sent with the rest).
                self.totals.rebase()
            self.resend_all = True
            self.confirmed = self.confirmed_ms = 0
            self.claimed_at = -math.inf  # the claims may be lost too: with the next batch
            return None
        if batch is None:
            return None
        if self.claiming and result.applied:
            # Applied now, claims and all. "Already applied" wrote nothing of this attempt: its
            # claims (maybe not in the attempt Redis applied) go again with the next batch.
            self.claimed_at = _monotonic()
        self.totals.confirm(batch.chunks)
        self.confirmed = batch.seq
        if result.applied:
            self.confirmed_ms = result.server_time_ms
            self.totals.beaten(batch.block_engines(), result.server_time_ms)
        # else: applied by an earlier attempt, at a time not known: the previous batch's stays
        # (a lower bound of this writer's heartbeat, which is what gc's fold watermark needs).
        return batch

    def claims_due(self, interval: float) -> bool:
        """Whether the next batch here claims the writer's engines: none applied within
        *interval* seconds."""
        return _monotonic() - self.claimed_at >= interval

    def pending(self) -> bool:
        """Whether this shard has a batch in flight, or is owed the writer's whole state."""
        return self.in_flight is not None or self.resend_all
