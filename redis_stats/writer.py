"""StatsWriter: record counters, gauges and histograms per engine; a thread flushes them to Redis.

    writer = StatsWriter(StatsConfig.from_env(), catalog, engines=[0, 1])
    tokens = writer.counter("generation_tokens").labels(engine=0)   # bind once
    tokens.inc(17)                                                   # hot path: memory only
    writer.close()                                                   # last flush

Every flush interval the thread sends one script call with every change since the last one (one
per shard it writes to when the namespace is split into shards, see docs/key-schema.md; the
exactly-once rules are in :mod:`redis_stats._core.accumulator`). Start-up does not need Redis;
while Redis is down, updates keep landing in memory and nothing raises into the caller.

**Fork.** A writer made before ``os.fork()`` (gunicorn ``--preload``, multiprocessing's fork
start method) carries on in both processes. The parent keeps its id, its pending and in-flight
data. The child becomes a new writer: a new id, no pending data (it never re-sends the
parent's), fresh locks, a new connection pool, and its own flusher thread, started by its first
record (not by the fork itself). Children bound before the fork (``tokens = ...labels(...)``)
keep working in the child and count for the child. See docs/operations.md for the asyncio writer.
"""

from __future__ import annotations

import atexit

# The first connect imports the "idna" codec (socket.getaddrinfo encodes the host name). A fork
# while the parent's flusher is inside that import leaves the module's import lock held for
# ever in the child, whose first connect then hangs: import it here, before any flusher runs.
import encodings.idna  # noqa: F401
import logging
import math
import operator
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from bisect import bisect_left
from collections import Counter as _Tally
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

import redis
from redis.utils import HIREDIS_AVAILABLE

from redis_stats._core.accumulator import Accumulator
from redis_stats._core.liveness import STALE_FIELD
from redis_stats._core.protocol import DUPLICATE, FlushProtocol, FlushResult
from redis_stats._core.steps import Steps, run
from redis_stats._scripts import Script, load_script
from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM, Catalog, CatalogError, MetricSpec
from redis_stats.config import ConfigError, StatsConfig
from redis_stats.connection import Client, is_cluster, make_client
from redis_stats.errors import ReplicationLag, error_kind  # both importable from here as they always were
from redis_stats.keys import Keys, shard_of
from redis_stats.load import LoadMap, LoadTracker

__all__ = [
    "CounterSeries",
    "GaugeSeries",
    "HistogramSeries",
    "MetricHandle",
    "ReplicationLag",
    "StatsWriter",
    "WriterCore",
    "WriterStats",
    "error_kind",
    "new_writer_id",
]

log = logging.getLogger("redis_stats.writer")


def _check_identity(what: str, value: object) -> None:
    """A writer's *role*, *owner* or id goes to Redis as UTF-8 with every flush: refuse at
    construction what could never be sent (one bad value would stop every flush)."""
    if not isinstance(value, str):
        raise ConfigError(f"{what}={value!r} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{what}={value!r} cannot be encoded as UTF-8 ({exc.reason} at index {exc.start}); "
            "pass text without lone surrogates"
        ) from None


def _check_engines(engines: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The engines a writer heartbeats, as ints >= 0; refused at construction otherwise.

    Every flush heartbeats them: a value Redis cannot take as an engine (``-1``) would have every
    flush of the writer refused, and ``1.5`` or ``True`` would silently heartbeat engine 1. The
    same rule as ``labels(engine=...)``; int-like types (numpy integers) are taken by value.
    """
    given = list(engines)
    out = []
    for engine in given:
        try:
            value = None if isinstance(engine, bool) else operator.index(engine)
        except TypeError:
            value = None
        if value is None or value < 0:
            raise ConfigError(
                f"engines={given!r}: engine {engine!r} is not an integer >= 0; "
                "pass each engine index this process serves as an int"
            )
        out.append(value)
    return tuple(out)


def new_writer_id(role: str = "") -> str:
    """A writer id unique per process incarnation: ``host:pid[:role]:random``."""
    parts = [socket.gethostname(), str(os.getpid())]
    if role:
        parts.append(role)
    parts.append(secrets.token_hex(3))
    return ":".join(parts)


# Every live writer, weakly (the registry must not keep a writer alive), for the fork hooks below.
_LIVE: weakref.WeakSet[WriterCore] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_FORKING: list[WriterCore] = []


def _before_fork() -> None:
    # Hold every writer's record lock across fork(): no thread is half-way through an update
    # when the child's copy is made, and the lock is released (not orphaned) on both sides. It
    # is held for microseconds at a time (a take only swaps under it), so fork() barely waits.
    _LIVE_LOCK.acquire()
    _FORKING[:] = list(_LIVE)
    for writer in _FORKING:
        writer._before_fork()
        writer._acc.lock.acquire()


def _after_fork_in_parent() -> None:
    for writer in _FORKING:
        writer._acc.lock.release()
    _FORKING.clear()
    _LIVE_LOCK.release()


def _after_fork_in_child() -> None:
    for writer in _FORKING:
        writer._acc.lock.release()
    writers, _FORKING[:] = list(_FORKING), []
    _LIVE_LOCK.release()
    for writer in writers:
        try:
            writer._forked()
        except Exception:  # pragma: no cover - a hook must not break the host's fork
            pass


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
    )


# Upper bounds (s) of the flush-duration histogram of every writer's self-metrics.
FLUSH_DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class WriterStats:
    """What a writer has done so far (the source of its self-metrics, stored with every flush)."""

    flushes: int = 0
    duplicates: int = 0
    errors: _Tally[str] = field(default_factory=_Tally)
    # Failed listings of K in shard 0 (shards.lua), by kind: not flush attempts, so kept out of
    # ``errors`` (flush_errors_total); logged, and stored as ``shards_err:<kind>`` with the
    # self-metrics (redis_stats_writer_shards_listing_errors_total), so that a listing that keeps
    # failing (readers that were not given K then miss shards) shows in Prometheus.
    shards_errors: _Tally[str] = field(default_factory=_Tally)
    conflicts: int = 0
    last_success: float = 0.0
    last_duration: float = 0.0
    duration_counts: list[int] = field(default_factory=lambda: [0] * (len(FLUSH_DURATION_BUCKETS) + 1))
    duration_sum: float = 0.0

    def observe_duration(self, seconds: float) -> None:
        """Count one successful flush's duration."""
        self.last_duration = seconds
        self.duration_sum += seconds
        self.duration_counts[bisect_left(FLUSH_DURATION_BUCKETS, seconds)] += 1

    def as_fields(
        self, drops: dict[str, int], pending: int, engines: tuple[int, ...], owner: str
    ) -> list[str]:
        """Field/value pairs for the writer's stats hash (absolute values)."""
        out = [
            "flushes",
            str(self.flushes),
            "duplicates",
            str(self.duplicates),
            "conflicts",
            str(self.conflicts),
            "pending",
            str(pending),
            "dur_sum",
            repr(self.duration_sum),
            "engines",
            ",".join(map(str, engines)),
            "owner",
            owner,
        ]
        for kind, n in self.errors.items():
            out += (f"err:{kind}", str(n))
        for kind, n in self.shards_errors.items():
            out += (f"shards_err:{kind}", str(n))
        for reason, n in drops.items():
            out += (f"drop:{reason}", str(n))
        for bound, n in zip((*FLUSH_DURATION_BUCKETS, math.inf), self.duration_counts):
            out += (f"dur:{'+Inf' if bound == math.inf else repr(bound)}", str(n))
        return out


class CounterSeries(Protocol):
    """A bound counter series (``writer.counter(name).labels(...)``)."""

    def inc(self, amount: float = 1) -> None:
        """Add *amount* (>= 0; anything else is dropped and counted, never raised)."""
        ...


class GaugeSeries(Protocol):
    """A bound gauge series (``writer.gauge(name).labels(...)``)."""

    def set(self, value: float) -> None:
        """Set the value (a non-finite value or a non-number is dropped and counted)."""
        ...

    def inc(self, amount: float = 1) -> None:
        """Add *amount*."""
        ...

    def dec(self, amount: float = 1) -> None:
        """Subtract *amount*."""
        ...


class HistogramSeries(Protocol):
    """A bound histogram series (``writer.histogram(name).labels(...)``)."""

    def observe(self, value: float) -> None:
        """Count one observation."""
        ...


SeriesT = TypeVar("SeriesT")  # CounterSeries, GaugeSeries, HistogramSeries (Any: by name)


class MetricHandle(Generic[SeriesT]):
    """One metric of a writer; :meth:`labels` binds a series for the hot path."""

    __slots__ = ("_writer", "spec")

    def __init__(self, writer: WriterCore, spec: MetricSpec) -> None:
        self._writer = writer
        self.spec = spec

    def labels(self, engine: int = 0, **labels: object) -> SeriesT:
        """The series of *engine* with these label values (a CatalogError if names are wrong).

        Keep the returned child and call ``inc``/``set``/``observe`` on it: that is the cheap path.
        """
        if not isinstance(engine, int) or isinstance(engine, bool) or engine < 0:
            raise CatalogError(f"metric {self.spec.name!r}: engine={engine!r} must be an int >= 0")
        return cast(SeriesT, self._writer.series(self.spec, engine, self.spec.label_values(labels)))

    def inc(self, amount: float = 1, engine: int = 0, **labels: object) -> None:
        """Shortcut for ``labels(engine, **labels).inc(amount)`` (counters and gauges)."""
        child: Any = self.labels(engine, **labels)
        child.inc(amount)

    def set(self, value: float, engine: int = 0, **labels: object) -> None:
        """Shortcut for ``labels(engine, **labels).set(value)`` (gauges)."""
        child: Any = self.labels(engine, **labels)
        child.set(value)

    def observe(self, value: float, engine: int = 0, **labels: object) -> None:
        """Shortcut for ``labels(engine, **labels).observe(value)`` (histograms)."""
        child: Any = self.labels(engine, **labels)
        child.observe(value)


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
        self.catalog = catalog if catalog is not None else Catalog()
        _check_identity("role", role)
        _check_identity("owner", owner)
        if owner and "|" in owner:
            # Stored as "<owner>|<ms>" in the claims hash and joined with "|" in the conflicts hash.
            raise ConfigError(
                f"owner={owner!r} contains '|', which separates owners in Redis; use another character"
            )
        if writer_id is not None:
            _check_identity("writer_id", writer_id)
        self._role = role
        self.owner = owner
        self.writer_id = writer_id or new_writer_id(role)
        self.keys = Keys(self.config.namespace)
        self.engines = _check_engines(engines)
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
        self._protocol = FlushProtocol(self._acc)
        self._closed = False
        # Self-metrics Redis holds for this writer (as far as we know), and those the flush in
        # flight sends: only the ones that changed go with a flush (each field costs Redis time).
        self._stats_stored: dict[str, str] = {}
        self._stats_sent: list[str] = []
        with _LIVE_LOCK:
            _LIVE.add(self)

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
        self.engines = tuple(sorted({*self.engines, *_check_engines(engines)}))
        offset, k = self.config.engine_offset, self.shards
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
        return self._protocol.has_pending()

    def _before_fork(self) -> None:
        """In the parent, just before fork(), before the record lock is taken (no I/O)."""

    def _forked(self) -> None:
        """In a child process after fork(): become a new writer with nothing pending.

        Runs in the at-fork hook (no thread may be started here, no I/O done). The parent's
        pending and in-flight data stay the parent's: the child must not send them again.
        """
        self.writer_id = new_writer_id(self._role)
        self.stats = WriterStats()
        self._stats_stored, self._stats_sent = {}, []
        self._acc.forget_pending(self.writer_id)
        self._protocol = FlushProtocol(self._acc)
        if self.load is not None:
            self.load.forked()

    def lost_summary(self) -> str:
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

    def prepare_flush(self, *, closing: bool = False) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of the next flush of an unsharded namespace: the unconfirmed batch
        again, or a new one (with ``shards`` > 1: :meth:`prepare_flushes`)."""
        calls = self.prepare_flushes(closing=closing)
        if len(calls) != 1 or calls[0][0] != 0:
            raise ValueError(f"{len(calls)} shard calls: use prepare_flushes() with shards={self.shards}")
        return calls[0][1], calls[0][2]

    def prepare_flushes(self, *, closing: bool = False) -> list[tuple[int, list[str], list[str]]]:
        """``(shard, KEYS, ARGV)`` of each script call of the next flush round: one per shard
        this writer writes to (one in all when the namespace is not sharded), each the shard's
        unconfirmed batch again, or a new one."""
        batches = self._protocol.next_batches(self.engines, closing=closing, always=self._always)
        offset, k = self.config.engine_offset, self.shards
        stale_ms = int(self.config.stale_after * 1000)
        calls = []
        for shard, batch in batches.items():
            flow = self._flows[shard]
            # Computed when first used (and cached): with K = 64 the 63 tags cost ~0.3 s of CPU,
            # and a writer of one engine (the vLLM layout) only ever needs one or two.
            keys = flow.keys(self.keys, k)
            claims = (
                [e + offset for e in self.engines if shard_of(e + offset, k) == shard] if self.owner else ()
            )
            args = batch.script_args(
                keys.prefix,
                flow.writer_id,
                owner=self.owner,
                stale_ms=stale_ms,
                claims=claims,
                stats=self._changed_stats() if shard == self.home else (),
                load=self._load_entries(shard, batch.closing),
            )
            calls.append((shard, batch.script_keys(keys, flow.writer_id), args))
        return calls

    def _changed_stats(self) -> list[str]:
        """The self-metrics (field, value pairs) that differ from what Redis holds."""
        fields = self.stats.as_fields(self.drops, self._acc.pending_series(), self.engines, self.owner)
        # Readers judge this writer (and its engines) by its own stale_after (_core/liveness.py).
        fields += (STALE_FIELD, str(int(self.config.stale_after * 1000)))
        stored = self._stats_stored
        changed = [x for k, v in zip(fields[0::2], fields[1::2]) if stored.get(k) != v for x in (k, v)]
        self._stats_sent = changed
        return changed

    def flush_failed(self, exc: BaseException, shard: int = 0) -> None:
        """The flush (of *shard*) did not get an answer: count it; the same batch goes next time."""
        kind = error_kind(exc)
        self.stats.errors[kind] += 1
        # Warn on the first failure of each kind; the rest go to DEBUG (and the counters).
        log_fn = log.warning if self.stats.errors[kind] == 1 else log.debug
        log_fn("flush to %s failed (%s: %s); will retry with the same batch", self.config.safe_url, kind, exc)

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
        self._protocol.confirmed(result, shard)
        if result.load_error:  # the batch was applied; its load entries were refused
            self.load_done(redis.exceptions.ResponseError(result.load_error))
        if result.store_behind:
            self._store_behind(shard)
        if shard == self.home:  # the self-metrics go to the home shard only
            self._stats_answered(result)
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
        log.warning(
            "%s holds less of this writer than it confirmed (restarted empty or from an older "
            "copy, or a replica that had not caught up took over%s): storing its whole state "
            "again with the next flush",
            self.config.safe_url,
            f"; shard {shard}" if self.shards > 1 else "",
        )

    def _stats_answered(self, result: FlushResult) -> None:
        """The home shard answered: what Redis now holds of the self-metrics."""
        if result.writer_removed or result.store_behind:
            self._stats_stored = {}  # a new id, or a store that lost them: all sent again
        elif result.applied:  # applied now: with it the self-metrics it carried
            sent = self._stats_sent
            self._stats_stored.update(zip(sent[0::2], sent[1::2]))

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
        per shard written to, one after the other. Ends with True if Redis confirmed every flush;
        a failure is counted here and that shard's batch goes again next round."""
        if not self.shards_noted:
            try:
                yield ("shards", self.shards_call())
                self.shards_noted = True
            except Exception as exc:  # logged; tried again next round
                self.shards_failed(exc)
        ok = True
        for shard, keys, args in self.prepare_flushes(closing=closing):
            started = time.perf_counter()
            try:
                reply = yield ("flush", (keys, args))
            except Exception as exc:  # never raised into the host
                self.flush_failed(exc, shard)
                ok = False
                continue
            self.flush_succeeded(reply, time.perf_counter() - started, shard)
        return ok

    # -- the load feed (redis_stats/load.py): load.lua beside each flush, and alone --------------

    def _load_entries(self, shard: int, closing: bool) -> list[str]:
        """The load entries (``engine, entry`` pairs) of this writer's engines in *shard*, for
        its flush there (``flush.lua`` stores them with the batch) or alone (``load.lua``). A
        closing flush's name the engines only: the script deletes their entries."""
        if self.load is None:
            return []
        engines = [e for e in self.load.engines() if shard_of(e, self.shards) == shard]
        if closing:
            return [x for e in engines for x in (str(e), "")]
        return self.load.entries(engines, self._acc.server_ms)

    def load_calls(self) -> list[tuple[list[str], list[str]]]:
        """``load.lua``'s calls of the load entries alone (``load_interval``), one per shard."""
        if self.load is None:
            return []
        flows = [self._flows[s] for s in sorted({shard_of(e, self.shards) for e in self.load.engines()})]
        return [
            ([f.keys(self.keys, self.shards).load], [f.writer_id, *self._load_entries(f.index, False)])
            for f in flows
        ]

    def load_done(self, result: Any) -> None:
        """What storing the load entries came to (``load.lua``'s reply, or the error a flush
        reported for them): a failure is counted (``flush_errors_total`` with kind
        ``load_<kind>``) and logged once per kind; never raised (the flush is not affected)."""
        if not isinstance(result, Exception):
            return
        kind = "load_" + error_kind(result)
        self.stats.errors[kind] += 1
        log_fn = log.warning if self.stats.errors[kind] == 1 else log.debug
        log_fn("storing the load entries at %s failed (%s: %s)", self.config.safe_url, kind, result)

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


class _SlicedPacker:
    """Packs a command as hiredis does, a slice of arguments at a time.

    hiredis packs a whole command in one C call that holds the GIL: a flush of 100,000 series
    (400,000 arguments) held it for ~100 ms, and every record call of the host waited that long.
    Between slices other threads run; the bytes on the wire are the same.
    """

    SLICE = 2048  # about 0.5 ms of packing

    def pack(self, *args: Any) -> list[bytes | memoryview]:
        """The RESP encoding of *args*, as a list of chunks to send in order."""
        import hiredis

        # As redis-py's HiredisRespSerializer: "SCRIPT LOAD" is two words, buffers become bytes.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        args = tuple(bytes(a) if isinstance(a, (bytearray, memoryview)) else a for a in args)
        if len(args) <= self.SLICE:
            return [hiredis.pack_command(args)]
        out: list[bytes | memoryview] = [b"*%d\r\n" % len(args)]
        for i in range(0, len(args), self.SLICE):
            part = hiredis.pack_command(args[i : i + self.SLICE])
            out.append(memoryview(part)[part.index(b"\r\n") + 2 :])  # without the slice's own header
            time.sleep(0)  # give the GIL to the host's threads between slices
        return out


def _close_in_multiprocessing_child(writer: StatsWriter) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(writer, writer.close, exitpriority=100)


class StatsWriter(WriterCore):
    """Records stats of one process incarnation and flushes them to Redis from a thread.

    *engines* are heartbeated on every flush (so an idle engine stays up); engines that get data
    are heartbeated too. *owner* names the instance that runs those engines (all API servers of
    one vLLM instance share it): when two live owners claim the same engine, both are warned and
    ``redis_stats_engine_conflict`` shows it. *client* overrides the client built from
    ``config.url`` (tests pass a fakeredis client). With ``start=False`` no thread runs and
    :meth:`flush` is called by hand.

    Fork-safe: after ``os.fork()`` the child is a new writer (see the module docstring).
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
        client: Client | None = None,
        start: bool = True,
        load: LoadMap | None = None,
    ) -> None:
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._closing = threading.Event()  # close() asks the flusher thread for the last flush
        self._closed_done = threading.Event()  # ... which sets this when it has finished
        self._close_ok = False
        self._close_deadline = 0.0
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._mp_hooked = False
        super().__init__(
            config, catalog, engines=engines, writer_id=writer_id, role=role, owner=owner, load=load
        )
        self._own_client = client is None
        self._client: Any = None
        self._script: Any = None
        if client is not None:
            self._use_client(client)
        else:
            self._use_client(make_client(self.config))  # no I/O (a Cluster client is built at first use)
        if start:
            self.start()

    def _use_client(self, client: Any) -> None:
        self._client = client
        self._script = Script(client, load_script("flush"))
        self._shards_script = Script(client, load_script("shards"))
        self._load_script = Script(client, load_script("load"))
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
        if self._own_client and HIREDIS_AVAILABLE and isinstance(kwargs, dict):
            kwargs.setdefault("command_packer", _SlicedPacker())

    def start(self) -> None:
        """Start the flusher thread (idempotent). Needs no Redis connection."""
        with self._start_lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"redis_stats-flusher-{self.writer_id}", daemon=True
            )
            self._thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        interval = self.config.flush_interval
        fast = self.config.load_interval if self.load is not None else 0.0
        due = time.monotonic() + interval
        # With load_interval, the load entries alone between two flushes (load.lua only).
        while not self._stop.wait(min(fast, max(0.0, due - time.monotonic())) if fast else interval):
            if fast and time.monotonic() < due:
                self.flush_load()
                continue
            self.flush()
            due = time.monotonic() + interval
        if self._closing.is_set():
            self._close_ok = self._final_flush(self._close_deadline)
            self._closed_done.set()

    def _before_fork(self) -> None:
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None and not self._mp_hooked and not self._closed:
            # A multiprocessing child ends with os._exit(), which skips atexit. Its bootstrap
            # clears the finalizers it inherited, then runs these after-fork callbacks: register
            # the close there (gunicorn workers exit normally, and atexit closes them).
            self._mp_hooked = True
            mp_util.register_after_fork(self, _close_in_multiprocessing_child)

    def _forked(self) -> None:
        super()._forked()
        # Locks and events may have been held or waited on by threads that do not exist here.
        self._flush_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._closing = threading.Event()
        self._closed_done = threading.Event()
        had_thread, self._thread = self._thread is not None, None
        if self._own_client:
            # The parent's sockets are the parent's: build a new pool on the next flush. (A
            # client passed in is the caller's; redis-py resets its pool itself after fork.)
            self._client = None
        if had_thread and not self._closed:
            # No thread may start in an at-fork hook: the child's first record starts it.
            self._acc.wake = self._wake_after_fork

    def _wake_after_fork(self) -> None:
        """Called once by the first record in a forked child (under the record lock)."""
        self._acc.wake = None
        # Thread.start() waits only for the new thread to begin; it never needs the record lock.
        self.start()

    def flush(self, *, closing: bool = False) -> bool:
        """Send what is pending now, in one script call per shard written to (one in all when
        the namespace is not sharded; one after the other). True if Redis confirmed every one.

        Never raises for a Redis problem: a failure is counted in :attr:`stats` and the same
        batch is sent again next time (to that shard; the others carry on).
        """
        with self._flush_lock:
            if self._client is None:  # first flush in a forked child
                try:
                    self._use_client(make_client(self.config))
                except Exception as exc:  # never raise into the host; nothing was taken yet
                    self.flush_failed(exc)
                    return False
            return run(self.flush_steps(closing=closing), self._carry_out)

    def _carry_out(self, what: str, arg: tuple[list[str], list[str]]) -> Any:
        """One step of :meth:`WriterCore.flush_steps`, blocking."""
        if what == "shards":
            return self._shards_script(*arg)
        return self._call(*arg)

    def _call(self, keys: list[str], args: list[str]) -> Any:
        """One flush: the script, and with ``wait_replicas`` its replication acknowledgement
        (pipelined: the same round trip; on a Cluster right after it)."""
        wanted, timeout = self.config.wait_replicas, self.config.wait_timeout_ms
        if not wanted:
            return self._script(keys=keys, args=args)
        if is_cluster(self._client):  # redis-py pipelines no script on a Cluster
            reply = self._script(keys, args)
            node = self._client.get_node_from_key(keys[0])
            acked = self._client.execute_command("WAIT", wanted, timeout, target_nodes=node)
            return self.script_and_wait(reply, acked)
        for attempt in (1, 2):
            pipe = self._client.pipeline(transaction=False)
            pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", wanted, timeout)
            results = pipe.execute(raise_on_error=False)
            if isinstance(results[0], redis.exceptions.NoScriptError) and attempt == 1:
                self._client.script_load(self._script.source)  # the flush did not run: again
                continue
            break
        return self.script_and_wait(results[0], results[1])

    def flush_load(self) -> None:
        """Store the load entries alone (``load_interval``), once the writer's first flush was
        confirmed (it is in the writers zset then); never raises."""
        with self._flush_lock:
            if self._client is None or not self.stats.flushes:
                return
            for keys, args in self.load_calls():
                try:
                    result = self._load_script(keys, args)
                except Exception as exc:  # counted; the next call or flush tries again
                    result = exc
                self.load_done(result)

    def close(self, timeout: float | None = None) -> bool:
        """Stop the thread and flush what is left, for at most *timeout* seconds (default
        ``config.close_timeout``); runs at interpreter exit too.

        Returns True when everything recorded was confirmed by Redis. The writer is marked
        closed in Redis, so its gauges stop counting as current at once. When Redis does not
        confirm in time, one warning says what was lost, and close returns anyway: a shutdown
        is never held by Redis for much longer than *timeout*. (Without a flusher thread,
        ``start=False``, close makes the attempt itself: one attempt may then last up to
        ``connect_timeout_ms + socket_timeout_ms`` past the deadline.)
        """
        if self._closed:
            return not self.pending()
        budget, deadline = self.close_budget(timeout)
        self._closed = True
        self._close_deadline = deadline
        atexit.unregister(self.close)
        thread = self._thread
        done = self._last_flush(thread, deadline)
        if not done:
            self.warn_lost(budget)
        if done or thread is None or not thread.is_alive():
            self._close_client()
        return done

    def _last_flush(self, thread: threading.Thread | None, deadline: float) -> bool:
        """Stop the flusher *thread* and have the last flush made, by the thread if it runs;
        True if everything was confirmed by *deadline*."""
        if thread is None or not thread.is_alive():
            self._stop.set()
            return self._final_flush(deadline)
        # The flusher thread makes the last flush, and close waits for it only until the
        # deadline: an attempt stuck on a hung socket (up to connect + socket timeout) is
        # left to the daemon thread instead of holding the caller (no new thread is started:
        # Python 3.12 refuses that at interpreter exit).
        self._closing.set()
        self._stop.set()
        return self._closed_done.wait(max(0.0, deadline - time.monotonic())) and self._close_ok

    def _close_client(self) -> None:
        """Close the connection pool (no thread uses it any more); never raises."""
        try:
            if self._client is not None:
                self._client.close()
        except Exception:
            pass

    def _final_flush(self, deadline: float) -> bool:
        """Flush (marking the writer closed) until confirmed or *deadline*; True if confirmed."""
        if self._client is None and not self.pending():
            return True  # a forked child that recorded nothing: nothing of its own to send
        while True:
            done, pause = self.final_flush_step(self.flush(closing=True), deadline)
            if done is not None:
                return done
            time.sleep(pause)

    def __enter__(self) -> StatsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
