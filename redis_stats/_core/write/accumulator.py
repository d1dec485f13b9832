"""The sans-I/O heart of a writer: :class:`Accumulator`, every series of one writer and the takes
that turn what they recorded into batches.

Nothing here touches the network, so the threaded writer (:mod:`redis_stats.writer`) and the
asyncio writer (:mod:`redis_stats.aio`) share every rule. The series its callers hold are in
:mod:`redis_stats._core.write.series` (what a record call does); the batches, the answers and the
sequence numbers of the exactly-once flush are in :mod:`redis_stats._core.write.protocol`.

- ``child``: the series of a metric for one engine and label values, made on first use (or a
  stand-in that only counts drops: over cardinality, label too long, conflicting definition).
- ``take_shards``: swaps the dirty list out, adds each child's pending delta into the writer's
  absolute totals (:mod:`redis_stats._core.write.chunks`) and makes per shard one
  :class:`~redis_stats._core.write.protocol.Batch` of the chunks that changed, as many as one call
  carries (``take_rest`` takes what did not fit, in the same flush). The record lock is held
  only for that swap (O(1), whatever the number of pending series): it bumps the generation, so
  the children's delta slots of the list just taken belong to the collector alone (see
  :mod:`redis_stats._core.write.series`); takes are serialized, so no update is lost or doubled.
  A take allocates no container per series (issue 28): the host's garbage collector is not
  pushed into full collections by the number of series a writer flushes.
- **Shards** (option ``shards`` = K > 1): engine ``e`` belongs to shard ``e % K``, each shard a
  self-contained namespace with its own sequence numbers. Every shard is one
  :class:`~redis_stats._core.write.shardflow.ShardFlow` (its totals, specs to send, sequence, in-flight
  batch; K = 1 is a list of one), so a shard whose call fails keeps and retries its own batch while
  the others carry on. One take feeds them all: its deltas go into each engine's shard's totals
  (also of a shard whose batch is in flight: totals are absolute, its next batch sends the sum).
"""

from __future__ import annotations

import threading
import time
from collections import Counter as _Tally
from collections.abc import Callable, Iterable

from redis_stats import codec
from redis_stats._core.write.chunks import UNBOUNDED, Totals
from redis_stats._core.write.protocol import SPEC_WORDS, Batch
from redis_stats._core.write.series import (
    CONFLICT_CLASS,
    Child,
    CounterChild,
    DroppedChild,
    GaugeChild,
    HistogramChild,
)
from redis_stats._core.write.shardflow import ShardFlow
from redis_stats.catalog import COUNTER, GAUGE, Catalog, MetricSpec
from redis_stats.keys import shard_of

# A take of many series gives the GIL away every this many series (well under the 5 ms switch
# interval even when the series are new and get their place in the totals, as in a first flush).
_YIELD_EVERY = 256


class Accumulator:
    """All series of one writer, by metric, engine and label values; the dirty list; drop tallies;
    and per shard of the namespace a :class:`~redis_stats._core.write.shardflow.ShardFlow` (``flows``,
    one for an unsharded namespace) whose totals the takes add to."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        max_label_length: int,
        max_series_per_metric: int,
        engine_offset: int = 0,
        shards: int = 1,
        writer_id: str = "",
    ) -> None:
        self.catalog = catalog
        self.lock = threading.Lock()  # the record lock: the dirty list, the generation, live slots
        self.gen = 0  # bumped by every take, under the lock; children write slot ``gen & 1``
        self.dirty: list[CounterChild | GaugeChild | HistogramChild] = []
        # Serializes takes: a take owns the slots of the generation it swapped out until it is done.
        self._take_lock = threading.Lock()
        # Called (under the lock) by a record that finds the dirty list of a generation empty
        # of it; set only in a forked child, to start its flusher on first use, then cleared.
        self.wake: Callable[[], None] | None = None
        self.drops: _Tally[str] = _Tally()
        self.max_label_length = max_label_length
        self.max_series_per_metric = max_series_per_metric
        self.engine_offset = engine_offset
        self._children: dict[tuple[str, int, tuple[str, ...]], Child] = {}
        self._series_count: _Tally[tuple[str, int]] = _Tally()
        self._gauges: list[GaugeChild] = []  # taken again when their stamps must be (take_shards)
        # One flow per shard: its totals and chunks are touched only by takes and their answers
        # (serialized), its unsent specs under the record lock.
        self.shards = shards
        self.flows = [ShardFlow(s, Totals(self.drop), catalog, writer_id) for s in range(shards)]
        # Metrics whose definition conflicts with the one stored first in Redis: never sent.
        self.conflicted: set[str] = set()
        # Whether a shard's server answered for the first time since gauges were sent stamped by
        # this host's clock: the next take sends them again, stamped in the server's time.
        self._restamp = False

    @property
    def owed(self) -> set[int]:
        """Shards whose totals changed since their last batch was made (it was in flight): with
        the series changed there meanwhile (:meth:`owed_series`), what a close that gives up
        loses besides the batches in flight."""
        return {f.index for f in self.flows if f.owed}

    def enlist(self, child: Child, gen: int) -> None:
        """Put *child*, changed for the first time in generation *gen*, on the dirty list (the
        caller holds the record lock)."""
        child.gen = gen
        self.dirty.append(child)
        if self.wake is not None:
            self.wake()

    def server_ms(self, engine: int, stamp: float) -> float:
        """The monotonic *stamp* of a value of *engine* in its shard's server time (ms); before
        that server has answered, in this host's time (the value is sent again once it has)."""
        return self.flows[shard_of(engine, self.shards)].server_ms(stamp)

    def anchor(self, shard: int, server_ms: int) -> None:
        """*shard*'s server answered at *server_ms* (its clock): anchor its gauge stamps to it."""
        if self.flows[shard].anchor(server_ms):
            self._restamp = True

    def drop(self, reason: str, n: int = 1) -> None:
        """Count *n* dropped updates (a dict increment; racing threads may rarely lose one count)."""
        self.drops[reason] += n

    def catalog_conflict(self, names: Iterable[str], refused_series: int = 0) -> list[str]:
        """Redis keeps another definition of the metrics *names*: from now on their updates are
        dropped and counted (``catalog_conflict``), and neither their specs nor their series are
        sent again. *refused_series* were refused by the flush that found the conflict.

        Returns the names not known to conflict before (to warn once each).
        """
        new = [n for n in names if n not in self.conflicted]
        with self.lock:
            self.conflicted.update(new)
            self._switch_conflicted()
            for flow in self.flows:
                for name in new:
                    flow.unsent.pop(name, None)
        if new:
            for flow in self.flows:  # by the collector, which owns the totals
                flow.totals.forget_metrics(set(new))
        if refused_series:
            self.drop("catalog_conflict", refused_series)
        return new

    def _switch_conflicted(self) -> None:
        """Switch the class of every child of a conflicted metric: callers hold these objects,
        so the hot path stays as it is (under the record lock)."""
        for (name, _engine, _values), child in self._children.items():
            if name in self.conflicted and type(child) in CONFLICT_CLASS:
                child.__class__ = CONFLICT_CLASS[type(child)]

    def requeue_specs(self, specs: Iterable[MetricSpec], shard: int = 0) -> None:
        """Send *specs* again with *shard*'s next batch (the answer about them was lost)."""
        with self.lock:  # a take swaps the dict out under it
            unsent = self.flows[shard].unsent
            for spec in specs:
                if spec.name not in self.conflicted:
                    unsent.setdefault(spec.name, spec)

    def child(
        self, spec: MetricSpec, engine: int, values: tuple[str, ...], writer_id: str
    ) -> CounterChild | GaugeChild | HistogramChild | DroppedChild:
        """The child of *spec* for *engine* and label *values*, created on first use.

        Label values longer than ``max_label_length``, and label sets beyond
        ``max_series_per_metric`` per metric and engine, get a child that only counts drops.
        """
        engine += self.engine_offset
        key = (spec.name, engine, values)
        found = self._children.get(key)
        if found is not None:
            return found
        with self.lock:
            found = self._children.get(key)
            if found is not None:
                return found
            refused = self._refusal(spec, engine, values)
            if refused:
                return DroppedChild(self, refused)
            made = self._children[key] = self._make(spec, engine, values)
            self._series_count[(spec.name, engine)] += 1
            if spec.kind != GAUGE:
                # Counters and histograms are exposed (at 0) as soon as they are bound.
                self.enlist(made, self.gen)
            return made

    def _refusal(self, spec: MetricSpec, engine: int, values: tuple[str, ...]) -> str:
        """Why a new series of *spec* for *engine* and *values* may not be stored ('' if it may)."""
        if spec.name in self.conflicted:
            return "catalog_conflict"
        if any(len(v) > self.max_label_length for v in values):
            return "label_too_long"
        if self._series_count[(spec.name, engine)] >= self.max_series_per_metric:
            return "cardinality"
        return ""

    def _make(self, spec: MetricSpec, engine: int, values: tuple[str, ...]) -> Child:
        """A new child of *spec*'s kind (under the record lock)."""
        components = (spec.name, *values)
        if spec.kind == COUNTER:
            return CounterChild(self, engine, codec.encode(components))
        if spec.kind == GAUGE:
            # The writer is named by the chunk holding the series, not by its field.
            gauge = GaugeChild(self, engine, codec.encode(components))
            self._gauges.append(gauge)
            return gauge
        return HistogramChild(self, engine, spec, components)

    def add_spec(self, spec: MetricSpec) -> MetricSpec:
        """Add *spec* to the catalogue (after start) and queue it for storing in Redis."""
        spec = self.catalog.add(spec)
        with self.lock:
            for flow in self.flows:
                flow.unsent.setdefault(spec.name, spec)
        return spec

    def take_shards(
        self,
        seqs: dict[int, int],
        engines: Iterable[int] = (),
        *,
        resend: Iterable[int] = (),
        room: dict[int, int] | None = None,
    ) -> dict[int, Batch]:
        """Move every pending change into the totals of its engine's shard, and make a new batch
        for each shard of *seqs* (shard -> its sequence number), heartbeating those of *engines*
        that belong to it. The shards not in *seqs* have a batch in flight: their changes wait in
        their totals for their next batch.

        Each shard of *resend* (Redis lost its data, or the writer has a new id there) gets every
        spec and every chunk (names too) again. A shard's batch holds at most its *room* (words
        of its call left for specs, engine blocks and checks; unbounded if not given): the rest
        waits in its totals (:attr:`Batch.cut`, and :meth:`take_rest`).
        """
        resending = [self.flows[s] for s in set(resend)]
        batches = {shard: Batch(seq=seq) for shard, seq in seqs.items()}
        with self._take_lock:
            dirty, gen, specs = self._swap(resending, batches)
            # Without the record lock: the totals belong to the collector (takes are serialized).
            for flow in resending:
                flow.totals.resend_all()
            self._take_children(dirty, gen & 1)
            if self._restamp or resending:
                self._restamp = False
                self._take_gauges_again(dirty)
            del dirty
            self._heartbeat(engines, batches)
            for shard, batch in batches.items():
                self._fill(batch, specs[shard], shard, UNBOUNDED if room is None else room[shard])
            # A shard with a batch in flight keeps its changes (dirty chunks) for its next batch.
            for flow in self.flows:
                flow.owed = bool(flow.totals.touched or flow.totals.dirty)
        return batches

    def take_rest(self, shard: int, seq: int, room: int) -> Batch:
        """The next batch of *shard*, numbered *seq*, when its last one was cut (:attr:`Batch.cut`):
        what did not fit, at most *room* words again. Nothing recorded since is taken (the dirty
        list stays for the next flush), so the batches of one flush end."""
        flow = self.flows[shard]
        batch = Batch(seq=seq)
        with self._take_lock:
            with self.lock:  # specs that did not fit, or added since: a take swaps them out under it
                specs, flow.unsent = flow.unsent, {}
            self._fill(batch, specs, shard, room)
            flow.owed = bool(flow.totals.touched or flow.totals.dirty)
        return batch

    def _swap(
        self, resending: list[ShardFlow], batches: dict[int, Batch]
    ) -> tuple[list[Child], int, dict[int, dict[str, MetricSpec]]]:
        """Under the record lock, O(1) whatever the number of pending series (record calls
        barely wait): swap the dirty list and the specs to send out, bump the generation.
        Returns the dirty list, the generation it belongs to, and the specs of each shard."""
        with self.lock:
            for flow in resending:
                flow.unsent = {s.name: s for s in self.catalog}
            specs: dict[int, dict[str, MetricSpec]] = {}
            for shard in batches:
                flow = self.flows[shard]
                specs[shard], flow.unsent = flow.unsent, {}
            dirty, self.dirty = self.dirty, []
            gen = self.gen
            self.gen = gen + 1
        return dirty, gen, specs

    @staticmethod
    def _take_children(dirty: list[Child], slot: int) -> None:
        """Add the pending deltas of *dirty* (in generation slot *slot*) into their totals."""
        for i, child in enumerate(dirty, 1):
            child._take(slot)
            if not i % _YIELD_EVERY:
                # Let the host's threads have the GIL: otherwise a record call that wants it
                # waits out the whole switch interval (5 ms) while this loop runs.
                time.sleep(0)

    def _take_gauges_again(self, dirty: list[Child]) -> None:
        """Every gauge with a value, again: for a shard that gets everything again, and once a
        shard's server time is first known, for the values sent stamped by this host's clock (a
        gauge set since the swap is sent now and again with the next batch: harmless, the newer
        value wins). Not those whose metric conflicts with the stored definition: never sent."""
        seen = {id(c) for c in dirty}
        for g in list(self._gauges):
            if g.state[0] and id(g) not in seen and type(g) is GaugeChild:
                g._take()

    def _heartbeat(self, engines: Iterable[int], batches: dict[int, Batch]) -> None:
        """Make sure the batch of each of *engines*' shards heartbeats it, even without data."""
        for engine in engines:
            engine += self.engine_offset
            shard = shard_of(engine, self.shards)
            if shard in batches:
                self.flows[shard].totals.touch(engine)

    def _fill(self, batch: Batch, specs: dict[str, MetricSpec], shard: int, room: int) -> None:
        """Put into *batch* the *specs* not known to conflict, and what changed in *shard*'s
        totals, within *room* words. Specs go first: a series is never sent before its metric's
        spec (the script refuses a series whose spec conflicts only in the batch carrying that
        spec), so when not every spec fits, the rest and every chunk wait for the next batch."""
        wanted = [s for s in specs.values() if s.name not in self.conflicted]
        fit = max(0, room) // SPEC_WORDS
        batch.specs, rest = wanted[:fit], wanted[fit:]
        if rest:
            self.requeue_specs(rest, shard)
            room = 0
        else:
            room -= SPEC_WORDS * len(wanted)
        totals = self.flows[shard].totals
        batch.held = totals.held()  # before the take: what earlier batches stored
        taken = totals.take(with_names=bool(batch.specs), room=room)
        batch.engines, batch.chunks, batch.checks = taken.engines, taken.chunks, taken.checks
        batch.cut = taken.cut or bool(rest)

    def bind(self, child: Child) -> None:
        """Give *child* (a :class:`Total` itself) its place in the totals of its shard.

        Called by the collector only (the first take of the child): the totals are its own.
        """
        self.flows[shard_of(child.engine, self.shards)].totals.adopt(child, child.engine)

    def owed_series(self) -> int:
        """Series changed for shards whose batch was in flight, not in a batch yet."""
        return sum(sum(f.totals.touched.values()) for f in self.flows if f.owed)

    def pending_series(self) -> int:
        """Series changed since the last batch was taken."""
        return len(self.dirty)

    def forget_pending(self, writer_id: str) -> None:
        """In a forked child: drop every pending change (they are the parent's) and start afresh
        as writer *writer_id*, in every shard. Bound children stay valid and count for the child
        from now on.

        Called with no other thread running (the at-fork hook), so no lock is needed; the take
        lock may have been held by the parent's flusher at fork time, so it is replaced.
        """
        self._take_lock = threading.Lock()
        self.dirty = []
        self.drops = _Tally()
        for made in self._children.values():
            made.unbind()  # its place was in the totals reset below
            if isinstance(made, CounterChild):
                made.deltas = [0, 0]
            elif isinstance(made, HistogramChild):
                made.pending = [made._empty(), made._empty()]
            elif isinstance(made, GaugeChild):
                # The parent's value is the parent's (a summed gauge would count it twice).
                made.state = (0.0, 0.0)
            made.gen = -1
        # The totals, sequence and batches are the parent's too: this writer's start at zero,
        # under its own id, which stores the catalogue again (the series fields do not name the
        # writer; its chunks do).
        for flow in self.flows:
            flow.restart(self.catalog)
            flow.writer_id = writer_id
