"""The exactly-once flush protocol: what a flush sends (:class:`Batch`), what Redis answers
(:class:`FlushResult`, statuses :data:`DUPLICATE` :data:`APPLIED` :data:`REMOVED` :data:`BEHIND`)
and the sequence numbers between the two (:class:`FlushProtocol`).

A batch keeps its sequence number and contents until Redis confirms it (applied, or already
applied). A lost reply is retried with the same number; the script skips numbers it has seen, so
nothing is applied twice. New updates wait in the accumulator's dirty list for the next number,
so an outage costs memory per series, never per update. A batch holds at most one call's worth
(:data:`MAX_CALL_WORDS`, :attr:`Batch.cut`): a flush of more sends the rest as the next batches,
each with its own number, once the one before is confirmed (:meth:`FlushProtocol.next_parts`).

Per shard of the namespace (option ``shards`` = K > 1), one
:class:`~redis_stats._core.write.shardflow.ShardFlow` holds the shard's sequence, batch in flight and
last confirmed batch: a shard whose call fails keeps and retries its own batch while the others
carry on. Nothing here touches the network: the threaded and the asyncio writer share it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis_stats import codec
from redis_stats._core.write.chunks import Chunk
from redis_stats._core.write.shardflow import ShardFlow
from redis_stats.catalog import MetricSpec
from redis_stats.keys import SCHEMA_VERSION, Keys

if TYPE_CHECKING:  # what the protocol takes batches from (accumulator.py imports this module)
    from redis_stats._core.write.accumulator import Accumulator


MAX_CALL_WORDS = 3_999
"""The most words one flush call sends: ``EVALSHA``, its SHA, the key count, the keys and the
arguments. ElastiCache Serverless refuses a request of more (docs/redis-servers.md); a flush of
more changes is sent as several batches, each exactly once (:attr:`Batch.cut`)."""
CALL_WORDS = 3 + 8 + 15
"""The words of every call whatever it carries: ``EVALSHA``, the SHA and the key count, the 8
fixed keys, 10 header arguments and 5 counts (``flush.lua``'s header)."""
SPEC_WORDS = 2
"""The words of one spec sent (its name, its JSON)."""


@dataclass
class Batch:
    """One flush: catalogue specs to store, and per engine the chunks of the writer's absolute
    state that changed (see :mod:`redis_stats._core.write.chunks`).

    Built once, then sent as-is until Redis confirms it; ``seq`` never changes. It holds no copy
    of the series: the texts it sends are on its chunks, which no other take touches until this
    batch is answered (a shard takes again only then).
    """

    seq: int = 0
    specs: list[MetricSpec] = field(default_factory=list)
    engines: dict[int, int] = field(default_factory=dict)
    """engine -> how many of its series changed (0: heartbeated only)."""
    closing: bool = False
    chunks: dict[int, list[Chunk]] = field(default_factory=dict)
    """engine -> its chunks that changed, in index order (texts in ``sent_values``/``sent_names``)."""
    confirmed: int = 0
    """The writer's last batch Redis confirmed applied in this shard when this one was made (0:
    this batch carries the writer's whole state there), and the server time it was applied at:
    how the script tells a store that went back in time (see ``flush.lua``)."""
    confirmed_ms: int = 0
    held: dict[int, tuple[int, int]] = field(default_factory=dict)
    """engine -> (how many of the writer's chunks the store holds there as far as it knows, when
    its last applied batch heartbeated it), when the batch was made: the script checks they are
    all still there (``flush.lua``)."""
    checks: list[int] = field(default_factory=list)
    """The engines where the store holds the writer's chunks and this batch has no block:
    checked by the script (still there?), not heartbeated."""
    cut: bool = False
    """The take stopped at :data:`MAX_CALL_WORDS`: what did not fit waits in the totals, and
    goes as the next batch (its own number) once this one is confirmed, in the same flush."""

    def series(self) -> int:
        """How many series (counters, gauges, histograms) changed in this batch."""
        return sum(self.engines.values())

    def block_engines(self) -> list[int]:
        """The engines of this batch's blocks, in the order of its arguments (and keys)."""
        return list(dict.fromkeys([*self.engines, *self.chunks]))

    def script_keys(self, keys: Keys, writer_id: str) -> list[str]:
        """The KEYS of ``flush.lua`` for this batch: every key it may touch (a Redis Cluster
        requires them declared), the engine hashes in the order of :meth:`script_args`' blocks,
        then those of the engines it only checks."""
        fixed = [keys.seq, keys.engines, keys.writers, keys.meta, keys.claims, keys.conflicts]
        fixed += (keys.writer_stats(writer_id), keys.load)
        engines = [*self.block_engines(), *self.checks]
        return [*fixed, *[keys.counters(e) for e in engines]]

    def script_args(
        self,
        prefix: str,
        writer_id: str,
        *,
        owner: str = "",
        stale_ms: int = 0,
        claims: Iterable[int] = (),
        stats: list[str] | tuple[str, ...] = (),
        load: list[str] | tuple[str, ...] = (),
        held: str = "",
    ) -> list[str]:
        """The ARGV of ``flush.lua`` for this batch.

        *owner* claims the *claims* engines for conflict detection; *stats* are the writer's
        self-metrics that changed, as ``field, value`` pairs, and *load* its load entries, as
        ``engine, entry`` pairs (both absolute values: safe to send again). *held* names what
        else the store holds of this writer (``s`` its stats hash, ``c`` its claims), which the
        script checks is still there.
        """
        claimed = [str(e) for e in claims]
        args = [
            prefix,
            writer_id,
            str(self.seq),
            "1" if self.closing else "0",
            SCHEMA_VERSION,
            owner,
            str(stale_ms),
            str(self.confirmed),
            str(self.confirmed_ms),
            held,
            str(len(claimed)),
            *claimed,
            str(len(stats) // 2),
            *stats,
            str(len(self.specs)),
        ]
        for spec in self.specs:
            args += (spec.name, spec.to_json())
        args.append(str(len(load) // 2))
        args += load
        held_in = self.held
        checked = self.checks
        args.append(str(len(checked)))
        for engine in checked:
            args += (str(engine), *map(str, held_in[engine]))
        head = codec.chunk_field(writer_id, 0)[:-1]  # "@|<writer>|": the writer escaped once
        names_suffix = codec.NAMES_SUFFIX
        append = args.append
        for engine in self.block_engines():
            taken = self.chunks.get(engine, ())
            append(str(engine))
            append(str(held_in[engine][0]) if engine in held_in else "0")
            append(str(len(taken) + sum(1 for c in taken if c.send_names)))
            for chunk in taken:
                name = head + str(chunk.index)
                if chunk.send_names:
                    append(name + names_suffix)
                    append(chunk.sent_names)
                append(name)
                append(chunk.sent_values)
        return args


DUPLICATE, APPLIED, REMOVED, BEHIND = 0, 1, 2, 3
"""The statuses of ``flush.lua``'s reply (see :class:`FlushResult`)."""


@dataclass(frozen=True)
class FlushResult:
    """What the flush script answered."""

    status: int
    """APPLIED now; DUPLICATE (an earlier attempt applied it, its reply was lost); REMOVED (gc
    folded this writer: nothing applied, it continues under a new id); BEHIND (the shard lacks
    what this writer saw confirmed — Redis restarted empty or went back in time: nothing applied,
    the writer sends its whole state next)."""
    server_time_ms: int
    conflicts: int = 0
    catalog_conflicts: tuple[str, ...] = ()
    """Metrics whose spec in this batch conflicts with the definition stored first in Redis."""
    refused_series: int = 0
    """Series of this batch not written because their metric's spec conflicts."""
    load_error: str = ""
    """Why the batch's load entries were not stored ('' when they were, or it had none); the
    batch itself was applied."""
    lost: tuple[str, ...] = ()
    """Kinds of this writer's keys the script found gone that the store should hold (``seq``,
    ``catalogue``, ``engine``, ``chunk``, ``names``: the store is behind, nothing applied; ``stats``,
    ``writers``, ``engines``, ``claims``: rewritten by this flush or the next): evicted, deleted."""

    @property
    def applied(self) -> bool:
        """Applied now (False: applied by an earlier attempt, or not at all)."""
        return self.status == APPLIED

    @property
    def writer_removed(self) -> bool:
        """gc removed this writer (and folded what Redis held of it): nothing of this batch was
        applied; the writer continues under a new id with the rest of its totals."""
        return self.status == REMOVED

    @property
    def store_behind(self) -> bool:
        """The shard lacks what this writer saw confirmed: nothing applied; send everything."""
        return self.status == BEHIND

    @classmethod
    def from_reply(cls, reply: list[Any]) -> FlushResult:
        """Parse the script's reply ``{status, now, conflicts, {metric, ...}, refused series[,
        load error, {lost kind, ...}]}`` (the last two when applied, or found behind)."""
        status, now, conflicts = (int(x) for x in reply[:3])
        names = tuple(x.decode() if isinstance(x, bytes) else str(x) for x in reply[3])
        load_error = reply[5] if len(reply) > 5 else ""
        if isinstance(load_error, bytes):
            load_error = load_error.decode(errors="replace")
        lost = (
            tuple(x.decode() if isinstance(x, bytes) else str(x) for x in reply[6]) if len(reply) > 6 else ()
        )
        return cls(status, now, conflicts, names, int(reply[4]), str(load_error), lost)


class FlushProtocol:
    """Sequence numbers and the in-flight batch: what to send next, and what an answer means.

    Per shard of the namespace (one for an unsharded one), on the accumulator's flows: each has
    its own numbers and batch, confirmed by its own answer (see the module docstring).
    """

    def __init__(self, acc: Accumulator) -> None:
        self.acc = acc
        self.flows = acc.flows

    def next_batches(
        self,
        engines: Iterable[int] = (),
        *,
        closing: bool = False,
        always: Iterable[int] = (0,),
        room: dict[int, int] | None = None,
        more: Iterable[int] = (),
    ) -> dict[int, Batch]:
        """Shard -> the batch to send it now: its unconfirmed one again, else a new one with its
        next number, of at most its *room* (see :meth:`Accumulator.take_shards`); the batch
        of a shard of *more*, new or sent again, is cut whatever it holds (its call has more to
        carry than room for: the rest goes with the next part). The shards of *always* get one
        every time
        (heartbeats, self-metrics), the others once they have data (and from then on)."""
        wanted = set(always) | {f.index for f in self.flows if f.active}
        idle = [f for f in self.flows if f.in_flight is None]
        if idle and (wanted.intersection(f.index for f in idle) or self.acc.dirty):
            self._take(idle, engines, wanted, room)
        for flow in self.flows:  # a batch sent again too: its call's extras may have grown since
            if flow.index in more and flow.in_flight is not None:
                flow.in_flight.cut = True
        return self._sending(sorted(wanted), closing)

    def next_parts(
        self, shards: Iterable[int], room: dict[int, int], *, more: Iterable[int] = (), closing: bool = False
    ) -> dict[int, Batch]:
        """Shard -> its next batch, for each of *shards* whose batch Redis just confirmed was
        cut (:meth:`confirmed` said so): what did not fit in it, with the next number. Each part is a
        batch of its own, exactly once by the same protocol; a later part of a batch that
        carried the writer's whole state goes with the number of the part before it confirmed,
        so the store must hold that part (else it is behind, and everything goes again)."""
        cut = set(more)
        for shard in shards:  # the parts a flush round found cut (confirmed() said so)
            flow = self.flows[shard]
            if flow.in_flight is None:
                batch = self.acc.take_rest(shard, flow.next_seq, room[shard])
                batch.cut = batch.cut or shard in cut
                flow.send(batch)
        return self._sending(sorted(shards), closing)

    def _take(
        self, idle: list[ShardFlow], engines: Iterable[int], wanted: set[int], room: dict[int, int] | None
    ) -> None:
        """Take a new batch for each *idle* shard (none in flight) and send those of *wanted*,
        and those that got their first data (added to *wanted*)."""
        seqs = {f.index: f.next_seq for f in idle}
        resend = [f.index for f in idle if f.resend_all]
        for shard, batch in self.acc.take_shards(seqs, engines, resend=resend, room=room).items():
            if shard in wanted or self._first_data(shard, batch):
                self.flows[shard].send(batch)
                wanted.add(shard)

    def _first_data(self, shard: int, batch: Batch) -> bool:
        """Whether *batch* is the first with data for a shard not written to yet (which then gets
        a call every round); if not, no call, and its specs wait for its first data."""
        if not batch.engines and not batch.chunks and not batch.cut:
            self.acc.requeue_specs(batch.specs, shard)
            return False
        self.flows[shard].active = True
        return True

    def _sending(self, shards: list[int], closing: bool) -> dict[int, Batch]:
        """Shard -> its batch in flight, for each of *shards* that has one; with *closing*, the
        batches that leave nothing behind say the writer closes."""
        out: dict[int, Batch] = {}
        for shard in shards:
            flow = self.flows[shard]
            sending = flow.in_flight
            if sending is None:
                continue
            if closing and not sending.cut and not self.acc.dirty and not flow.owed:
                # Only the heartbeat depends on this flag, never the data: safe on a retried batch.
                sending.closing = True
            out[shard] = sending
        return out

    def confirmed(self, result: FlushResult, shard: int = 0) -> bool:
        """Redis answered *shard*'s call: its in-flight batch is applied (now or by an earlier
        attempt), or nothing of it was: gc had removed this writer there, or the store is behind
        what it confirmed before (both: the next batch carries everything). True when the batch
        applied was cut: its next part goes now (:meth:`next_parts`)."""
        self.acc.anchor(shard, result.server_time_ms)
        batch = self.flows[shard].answered(result)
        if batch is not None and not result.applied and batch.specs:
            # An earlier attempt applied it, but its answer (which would name catalogue conflicts)
            # was lost: send the specs again, so the script can tell us.
            self.acc.requeue_specs(batch.specs, shard)
        return batch is not None and batch.cut

    def in_flight_series(self) -> int:
        """Series in the batches sent but not confirmed yet (0 if none)."""
        return sum(f.in_flight.series() for f in self.flows if f.in_flight is not None)

    def has_pending(self) -> bool:
        """Whether anything is waiting to be sent (in flight, dirty, or owed to a shard)."""
        # A shard owed the writer's whole state (gc removed it, or the store went back in time)
        # is pending too: a closing writer must store it before it stops.
        return any(f.pending() or f.owed for f in self.flows) or bool(self.acc.dirty)
