"""RedisCollector: a prometheus_client collector that exposes every engine's series from Redis.

    from prometheus_client import REGISTRY
    REGISTRY.register(RedisCollector(StatsReader(config, catalog)))

Each scrape is one read (one round trip). Series carry ``engine="N"`` plus their declared labels;
counters end in ``_total``; histograms have cumulative ``_bucket{le=...}`` with ``+Inf``, ``_sum``
and ``_count``. A Redis error during a scrape yields ``redis_stats_up 0`` and the error counter,
never an exception (and so never an HTTP 500).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import Counter as _Tally
from collections.abc import Iterable, Iterator
from itertools import chain, repeat
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from redis_stats._core.read.values import go_floats
from redis_stats.catalog import COUNTER, ENGINE_LABEL, GAUGE, HISTOGRAM
from redis_stats.connection import tls_mismatch
from redis_stats.errors import error_kind
from redis_stats.ops.memory import store_memory
from redis_stats.outage import Outage, shared
from redis_stats.prometheus.exposition import TextRenderer, format_families, label_pairs
from redis_stats.prometheus.filters import (
    REPLACED,
    REPLACED_HELP,
    cap_families,
    replaced_text,
)
from redis_stats.reader import EngineSlice, StatsReader
from redis_stats.snapshot import Snapshot

__all__ = ["NAMESPACE_LABEL", "ReadErrors", "RedisCollector"]

# The label an exporter of several namespaces puts on every series (not ``namespace``: see
# namespace_info).
NAMESPACE_LABEL = "redis_stats_namespace"

log = logging.getLogger("redis_stats.collector")


class ReadErrors:
    """Reads of Redis that failed, by kind (thread-safe: scrapes run on several threads at once);
    one per collector, or shared by the collectors one view makes per request (an endpoint's)."""

    def __init__(self) -> None:
        self._counts: _Tally[str] = _Tally()
        self._lock = threading.Lock()

    def count(self, exc: BaseException) -> None:
        """Count a failed read."""
        kind = error_kind(exc)
        with self._lock:
            self._counts[kind] += 1

    def counts(self) -> list[tuple[str, int]]:
        """(kind, failed reads) so far, sorted."""
        with self._lock:
            return sorted(self._counts.items())


class RedisCollector:
    """Collects a fresh snapshot on every scrape; register it in any ``CollectorRegistry``.

    *engines* limits the view to those engine indexes (default: all), or to a slice of the
    fleet (an :class:`~redis_stats.reader.EngineSlice`, read by Redis' own choice). With
    ``writers=False`` the writers' self-metrics (``redis_stats_writer_*``, fleet-wide) are left
    out: a sliced scrape other than slice 0 (redis_stats/prometheus/filters.py).

    With ``namespace_label=True`` every series it yields, its own included, carries
    ``redis_stats_namespace="<the reader's namespace>"``: an exporter of several namespaces serves
    them side by side, and two namespaces' series must never be one.

    *renderer*, called with the labels above, makes what :meth:`render_text` turns a read into
    (an object with ``render(decoded) -> str``; default: the plain
    :class:`~redis_stats.prometheus.exposition.TextRenderer`): an endpoint view's
    (redis_stats/server/states/endpoints.py). *errors* counts its failed reads (shared by
    collectors made per request).
    """

    def __init__(
        self,
        reader: StatsReader,
        *,
        engines: Iterable[int] | EngineSlice | None = None,
        writers: bool = True,
        namespace_label: bool = False,
        renderer: Any = None,
        errors: ReadErrors | None = None,
    ) -> None:
        self.reader = reader
        self.engines = engines if engines is None or isinstance(engines, EngineSlice) else tuple(engines)
        self.writers = writers
        self._tls: str | None = None  # a TLS mismatch found after a failed read ("" none)
        self.labels = {NAMESPACE_LABEL: reader.config.namespace} if namespace_label else {}
        self.errors = errors if errors is not None else ReadErrors()
        # renderer(labels): another text of the same read (an endpoint view's), else the plain one
        self._renderer = TextRenderer(self.labels) if renderer is None else renderer(self.labels)

    def describe(self) -> list[Metric]:
        """Nothing: registering must not read Redis (names are only known from a snapshot)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """One snapshot, rendered as metric families, then the collector's own metrics."""
        started = time.perf_counter()
        snapshot: Snapshot | None = None
        try:
            snapshot = self.reader.snapshot(self.engines)
            self.read_ok()
        except Exception as exc:  # a scrape must not fail with a traceback
            self.read_failed(exc)
        made = list(families(snapshot)) if snapshot is not None else []  # capped by the decoder
        own = list(self._self_metrics(snapshot, time.perf_counter() - started))
        replaced = cap_families(own, self.reader.config.max_label_length)
        replaced += snapshot.labels_replaced if snapshot is not None else 0
        replaced_family = GaugeMetricFamily(REPLACED, REPLACED_HELP)
        replaced_family.add_metric([], float(replaced))
        for family in (*made, *own, replaced_family):
            yield with_labels(family, self.labels) if self.labels else family

    def render_text(self) -> str:
        """The same exposition as :meth:`collect` through ``generate_latest``, several times faster:
        the read's decoded form goes straight to text
        (:class:`~redis_stats.prometheus.exposition.TextRenderer`)."""
        started = time.perf_counter()
        shell: Snapshot | None = None
        text = ""
        gc_was_on = gc.isenabled()
        gc.disable()  # tens of thousands of short-lived strings: a collection mid-render only costs
        try:
            try:
                decoded = self.reader.decoded(self.reader.read(self.engines))
            except Exception as exc:  # Redis (or its data): a scrape says so, never a traceback
                self.read_failed(exc)
            else:
                self.read_ok()
                # Outside the read's except: an error rendering what was read is a bug of ours,
                # raised (a 500 and its traceback in the log), never called a failed read of Redis.
                text, shell = self._renderer.render(decoded), decoded.shell
        finally:
            if gc_was_on:
                gc.enable()
        own = list(self._self_metrics(shell, time.perf_counter() - started, engines=False))
        # A label value past max_label_length (stored by a writer configured otherwise, or
        # garbage) is replaced and counted, as collect() does: the series' by the decoder, the
        # self-metrics' here (redis_stats/prometheus/filters.py).
        replaced = cap_families(own, self.reader.config.max_label_length)
        replaced += shell.labels_replaced if shell is not None else 0
        engines = engine_lines(shell, self.labels) if shell is not None else ""
        labels = self.labels
        return "".join((text, engines, format_families(own, labels), replaced_text(replaced, labels)))

    def read_failed(self, exc: BaseException) -> None:
        """Count a failed read; the first of an outage of this reader's reads is logged (a
        warning), and its end with the first read that works again (``read_ok``)."""
        self.errors.count(exc)
        kind = error_kind(exc)
        self._outage().failed(kind, str(exc) + self._tls_mismatch(kind))

    def _tls_mismatch(self, kind: str) -> str:
        """``: <why>`` when the server speaks the other protocol than the URL (a ``rediss://`` read
        of a plain server times out, a plain one of a TLS server is cut): asked once."""
        if kind not in ("timeout", "connection"):
            return ""
        if self._tls is None:
            self._tls = tls_mismatch(self.reader.config) or ""
        return f" ({self._tls})" if self._tls else ""

    def read_ok(self) -> None:
        """A read worked: ends the outage of this reader's reads, if one was going on."""
        self._outage().succeeded("scrapes served redis_stats_up 0 meanwhile")

    def _outage(self) -> Outage:
        config = self.reader.config
        return shared(
            self.reader,
            "reads",
            lambda: Outage(
                f"reads of namespace {config.namespace!r} from {config.safe_url}",
                log,
                retry="tried again at each scrape (redis_stats_up 0 until then)",
            ),
        )

    def _self_metrics(
        self, snapshot: Snapshot | None, duration: float, *, engines: bool = True
    ) -> Iterator[Metric]:
        up = GaugeMetricFamily("redis_stats_up", "1 if the last read of Redis succeeded, else 0.")
        up.add_metric([], 1.0 if snapshot is not None else 0.0)
        yield up
        yield namespace_info(self.reader.config.namespace)
        errors = CounterMetricFamily(
            "redis_stats_read_errors", "Reads of Redis that failed, by kind.", labels=["kind"]
        )
        counts = self.errors.counts()
        for kind, n in counts:
            errors.add_metric([kind], n)
        yield errors
        took = GaugeMetricFamily(
            "redis_stats_read_duration_seconds", "Time taken by the last read and decode."
        )
        took.add_metric([], duration)
        yield took
        if snapshot is None:
            return
        for name, help_text, value in ENGINE_SELF_METRICS if engines else ():
            fam = GaugeMetricFamily(name, help_text, labels=[ENGINE_LABEL])
            for e in sorted(snapshot.engines.values(), key=lambda e: e.engine):
                fam.add_metric([str(e.engine)], value(e))
            yield fam
        if self.writers:
            yield namespace_empty(snapshot)
            yield from writer_families(snapshot)
            yield from store_memory(self.reader).families()  # fleet-wide, as the writers' ones
        yield from endpoint_families(snapshot)
        skipped = GaugeMetricFamily(
            "redis_stats_skipped_fields",
            "Fields of the last read that could not be decoded and were skipped, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(snapshot.skipped.items()):
            skipped.add_metric([reason], n)
        yield skipped


# Per-engine self-metrics: (name, help, value of an EngineSnapshot). One table for both the
# prometheus_client families and the fast text path (``engine_lines``).
ENGINE_SELF_METRICS = (
    (
        "redis_stats_engine_up",
        "1 if the engine heartbeated within stale_after, else 0.",
        lambda e: 1.0 if e.up else 0.0,
    ),
    ("redis_stats_engine_data_age_seconds", "Seconds since the engine's last heartbeat.", lambda e: e.age),
    (
        "redis_stats_engine_closed",
        "1 if the engine is down because every writer of it closed cleanly (stopped on purpose), else 0.",
        lambda e: 1.0 if e.closed else 0.0,
    ),
    (
        "redis_stats_engine_conflict",
        "1 if two live instances (owners) claimed this engine within stale_after, else 0.",
        lambda e: 1.0 if e.conflict else 0.0,
    ),
)


_NEWLINES = repeat("\n")


def engine_lines(snapshot: Snapshot, labels: dict[str, str] | None = None) -> str:
    """:data:`ENGINE_SELF_METRICS` as text, without building a sample object per engine; *labels*
    first on every line."""
    indexes = sorted(snapshot.engines)
    engines = [*map(snapshot.engines.__getitem__, indexes)]
    leading = label_pairs(labels) + "," if labels else ""
    labels_text = ["{" + leading + 'engine="' + str(e) + '"} ' for e in indexes]
    out = []
    for name, help_text, value in ENGINE_SELF_METRICS:
        out.append("# HELP " + name + " " + help_text + "\n# TYPE " + name + " gauge\n")
        texts = go_floats([*map(value, engines)])
        out += chain.from_iterable(zip(map(name.__add__, labels_text), texts, _NEWLINES))
    return "".join(out)


def with_labels(family: Metric, labels: dict[str, str]) -> Metric:
    """*family* with *labels* added to each of its samples (a sample's own label of the same name
    wins: ``redis_stats_namespace_info`` names its namespace itself)."""
    family.samples = [s._replace(labels={**labels, **s.labels}) for s in family.samples]
    return family


def namespace_info(namespace: str) -> Metric:
    """``redis_stats_namespace_info{redis_stats_namespace="NS"} 1``: which namespace this view
    serves, for dashboards to select by (joined ``on (job, instance)``). Not a ``namespace`` label:
    the Prometheus Operator gives every target its Kubernetes namespace under that name, and
    would rename this one to ``exported_namespace``. Known without a read: served while Redis is
    down too."""
    info = GaugeMetricFamily(
        "redis_stats_namespace_info",
        "The redis_stats namespace this view serves (always 1).",
        labels=[NAMESPACE_LABEL],
    )
    info.add_metric([namespace], 1.0)
    return info


def endpoint_families(snapshot: Snapshot) -> Iterator[Metric]:
    """``redis_stats_endpoint_engines_up{endpoint}``: how many engines of this view behind each
    endpoint are up, 0 when none is (the endpoint serves nothing a router can use). An endpoint
    whose every engine closed cleanly is not listed: it was stopped on purpose. A sliced view
    counts its own engines, so the slices' values add up to the endpoint's (``sum without
    (slice)``). Nothing when no engine has an endpoint."""
    ups: dict[str, float] = {}
    for e in snapshot.engines.values():
        if e.endpoint is not None and not e.closed:
            ups[e.endpoint] = ups.get(e.endpoint, 0.0) + (1.0 if e.up else 0.0)
    if ups:
        family = GaugeMetricFamily(
            "redis_stats_endpoint_engines_up",
            "Engines of this view behind the endpoint that are up (0: none); an endpoint whose "
            "engines all closed cleanly is not listed.",
            labels=["endpoint"],
        )
        for endpoint, n in sorted(ups.items()):
            family.add_metric([endpoint], n)
        yield family


def namespace_empty(snapshot: Snapshot) -> Metric:
    """``redis_stats_namespace_empty``: 1 when the namespace holds no engine and no writer."""
    empty = GaugeMetricFamily(
        "redis_stats_namespace_empty",
        "1 when the namespace read holds no engine and no writer (nothing has written there: a "
        "misspelt namespace, or a fleet gone for longer than the retention), else 0.",
    )
    empty.add_metric([], 0.0 if snapshot.engines or snapshot.writers else 1.0)
    return empty


WRITER_STATES = ("live", "stale", "closed")

# A writer's counts by kind: (its fields' prefix, family, help, the kind's label).
_BY_KIND = (
    (
        "err:",
        "redis_stats_writer_flush_errors",
        "Failed flush attempts, by kind (reported after Redis answers again).",
        "kind",
    ),
    (
        "shards_err:",
        "redis_stats_writer_shards_listing_errors",
        "Failed listings of a sharded writer's K in shard 0's catalogue (shards.lua), by kind.",
        "kind",
    ),
    ("drop:", "redis_stats_writer_dropped_updates", "Updates dropped on the hot path, by reason.", "reason"),
    (
        "lost:",
        "redis_stats_writer_keys_lost",
        "Keys of the writer a flush found gone (evicted under maxmemory, or deleted), by kind.",
        "key",
    ),
)


def writer_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The live writers' self-metrics, as stored with their last flush (``WriterStats.as_fields``),
    and how many writers the namespace lists in each state.

    A writer that closed or stopped heartbeating (stale) leaves these series at once: each
    process start is a new writer id, and its series would otherwise stay until gc removes the
    writer (the retention, 24 h by default), one set per restart.
    ``redis_stats_writers{state}`` counts the departed ones (3 series, whatever the restarts).
    """
    yield _writer_states(snapshot)
    w = ["writer"]
    up = GaugeMetricFamily(
        "redis_stats_writer_up",
        "1 for each live writer (heartbeat within stale_after); a departed one leaves the view.",
        labels=w,
    )
    flushes = CounterMetricFamily("redis_stats_writer_flushes", "Flushes confirmed by Redis.", labels=w)
    lane = CounterMetricFamily(
        "redis_stats_writer_load_lane_calls",
        "Calls of the load lane (one HSET each, failed ones included): what its errors (flush "
        "errors of kind load_*) are a share of.",
        labels=w,
    )
    # counts a writer stores by kind, as fields "<prefix><kind>" (WriterStats.as_fields)
    by_kind = {
        prefix: CounterMetricFamily(name, help_text, labels=[*w, label])
        for prefix, name, help_text, label in _BY_KIND
    }
    conflicts = CounterMetricFamily(
        "redis_stats_writer_conflicts",
        "Engines a claiming flush found claimed by another live owner.",
        labels=w,
    )
    pending = GaugeMetricFamily(
        "redis_stats_writer_pending_series", "Series changed but not yet sent, at the last flush.", labels=w
    )
    age = GaugeMetricFamily(
        "redis_stats_writer_last_flush_age_seconds",
        "Seconds since the writer's last successful flush.",
        labels=w,
    )
    duration = HistogramMetricFamily(
        "redis_stats_writer_flush_duration_seconds",
        "Duration of successful flushes (one script call).",
        labels=w,
    )
    now_ms = snapshot.time * 1000.0
    for wid, info in sorted(snapshot.writers.items()):
        if not info.live:
            continue  # departed: counted in redis_stats_writers{state} only
        up.add_metric([wid], 1.0)
        st = info.stats
        if not st:
            continue
        flushes.add_metric([wid], _num(st, "flushes"))
        if "lane" in st:  # a writer of an older release stores none
            lane.add_metric([wid], _num(st, "lane"))
        conflicts.add_metric([wid], _num(st, "conflicts"))
        pending.add_metric([wid], _num(st, "pending"))
        # The writer's heartbeat is set by its last successful flush.
        age.add_metric([wid], max(0.0, (now_ms - info.heartbeat * 1000.0) / 1000.0))
        buckets = _duration_buckets(st)
        if buckets:
            duration.add_metric([wid], buckets, _num(st, "dur_sum"))
        for key in st:
            prefix = key[: key.find(":") + 1]
            if prefix in by_kind:
                by_kind[prefix].add_metric([wid, key[len(prefix) :]], _num(st, key))
    yield from (up, flushes, lane, *by_kind.values(), conflicts, pending, age, duration)


def _writer_states(snapshot: Snapshot) -> Metric:
    """``redis_stats_writers{state}``: how many writers the namespace lists in each state."""
    states = GaugeMetricFamily(
        "redis_stats_writers",
        "Writers the namespace lists, by state: live, stale (no heartbeat within stale_after, "
        "not closed) or closed; until gc removes them.",
        labels=["state"],
    )
    tally: _Tally[str] = _Tally()
    for i in snapshot.writers.values():
        tally["closed" if i.closed else "live" if i.live else "stale"] += 1
    for state in WRITER_STATES:
        states.add_metric([state], float(tally[state]))
    return states


def _duration_buckets(stats: dict[str, str]) -> list[tuple[str, float]]:
    """A writer's flush durations (``dur:<bound>`` fields, per bucket) as cumulative buckets."""
    bounds = []
    for key in stats:
        if key.startswith("dur:"):
            bounds.append((float(key[4:]), key))  # (the decoder took only numbers as bounds)
    bounds.sort()
    buckets, running = [], 0.0
    for bound, key in bounds:
        running += _num(stats, key)
        buckets.append((floatToGoString(bound), running))
    return buckets


def _num(stats: dict[str, str], key: str) -> float:
    """A number of a writer's stats hash (0 when absent or not a number)."""
    try:
        return float(stats.get(key, 0))
    except ValueError:
        return 0.0


def families(snapshot: Snapshot) -> Iterator[Metric]:
    """The snapshot's series as prometheus_client metric families, one per catalogue metric."""
    # Any: the three family classes take different add_metric arguments.
    made: dict[str, Any] = {}
    for spec in snapshot.catalog:
        labels = [ENGINE_LABEL, *spec.labels]
        kind = {COUNTER: CounterMetricFamily, GAUGE: GaugeMetricFamily, HISTOGRAM: HistogramMetricFamily}
        made[spec.name] = kind[spec.kind](spec.name, spec.help, labels=labels)
    for e in sorted(snapshot.engines.values(), key=lambda e: e.engine):
        engine = str(e.engine)
        for (name, values), v in e.counters.items():
            made[name].add_metric([engine, *values], v)
        for (name, values), v in e.gauges.items():
            made[name].add_metric([engine, *values], v)
        for (name, values), h in e.histograms.items():
            buckets = [(floatToGoString(b), c) for b, c in zip(h.bounds, h.cumulative)]
            made[name].add_metric([engine, *values], buckets, h.sum)
    yield from made.values()
