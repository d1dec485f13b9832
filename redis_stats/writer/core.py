"""The writer without its I/O: :class:`WriterCore`.

Catalogue, series, sequence numbers and self-metrics; what each flush sends and what each answer
means (applied, already applied, gc removed the writer, the store is behind, catalogue and
engine conflicts, a ``WAIT`` reply); when a close tries again or gives up. The blocking writer
(:mod:`redis_stats.writer.blocking`) carries its steps out with a thread, the asyncio one
(:mod:`redis_stats.aio.writer`) with a task, so the exactly-once protocol
(:mod:`redis_stats._core.write.protocol`) is driven by one piece of code.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import redis

from redis_stats._core.steps import Steps
from redis_stats._core.write.accumulator import Accumulator
from redis_stats._core.write.protocol import CALL_WORDS, DUPLICATE, MAX_CALL_WORDS, FlushProtocol, FlushResult
from redis_stats.capability import check_steps
from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM, Catalog, CatalogError, MetricSpec
from redis_stats.codec import ENDPOINT_FIELD, FLUSH_FIELD, STALE_FIELD
from redis_stats.config import ConfigError, StatsConfig
from redis_stats.errors import ReplicationLag, StoreUnsupported, error_kind
from redis_stats.keys import Keys, shard_of
from redis_stats.load import LoadMap
from redis_stats.writer import forking
from redis_stats.writer.handles import CounterSeries, GaugeSeries, HistogramSeries, MetricHandle
from redis_stats.writer.identity import check_engines, check_identity, new_writer_id
from redis_stats.writer.lane import LoadLane
from redis_stats.writer.loadtracker import LoadTracker
from redis_stats.writer.outages import FlushOutages
from redis_stats.writer.stats import CLAIMS_PER_STALE, STATS_INTERVAL, WriterStats, routine_stat

# The most words of claims and load entries (one per claimed engine, two per load entry) one flush
# call carries: a writer of thousands of engines sends the rest with the next parts of its flush.
EXTRA_WORDS = 1_600

__all__ = ["WriterCore"]

# The package's name: what hosts configure logging by (warnings of the blocking writer too).
log = logging.getLogger("redis_stats.writer")


class WriterCore:
    """A writer without its I/O: catalogue, series, sequence numbers and self-metrics, what each
    flush sends and what each answer means.

    :class:`StatsWriter` (a thread) and :class:`redis_stats.aio.AsyncStatsWriter` (a task) wrap
    it, so the exactly-once protocol exists once.
    """

    def __init__(
        self,
        config: StatsConfig | None = None,
        catalog: Catalog | None = None,
        *,
        engines: tuple[int, ...] | list[int] = (),
        writer_id: str | None = None,
        role: str = "",
        owner: str = "",
        load: LoadMap | None = None,
    ) -> None:
        self.config = config or StatsConfig.from_env()
        # The load feed's fields (redis_stats/load.py): which series feed them, and their entries.
        self.load = LoadTracker(load) if load is not None else None
        self.lane: LoadLane | None = None  # their entries, in each flush and between (made below)
        self.catalog = catalog if catalog is not None else Catalog()
        check_identity("role", role)
        check_identity("owner", owner)
        if owner and "|" in owner:
            # Stored as "<owner>|<ms>" in the claims hash and joined with "|" in the conflicts hash.
            raise ConfigError(
                f"owner={owner!r} contains '|', which separates owners in Redis; use another character"
            )
        if writer_id is not None:
            check_identity("writer_id", writer_id)
        self._role = role
        self.owner = owner
        self.writer_id = writer_id or new_writer_id(role)
        self.keys = Keys(self.config.namespace)
        self.engines = check_engines(engines)
        self.stats = WriterStats()
        k = self.shards = self.config.shards
        offset = self.config.engine_offset
        heartbeat = {shard_of(e + offset, k) for e in self.engines}
        # The writer's self-metrics (w:<id>) live in one shard only, so readers never count them
        # twice: shard 0 if it writes shard 0's engines (always when unsharded), else the lowest.
        self.home = min(heartbeat, default=0)
        self._always = tuple(sorted(heartbeat | {self.home}))
        # Whether shard 0's catalogue lists this K (readers configured otherwise find the shards).
        self.shards_noted = k == 1
        # Whether the server passed the capability check (redis_stats.capability): checked
        # before the first flush, and again after a flush answered as by a server without
        # scripting, or one found behind (restarted: maybe as another server).
        self.store_checked = False
        self._acc = Accumulator(
            self.catalog,
            max_label_length=self.config.max_label_length,
            max_series_per_metric=self.config.max_series_per_metric,
            engine_offset=offset,
            shards=k,
            writer_id=self.writer_id,
        )
        # One flow per shard (its totals, sequence, batch in flight and the writer's id there).
        self._flows = self._acc.flows
        if self.load is not None:
            self.lane = LoadLane(self.load, self._acc, self.keys, self.config)
        self._protocol = FlushProtocol(self._acc)
        self._parts: list[int] = []  # shards whose batch just confirmed was cut: their next part goes now
        # Per shard, the claims and load entries of this flush round not sent yet (a call has
        # room for EXTRA_WORDS of them; the rest go with the next part).
        self._extras: dict[int, tuple[list[int], list[int]]] = {}
        self._closed = False
        self._parts_attached: list[Any] = []  # more parts of each flush round (attach)
        # Self-metrics Redis holds for this writer (as far as we know), and those the flush in
        # flight sends: only the ones that changed go with a flush (each field costs Redis time).
        self._stats_stored: dict[str, str] = {}
        self._stats_sent: list[str] = []
        self._stats_at = -math.inf  # monotonic time of the last flush Redis applied them with
        self.claim_interval = self.config.stale_after / CLAIMS_PER_STALE
        """Least seconds between two flushes that claim the writer's engines (with an owner): a
        claim lives for the stale_after of whoever checks it, and each costs the flush a read and
        a write of the claims hash. Another live owner is found within this plus one flush."""
        self.stats_interval = STATS_INTERVAL
        """Least seconds between two flushes that carry self-metrics when only the routine ones
        changed (flush counts and durations, pending series): each flush that carries them
        writes one more hash in Redis. Any other change goes with the next flush."""
        # Per shard, the outages of its flushes in the log: the start and the end of each.
        self.outages = FlushOutages(self.config, lambda shard: self._flows[shard].writer_id)
        forking.track(self)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.writer_id!r}, url={self.config.safe_url!r}, "
            f"namespace={self.config.namespace!r}, engines={list(self.engines)})"
        )

    # -- defining and binding ---------------------------------------------------------------

    def metric(self, name: str) -> MetricHandle[Any]:
        """The handle of metric *name* (CatalogError if the catalogue does not define it)."""
        return MetricHandle(self, self.catalog[name])

    def series(self, spec: MetricSpec, engine: int, values: tuple[str, ...]) -> object:
        """The series of *spec* for *engine* and label *values*, made on first use (what
        :meth:`MetricHandle.labels` returns, typed there by the metric's kind)."""
        child = self._acc.child(spec, engine, values, self.writer_id)
        if self.load is None:
            return child
        return self.load.bind(spec, engine + self.config.engine_offset, values, child)

    def _kind(self, name: str, kind: str) -> MetricHandle[Any]:
        handle = self.metric(name)
        if handle.spec.kind != kind:
            raise CatalogError(f"metric {name!r} is a {handle.spec.kind}, not a {kind}")
        return handle

    def counter(self, name: str) -> MetricHandle[CounterSeries]:
        """The handle of counter *name*."""
        return self._kind(name, COUNTER)

    def gauge(self, name: str) -> MetricHandle[GaugeSeries]:
        """The handle of gauge *name*."""
        return self._kind(name, GAUGE)

    def histogram(self, name: str) -> MetricHandle[HistogramSeries]:
        """The handle of histogram *name*."""
        return self._kind(name, HISTOGRAM)

    def define(self, spec: MetricSpec) -> MetricHandle[Any]:
        """Add *spec* to the catalogue after start; it is stored in Redis with the next flush."""
        return MetricHandle(self, self._acc.add_spec(spec))

    def add_engines(self, engines: tuple[int, ...] | list[int]) -> None:
        """Heartbeat *engines* too from the next flush on (a bridge learns a source's engines
        as it scrapes them); refused as at construction when one is not an int >= 0."""
        added = set(check_engines(engines)) - set(self.engines)
        self.engines = tuple(sorted({*self.engines, *added}))
        offset, k = self.config.engine_offset, self.shards
        for shard in {shard_of(e + offset, k) for e in added}:  # claimed with the next flush there
            self._flows[shard].claimed_at = -math.inf
        self._always = tuple(sorted({shard_of(e + offset, k) for e in self.engines} | {self.home}))

    def count_drop(self, reason: str, n: int = 1) -> None:
        """Count *n* updates dropped before they reached this writer, by *reason* (a bridge's
        refused scrape): stored with the self-metrics, as ``redis_stats_writer_dropped_updates``."""
        self._acc.drop(reason, n)

    @property
    def drops(self) -> dict[str, int]:
        """Updates dropped on the hot path, by reason (invalid_value, label_too_long, ...)."""
        return dict(self._acc.drops)

    @property
    def shard_ids(self) -> list[str]:
        """The writer's id in each shard: the same, until gc removes it in one shard (a long
        pause) and it continues there under a new one (see :meth:`flush_succeeded`)."""
        return [flow.writer_id for flow in self._flows]

    def pending(self) -> bool:
        """Whether any update has not been confirmed by Redis yet."""
        return self._protocol.has_pending() or any(p.pending() for p in self._parts_attached)

    def attach(self, part: Any) -> None:
        """Have every flush round carry out *part*'s steps after the writer's own (the usage
        ledger, :class:`redis_stats.usage.UsageRecorder`): its ``flush_steps(closing)`` (steps
        ``("script", (name, KEYS, ARGV))``: ``<name>.lua``), ``pending()`` (a close waits for
        it) and ``forked(writer_id)`` (in a child after fork)."""
        self._parts_attached.append(part)

    def _before_fork(self) -> None:
        """In the parent, just before fork(), before the record lock is taken (no I/O)."""

    def _forked(self) -> None:
        """In a child process after fork(): become a new writer with nothing pending.

        Runs in the at-fork hook (no thread may be started here, no I/O done). The parent's
        pending and in-flight data stay the parent's: the child must not send them again.
        """
        self.writer_id = new_writer_id(self._role)
        self.stats = WriterStats()
        self.outages.forked()
        self._stats_stored, self._stats_sent, self._stats_at = {}, [], -math.inf
        self._acc.forget_pending(self.writer_id)
        self._protocol = FlushProtocol(self._acc)
        if self.load is not None:
            self.load.forked()
        for part in self._parts_attached:
            part.forked(self.writer_id)

    def lost_summary(self) -> str:
        """What is not confirmed by Redis yet, in words (for the line logged when it is given
        up): the writer's series, then each attached part's (the usage ledger's)."""
        parts = "".join(f"; {p.lost_summary()}" for p in self._parts_attached if p.pending())
        return self._series_lost() + parts

    def _series_lost(self) -> str:
        """What is not confirmed by Redis yet, in words (for the line logged when it is given up)."""
        series, pending = self._protocol.in_flight_series(), self._acc.pending_series()
        if self.shards == 1:
            return f"{series} series in the unconfirmed batch and {pending} more changed since"
        # Sharded: changes for a shard whose batch is in flight wait in its totals (owed), not
        # in the dirty list; and say which shards did not confirm.
        owed = self._acc.owed_series()
        behind = [f for f in self._flows if f.in_flight is not None or f.owed]
        where = ", ".join(f"{f.index} ({f.keys(self.keys, self.shards).root})" for f in behind) or "none"
        return (
            f"{series} series in the unconfirmed batches and {pending + owed} more changed since "
            f"(shards not confirmed: {where})"
        )

    # -- the flush protocol, without I/O -------------------------------------------------------

    def prepare_flushes(
        self, *, closing: bool = False, parts: list[int] | None = None
    ) -> list[tuple[int, list[str], list[str]]]:
        """``(shard, KEYS, ARGV)`` of each script call of the next flush round: one per shard
        this writer writes to (one in all when the namespace is not sharded), each the shard's
        unconfirmed batch again, or a new one; none above :data:`MAX_CALL_WORDS` words. With
        *parts*, the next part of those shards' batches (:attr:`Batch.cut`): what did not fit,
        and the claims and load entries the calls before had no room for."""
        if parts is None:
            self._extras = {flow.index: self._extras_of(flow.index) for flow in self._flows}
        room, more = {}, set()
        for flow in self._flows:
            claims, load = self._extras.get(flow.index, ((), ()))
            extra = len(claims) + 2 * len(load)
            if extra > EXTRA_WORDS:
                more.add(flow.index)  # the rest of them rides on the next part
            # Room for the most extras a call carries, whatever this round's are: a batch sent
            # again carries the extras of the round that sends it (claims fall due, engines
            # gain load entries), and must still fit.
            room[flow.index] = self._room(flow.index, EXTRA_WORDS)
        if parts is None:
            batches = self._protocol.next_batches(
                self.engines, closing=closing, always=self._always, room=room, more=more
            )
        else:
            batches = self._protocol.next_parts(parts, room, more=more, closing=closing)
        stale_ms = int(self.config.stale_after * 1000)
        calls = []
        for shard, batch in batches.items():
            flow = self._flows[shard]
            # Computed when first used (and cached): with K = 64 the 63 tags cost ~0.3 s of CPU,
            # and a writer of one engine (the vLLM deployment) only ever needs one or two.
            keys = flow.keys(self.keys, self.shards)
            claims, load = self._take_extras(shard)
            flow.claiming = bool(claims)
            # What the store should hold of this writer besides its chunks: checked by the script
            # (claims renewed by the first call of a flush; a later part's are new ones).
            held = "s" if shard == self.home and self._stats_stored else ""
            held += "c" if claims and parts is None and flow.claimed_at > -math.inf else ""
            args = batch.script_args(
                keys.prefix,
                flow.writer_id,
                owner=self.owner,
                stale_ms=stale_ms,
                claims=claims,
                stats=self._changed_stats(batch.closing) if shard == self.home else (),
                load=self.lane.entries(load, closing) if self.lane is not None else [],
                held=held,
            )
            calls.append((shard, batch.script_keys(keys, flow.writer_id), args))
        return calls

    def _extras_of(self, shard: int) -> tuple[list[int], list[int]]:
        """What a flush round sends *shard* besides its batch: the engines it claims there (when
        due) and those whose load entries it sends there."""
        offset, k = self.config.engine_offset, self.shards
        claims = (
            [e + offset for e in self.engines if shard_of(e + offset, k) == shard]
            if self.owner and self._flows[shard].claims_due(self.claim_interval)
            else []
        )
        load = [e for e in self.load.engines() if shard_of(e, k) == shard] if self.load is not None else []
        return claims, load

    def _take_extras(self, shard: int) -> tuple[list[int], list[int]]:
        """The claims and load entries of the next call to *shard*: at most :data:`EXTRA_WORDS`
        words of them, claims first; the rest stays for the call after it (the next part)."""
        claims, load = self._extras.get(shard, ([], []))
        taken_claims, claims = claims[:EXTRA_WORDS], claims[EXTRA_WORDS:]
        fit = (EXTRA_WORDS - len(taken_claims)) // 2
        taken_load, load = load[:fit], load[fit:]
        self._extras[shard] = (claims, load)
        return taken_claims, taken_load

    def _room(self, shard: int, extra: int) -> int:
        """The words a call to *shard* has left for its batch's specs, engine blocks and checks:
        :data:`MAX_CALL_WORDS` less what every call carries, its self-metrics (at most all of
        them, in its home) and the *extra* words of its claims and load entries."""
        words = MAX_CALL_WORDS - CALL_WORDS - extra
        if shard == self.home:
            words -= 2 * self.stats.field_count(self._acc.drops)
        return words

    def _changed_stats(self, closing: bool) -> list[str]:
        """The self-metrics (field, value pairs) that differ from what Redis holds: none when
        only routine ones changed since a flush less than :attr:`stats_interval` ago stored
        them (a closing flush sends its last values whatever changed)."""
        fields = self.stats.as_fields(self.drops, self._acc.pending_series(), self.engines, self.owner)
        # Readers judge this writer (and its engines) by its own stale_after and flush interval
        # (_core/read/liveness.py), and group its engines by its endpoint (the endpoint views).
        fields += (STALE_FIELD, str(int(self.config.stale_after * 1000)))
        fields += (FLUSH_FIELD, str(int(self.config.flush_interval * 1000)))
        if self.config.endpoint is not None:
            fields += (ENDPOINT_FIELD, self.config.endpoint)
        stored = self._stats_stored
        changed = [x for k, v in zip(fields[0::2], fields[1::2]) if stored.get(k) != v for x in (k, v)]
        recent = time.monotonic() - self._stats_at < self.stats_interval
        if recent and not closing and all(map(routine_stat, changed[0::2])):
            changed = []
        self._stats_sent = changed
        return changed

    def flush_failed(self, exc: BaseException, shard: int = 0) -> None:
        """The flush (of *shard*) did not get an answer: count it; the same batch goes next time.
        The first failure of an outage is logged (a warning), the others at DEBUG; the first
        flush that works again logs its end (:class:`~redis_stats.outage.Outage`)."""
        kind = error_kind(exc)
        self.stats.errors[kind] += 1
        if kind == "unsupported":  # the check says what is missing, and how to fix it
            self.store_checked = False
        self.outages.failed(shard, kind, exc)

    def store_refused(self, exc: StoreUnsupported) -> None:
        """The capability check refused the server: nothing is sent (the batch stays pending:
        recording goes on in memory), counted as a flush error of kind ``unsupported``; one
        error logged, again only when what is missing changes. Checked again next round."""
        self.stats.errors["unsupported"] += 1
        self.outages.refused(self.writer_id, exc)

    def check_steps(self) -> Steps[bool]:
        """The capability check, when due, as steps (:func:`redis_stats.capability.check_steps`):
        False when the server was refused (:meth:`store_refused`). A server that does not answer
        is not refused: the flushes that follow fail as they would and are counted, and the
        check runs again next round."""
        if self.store_checked:
            return True
        try:
            yield from check_steps(self.config, writes=True)
        except StoreUnsupported as exc:
            self.store_refused(exc)
            return False
        except Exception as exc:
            log.debug("the capability check of %s failed (%s); flushing anyway", self.config.safe_url, exc)
            return True
        self.store_checked = True
        self.outages.accepted()
        return True

    def shards_failed(self, exc: BaseException) -> None:
        """Listing this writer's K in shard 0 (``shards.lua``) failed: tried again next round.
        Not a flush attempt, so not in ``flush_errors_total`` (each round would add one more
        error until it succeeds): a warning on the first failure of each kind, then DEBUG."""
        kind = error_kind(exc)
        self.stats.shards_errors[kind] += 1
        log_fn = log.warning if self.stats.shards_errors[kind] == 1 else log.debug
        log_fn(
            "listing K=%d in shard 0's catalogue at %s failed (%s: %s); will retry at the next flush",
            self.shards,
            self.config.safe_url,
            kind,
            exc,
        )

    def flush_succeeded(self, reply: Any, seconds: float, shard: int = 0) -> FlushResult:
        """Redis answered the flush of *shard* (applied now, or already applied): move on."""
        result = FlushResult.from_reply(reply)
        if self._protocol.confirmed(result, shard):
            self._parts.append(shard)
        if result.load_error and self.lane is not None:  # the batch was applied, its load entries refused
            self.lane.done(redis.exceptions.ResponseError(result.load_error), self.stats)
        if result.lost:
            self._keys_lost(result, shard)
        elif result.store_behind:
            self._store_behind(shard)
        if shard == self.home:  # the self-metrics go to the home shard only
            self._stats_answered(result)
        self.outages.answered(shard, rebuilt=bool(result.lost or result.store_behind))
        self.stats.observe_duration(seconds)
        self.stats.last_success = time.time()
        self.stats.flushes += 1
        self.stats.duplicates += result.status == DUPLICATE
        if result.catalog_conflicts:
            self._catalog_conflicts(result)
        if result.conflicts:
            self._engine_conflicts(result.conflicts)
        if result.writer_removed:
            self._renamed(shard)
        return result

    def _store_behind(self, shard: int) -> None:
        """Redis lost (some of) *shard*'s data: maybe shard 0's too, and with it the list of K:
        note K again (idempotent, one call). The next batch stores everything."""
        self.shards_noted = self.shards == 1
        self.store_checked = False
        log.warning(
            "%s holds less of this writer than it confirmed (restarted empty or from an older "
            "copy, or a replica that had not caught up took over%s): storing its whole state "
            "again with the next flush",
            self.config.safe_url,
            f"; shard {shard}" if self.shards > 1 else "",
        )

    def _keys_lost(self, result: FlushResult, shard: int) -> None:
        """The script found keys of this writer gone that the store should hold (evicted under
        maxmemory, or deleted): count each kind, warn once for this event. What was lost is
        stored again with the next flush (all of it when the store was found behind)."""
        if result.store_behind:  # shard 0's list of K may be gone too: noted again
            self.shards_noted = self.shards == 1
        for kind in result.lost:
            self.stats.lost[kind] += 1
        where = f" (shard {shard})" if self.shards > 1 else ""
        log.warning(
            "keys of writer %s are gone from %s%s: %s (evicted under maxmemory, deleted, or Redis "
            "went back to a copy without them; see docs/redis-servers.md, maxmemory-policy): %s",
            self._flows[shard].writer_id,
            self.config.safe_url,
            where,
            ", ".join(result.lost),
            "storing its whole state again with the next flush"
            if result.store_behind
            else "stored again by this flush or the next",
        )

    def _stats_answered(self, result: FlushResult) -> None:
        """The home shard answered: what Redis now holds of the self-metrics."""
        if "stats" in result.lost:
            self._stats_stored = {}  # gone: all sent again with the next flush
            return
        if result.writer_removed or result.store_behind:
            self._stats_stored = {}  # a new id, or a store that lost them: all sent again
        elif result.applied and self._stats_sent:  # applied now: with it the self-metrics it carried
            sent = self._stats_sent
            self._stats_stored.update(zip(sent[0::2], sent[1::2]))
            self._stats_at = time.monotonic()

    def _catalog_conflicts(self, result: FlushResult) -> None:
        """Stop sending the metrics Redis defines otherwise, with one warning for each new one."""
        for name in self._acc.catalog_conflict(result.catalog_conflicts, result.refused_series):
            log.warning(
                "metric %r of this writer is defined differently in namespace %r (the first "
                "stored definition wins): this writer's updates of it are dropped and counted "
                "(reason catalog_conflict). This writer's spec: %s; stored: see `redis-stats "
                "inspect`. Rename the metric, or use another namespace",
                name,
                self.config.namespace,
                self.catalog[name].to_json(),
            )

    def _engine_conflicts(self, conflicts: int) -> None:
        """Another live owner claims this writer's engines: warn the first time, count each."""
        if not self.stats.conflicts:
            log.warning(
                "another live instance also claims engine(s) %s of namespace %r (this one: %r): "
                "their scheduler gauges will mix; give each instance its own engine index "
                "(REDIS_STATS_ENGINE_OFFSET) or namespace",
                [e + self.config.engine_offset for e in self.engines],
                self.config.namespace,
                self.owner,
            )
        self.stats.conflicts += conflicts

    def _renamed(self, shard: int) -> None:
        """gc removed this writer in *shard*: silent for longer than the retention (a paused
        process?), it was folded there. Carry on as a new incarnation with the rest of the
        totals (FlushProtocol.confirmed took the folded part off); the next flush sends it.
        Shards are collected apart: the new id is this shard's (the home shard's is the
        writer's id, that of its self-metrics)."""
        flow = self._flows[shard]
        old_id, flow.writer_id = flow.writer_id, new_writer_id(self._role)
        if shard == self.home:  # the series fields do not name the writer (its chunks do)
            self.writer_id = flow.writer_id
        where = f" in shard {shard}" if self.shards > 1 else ""
        log.warning("writer %s was removed by gc%s; continuing as %s", old_id, where, flow.writer_id)

    def flush_steps(self, *, closing: bool = False) -> Steps[bool]:
        """One flush round as steps (see :mod:`redis_stats._core.steps`), carried out blocking by
        :class:`StatsWriter` and awaited by the asyncio twin: ``("shards", (KEYS, ARGV))`` lists
        this writer's K in shard 0's catalogue (until done once), then ``("flush", (KEYS, ARGV))``
        per shard written to, one after the other, and again for each shard whose batch did not
        fit in one call (its next part, once the one before is confirmed: at most
        :data:`MAX_CALL_WORDS` words a call). Ends with True if Redis confirmed every flush; a
        failure is counted here and that shard's batch goes again next round (the parts after
        it, with the round after that). A server that cannot hold the store is refused first
        (:meth:`check_steps`): the round ends False and sends nothing."""
        if not (yield from self.check_steps()):
            return False
        if not self.shards_noted:
            try:
                yield ("shards", self.shards_call())
                self.shards_noted = True
            except Exception as exc:  # logged; tried again next round
                self.shards_failed(exc)
        ok = True
        calls = self.prepare_flushes(closing=closing)
        while calls:
            self._parts = []
            for shard, keys, args in calls:
                started = time.perf_counter()
                try:
                    reply = yield ("flush", (keys, args))
                except Exception as exc:  # never raised into the host
                    self.flush_failed(exc, shard)
                    ok = False
                    continue
                self.flush_succeeded(reply, time.perf_counter() - started, shard)
            calls = self.prepare_flushes(closing=closing, parts=self._parts) if self._parts else []
        for part in self._parts_attached:
            ok = (yield from part.flush_steps(closing)) and ok
        return ok

    def shards_call(self) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of ``shards.lua``: list this writer's K in shard 0's catalogue, so that
        a reader configured with another K still reads every shard (once per writer)."""
        return [self.keys.meta], [str(self.shards)]

    def script_and_wait(self, reply: Any, acked: Any) -> Any:
        """The script's reply, given it and WAIT's (pipelined, or one after the other on a
        Cluster): a failure of either is raised, too few replicas raise :class:`ReplicationLag`."""
        for part in (reply, acked):
            if isinstance(part, Exception):
                raise part
        self.replication_check(acked)
        return reply

    def close_budget(self, timeout: float | None) -> tuple[float, float]:
        """(budget in seconds, monotonic deadline) of a close with *timeout* (None: the config's)."""
        budget = self.config.close_timeout if timeout is None else max(0.0, float(timeout))
        return budget, time.monotonic() + budget

    def final_flush_step(self, ok: bool, deadline: float) -> tuple[bool | None, float]:
        """After one closing flush: ``(True, 0)`` all confirmed, ``(False, 0)`` the deadline
        passed, ``(None, pause)`` try again after *pause* s (at once when the flush succeeded but
        more was recorded meanwhile; 0.1 s at most after a failure, never past the deadline)."""
        if ok and not self.pending():
            return True, 0.0
        left = deadline - time.monotonic()
        if left <= 0:
            return False, 0.0
        return None, 0.0 if ok else min(0.1, left)

    def warn_lost(self, budget: float, logger: logging.Logger = log) -> None:
        """The one warning of a close that gave up: what was lost, and where it should have gone."""
        logger.warning(
            "closing writer %s: gave up after %.1f s; not confirmed by %s and lost: %s",
            self.writer_id,
            budget,
            self.config.safe_url,
            self.lost_summary(),
        )

    def replication_check(self, acked: Any) -> None:
        """With ``wait_replicas``: raise :class:`ReplicationLag` if too few replicas acknowledged."""
        wanted = self.config.wait_replicas
        if int(acked) < wanted:
            # Applied on the master, not yet on enough replicas: a failover now could lose it. Keep
            # the batch; the retry is a duplicate here (skipped) or is applied on the new master.
            raise ReplicationLag(
                f"{acked} of {wanted} replicas acknowledged within {self.config.wait_timeout_ms} ms"
            )
