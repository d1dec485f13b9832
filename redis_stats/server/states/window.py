"""Recent load: rates and quantiles over a window, and fleet totals, from two snapshots.

Routers and autoscalers need what an engine does *now*, not totals since it started. A
:class:`SnapshotRing` keeps the snapshots an exporter took in the last few windows (bounded, thread
safe: the exporter serves requests on threads), and :func:`recent_document` turns the newest and
the oldest one within the window into the ``window`` and ``fleet`` blocks of ``/snapshot``.

Fleet totals are generic over the catalogue (every counter's summed rate, every gauge's sum, mean
and max over live engines). A :data:`~redis_stats.server.options.FleetSummary` names a few of them
for a product (the vLLM integration injects ``running``, ``waiting``, mean KV usage and token
throughput); this module knows no product's metric names.
"""

from __future__ import annotations

import logging
import math
import threading
from array import array
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

from redis_stats._core.read.values import float_mean, float_sum
from redis_stats.catalog import COUNTER, GAUGE
from redis_stats.server.options import WINDOW_BUDGET, FleetSummary
from redis_stats.snapshot import EngineSnapshot, HistogramValue, Snapshot, json_number

__all__ = [
    "SCHEMA_VERSION",
    "SnapshotRing",
    "increase",
    "recent_document",
    "since",
    "snapshot_document",
    "window_copy",
]

log = logging.getLogger("redis_stats.exporter")

#: The ``schema_version`` of the ``/snapshot`` document (docs/snapshot.md, "Stability"). Version 1
#: (documents without the key) listed each engine's series as ``[{"name", "labels", ...}]``; version
#: 2 keys them by metric name, so a reader changing shape breaks no version-1 client silently.
SCHEMA_VERSION = 2

# Quantiles reported for windowed histograms (as the since-start ones of Snapshot.to_dict).
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


# What a kept snapshot costs in memory (CPython 3.11, 64-bit), by part: per engine (its objects and
# dicts), per counter (a dict slot and its float; the series' key is shared with the reader's
# plan), per histogram (its HistogramValue, dict slot and array) and per bucket (8 bytes in the
# array). Measured with tracemalloc (tests/server/test_snapshot_window.py keeps them honest).
ENGINE_BYTES = 600
COUNTER_BYTES = 60
HISTOGRAM_BYTES = 200
BUCKET_BYTES = 8


def window_copy(snap: Snapshot) -> tuple[Snapshot, int]:
    """What the window keeps of *snap*, and an estimate of the bytes it holds.

    Only the counters and histograms (the window's rates and quantiles subtract them; the
    gauges are always the newest snapshot's), and each histogram's cumulative counts in an array
    of doubles: 8 bytes a bucket instead of 32 for a tuple of floats, which is most of a decoded
    snapshot at a thousand engines. The counters' dict is *snap*'s own (nothing mutates a decoded
    snapshot). The estimate counts the parts (:data:`ENGINE_BYTES`, ...): no walk of the objects.
    """
    engines: dict[int, EngineSnapshot] = {}
    size = 0
    for e in snap.engines.values():
        histograms = {
            key: HistogramValue(h.bounds, _doubles(h.cumulative), h.sum) for key, h in e.histograms.items()
        }
        engines[e.engine] = EngineSnapshot(
            e.engine, e.heartbeat, e.age, e.up, counters=e.counters, histograms=histograms
        )
        buckets = sum(len(h.cumulative) for h in histograms.values())
        size += ENGINE_BYTES + COUNTER_BYTES * len(e.counters) + HISTOGRAM_BYTES * len(histograms)
        size += BUCKET_BYTES * buckets
    return Snapshot(time=snap.time, engines=engines, writers={}, catalog=snap.catalog), size


def _doubles(values: tuple[float, ...]) -> tuple[float, ...]:
    # An array reads like the tuple it replaces (by index, len, iteration: all HistogramValue does
    # with its counts), at a quarter of the memory; typed as the tuple for HistogramValue's sake.
    return array("d", values)  # type: ignore[return-value]


class SnapshotRing:
    """The snapshots of the last *keep* seconds, oldest first, in at most *max_bytes*; thread safe.

    What it keeps of each is :func:`window_copy`'s (the counters and histograms, compactly), at
    most one every *spacing* seconds: a window needs one snapshot about a window old, not every
    request's (the live page polls every 2 s). Past *max_bytes* (estimated) the oldest go first,
    and the window reported is the span that fits (``window.seconds`` says it). A snapshot larger
    than the whole budget is not kept: no window at all, said once in the log.
    """

    def __init__(self, keep: float, *, max_bytes: int = WINDOW_BUDGET, spacing: float = 0.0) -> None:
        if not keep > 0:
            raise ValueError(f"keep={keep!r} must be a positive number of seconds")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes!r} must be a whole number of bytes >= 0")
        self.keep = keep
        self.max_bytes = max_bytes
        self.spacing = spacing
        self._ring: deque[tuple[Snapshot, int]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._warned = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._ring)

    @property
    def bytes(self) -> int:
        """The estimated bytes of what is kept."""
        with self._lock:
            return self._bytes

    def add(self, snap: Snapshot) -> None:
        """Keep (what the window needs of) *snap*; drop what is older than *keep* seconds before
        it (server clock) and, oldest first, what does not fit in *max_bytes*."""
        with self._lock:
            newest = self._ring[-1][0].time if self._ring else -math.inf
            if snap.time < newest or snap.time - newest < self.spacing:
                return  # an older read finishing late (another thread), or one too soon
        copy, size = window_copy(snap)  # outside the lock: a few ms at a thousand engines
        with self._lock:
            if self._ring and copy.time < self._ring[-1][0].time:
                return  # the ring stays in order
            if size > self.max_bytes:
                self._too_big(size)
                return
            self._ring.append((copy, size))
            self._bytes += size
            while self._ring and (
                self._ring[0][0].time < copy.time - self.keep or self._bytes > self.max_bytes
            ):
                self._bytes -= self._ring.popleft()[1]

    def _too_big(self, size: int) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "/snapshot's window keeps no snapshot: one of this fleet takes about %.0f MB, more than "
                "the window's budget of %.0f MB, so no rates or windowed quantiles are reported; raise "
                "--window-budget (docs/sizing.md)",
                size / 2**20,
                self.max_bytes / 2**20,
            )

    def oldest(self) -> float | None:
        """The time of the oldest kept snapshot (None: none kept)."""
        with self._lock:
            return self._ring[0][0].time if self._ring else None

    def baseline(self, now: Snapshot, window: float, min_span: float = 0.0) -> Snapshot | None:
        """The oldest kept snapshot at most *window* and at least *min_span* seconds before *now*.

        *min_span* keeps rates over a few milliseconds (two requests in a row) from being reported
        as the current load: such a window is noise, not a measurement.
        """
        with self._lock:
            for snap, _size in self._ring:
                if now.time - window <= snap.time <= now.time - min_span and snap.time < now.time:
                    return snap
        return None


def increase(now: float, before: float) -> float:
    """A counter's increase from *before* to *now*: from 0 when it went down (Redis lost its data,
    an engine restarted), as Prometheus' ``rate()`` treats a reset."""
    return now - before if now >= before else now


def recent_document(
    now: Snapshot,
    earlier: Snapshot | None,
    *,
    requested: float,
    summary: FleetSummary | None = None,
    names: Collection[str] | None = None,
) -> dict[str, Any]:
    """The ``window`` and ``fleet`` blocks of ``/snapshot`` (see docs/snapshot.md).

    Without an *earlier* snapshot there is no window: ``window.seconds`` is None, every rate and
    windowed quantile is absent, and fleet rates are None (gauges are still summed). An engine
    *earlier* does not hold is not measured (its ``seconds`` None, no rates): new, or back after
    Redis lost its keys, its totals are not its increase over the window (they were counted as
    such: a Redis restarted empty showed 17 times the fleet's throughput for a window). Fleet
    rates are None too when no engine was measured. With *names* only those metrics' series and
    fleet totals are written (``fleet.summary`` stays whole).
    """
    seconds = now.time - earlier.time if earlier is not None else None
    keep = None if names is None else set(names)
    # The summary's metrics are computed even when not written: their figures need them.
    wanted = None if keep is None else keep | {metric for _kind, metric in (summary or {}).values()}
    rate_sums: dict[str, float] = {}
    engines = _window_engines(now, earlier, seconds, wanted, keep, rate_sums)
    # An empty namespace has a throughput (0); engines none of which were measured, none yet.
    measured = any(block["seconds"] is not None for block in engines.values())
    rated = seconds if measured or not now.engines else None
    return {
        "window": {"requested_seconds": requested, "seconds": seconds, "engines": engines},
        "fleet": _fleet_block(now, rate_sums, rated, summary, wanted, keep),
    }


def _window_engines(
    now: Snapshot,
    earlier: Snapshot | None,
    seconds: float | None,
    wanted: set[str] | None,
    keep: set[str] | None,
    rate_sums: dict[str, float],
) -> dict[str, dict[str, Any]]:
    """Every engine's ``window`` block; its rates added to *rate_sums*. An engine *earlier* lacks
    is not measured: its ``seconds`` None, no rates."""
    engines: dict[str, dict[str, Any]] = {}
    for e in sorted(now.engines.values(), key=lambda e: e.engine):
        block: dict[str, Any] = {"seconds": None, "rates": {}, "histograms": {}}
        before = earlier.engines.get(e.engine) if seconds and earlier is not None else None
        if seconds and before is not None:
            block["seconds"] = seconds
            block["rates"] = _window_rates(now, e, before, seconds, wanted, keep, rate_sums)
            block["histograms"] = _window_histograms(now, e, before, seconds, keep)
        engines[str(e.engine)] = block
    return engines


def _window_rates(
    now: Snapshot,
    engine: EngineSnapshot,
    before: EngineSnapshot,
    seconds: float,
    wanted: set[str] | None,
    keep: set[str] | None,
    rate_sums: dict[str, float],
) -> dict[str, list[dict[str, Any]]]:
    """One engine's counter rates over the window, by metric name; adds them to *rate_sums*.

    A *wanted* metric not in *keep* is summed (a fleet summary figure needs it) but not written.
    """
    rates: dict[str, list[dict[str, Any]]] = {}
    for (name, values), v in sorted(engine.counters.items()):
        if wanted is not None and name not in wanted:
            continue
        rate = increase(v, before.counters.get((name, values), 0.0)) / seconds
        rate_sums[name] = rate_sums.get(name, 0.0) + rate
        if keep is not None and name not in keep:
            continue
        labels = _labels(now, name, values)
        rates.setdefault(name, []).append({"labels": labels, "per_second": json_number(rate, nan=None)})
    return rates


def _window_histograms(
    now: Snapshot,
    engine: EngineSnapshot,
    before: EngineSnapshot,
    seconds: float,
    keep: set[str] | None,
) -> dict[str, list[dict[str, Any]]]:
    """One engine's histograms over the window (count, rate, mean, quantiles), by metric name."""
    histograms: dict[str, list[dict[str, Any]]] = {}
    for (name, values), h in sorted(engine.histograms.items()):
        if keep is not None and name not in keep:
            continue
        recent = since(h, before.histograms.get((name, values)))
        item: dict[str, Any] = {
            "labels": _labels(now, name, values),
            "count": json_number(recent.count, nan=None),
            "per_second": json_number(recent.count / seconds, nan=None),
            "mean": json_number(recent.sum / recent.count, nan=None) if recent.count > 0 else None,
        }
        for key, q in QUANTILES:
            item[key] = json_number(recent.quantile(q), nan=None)
        histograms.setdefault(name, []).append(item)
    return histograms


def _fleet_block(
    now: Snapshot,
    rate_sums: dict[str, float],
    seconds: float | None,
    summary: FleetSummary | None,
    wanted: set[str] | None,
    keep: set[str] | None,
) -> dict[str, Any]:
    """The ``fleet`` block: engine counts, summed rates, gauge totals and the summary figures."""
    gauges = _gauge_totals(now)
    fleet: dict[str, Any] = {
        "engines": len(now.engines),
        "engines_up": sum(1 for e in now.engines.values() if e.up),
        "rates": _fleet_rates(now, rate_sums, bool(seconds), wanted),
        "gauges": gauges,
    }
    # Always present (empty without an integration's figures): ``jq '.fleet.summary'`` never
    # prints null, so a client can tell "no figures configured" from "an older document".
    fleet["summary"] = {
        label: _summary_value(kind, metric, fleet, bool(seconds))
        for label, (kind, metric) in (summary or {}).items()
    }
    if keep is not None:
        fleet["rates"] = _only(fleet["rates"], keep)
        fleet["gauges"] = _only(gauges, keep)
    return fleet


def _fleet_rates(
    now: Snapshot, rate_sums: dict[str, float], have_window: bool, wanted: set[str] | None
) -> dict[str, float | str | None]:
    """Every (wanted) counter's rate summed over engines; None for each without a window."""
    return {
        spec.name: (json_number(rate_sums.get(spec.name, 0.0), nan=None) if have_window else None)
        for spec in now.catalog
        if spec.kind == COUNTER and (wanted is None or spec.name in wanted)
    }


def _only(mapping: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k in keep}


def since(now: HistogramValue, before: HistogramValue | None) -> HistogramValue:
    """Observations since *before*; all of *now* after a reset (fewer observations than before)."""
    if before is None or before.bounds != now.bounds or before.count > now.count:
        return now
    return now.minus(before)


def _labels(snap: Snapshot, name: str, values: tuple[str, ...]) -> dict[str, str]:
    spec = snap.catalog.get(name)
    return dict(zip(spec.labels, values)) if spec else {}


def _gauge_totals(snap: Snapshot) -> dict[str, dict[str, Any]]:
    """Per gauge metric: sum, mean and max over live engines (each engine's series summed first)."""
    per_engine: dict[str, list[float]] = {}
    for e in snap.engines.values():
        if not e.up:
            continue
        sums: dict[str, float] = {}
        for (name, _values), v in e.gauges.items():
            sums[name] = sums.get(name, 0.0) + v
        for name, v in sums.items():
            per_engine.setdefault(name, []).append(v)
    out: dict[str, dict[str, Any]] = {}
    for spec in snap.catalog:
        if spec.kind != GAUGE:
            continue
        values = per_engine.get(spec.name, [])
        total = float_sum(values)  # +inf past the float range, NaN (null) for inf and -inf
        out[spec.name] = {
            "engines": len(values),
            "sum": json_number(total, nan=None) if values else None,
            "mean": json_number(float_mean(values, total), nan=None)
            if values
            else None,  # finite for finite values
            "max": json_number(max(values), nan=None) if values else None,
        }
    return out


def _summary_value(kind: str, metric: str, fleet: dict[str, Any], have_window: bool) -> Any:
    if kind == "rate":
        return fleet["rates"].get(metric) if have_window else None
    gauge = fleet["gauges"].get(metric)
    return gauge.get(kind) if gauge else None


def _keyed(
    snap: Snapshot,
    series: Mapping[tuple[str, tuple[str, ...]], Any],
    keep: set[str] | None,
    buckets: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """``{metric name: [{"labels", "value"}, ...]}``: one engine's series, by metric name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for (name, values), v in sorted(series.items()):
        if keep is not None and name not in keep:
            continue
        value: dict[str, Any] | float | str
        if isinstance(v, HistogramValue):
            value = v.to_dict()
            if not buckets:
                del value["buckets"]
        else:
            value = json_number(v)
        out.setdefault(name, []).append({"labels": _labels(snap, name, values), "value": value})
    return out


def snapshot_document(
    now: Snapshot,
    earlier: Snapshot | None,
    *,
    requested: float,
    summary: FleetSummary | None = None,
    source: Mapping[str, Any] | None = None,
    names: Collection[str] | None = None,
    buckets: bool = True,
) -> dict[str, Any]:
    """The whole ``/snapshot`` document (and ``redis-stats inspect --json``): the snapshot since start,
    then its ``window`` and ``fleet`` blocks. Valid against ``schemas/snapshot.schema.json``.

    Every series is keyed by metric name (``engines["3"]["gauges"]["running"]``
    is that engine's list of label sets), in the since-start and the window blocks alike.
    *source* (namespace, Redis address: nothing secret) is written as ``source`` when given.
    With *names* (``/snapshot?name[]=...``) only those metrics' series are written, which at a
    thousand engines is what makes the document small and quick enough for the live page. Without
    *buckets* (``?buckets=0``) the since-start histograms keep ``sum``, ``count`` and quantiles
    but not their cumulative buckets (most of the document, for a client that only reads figures).
    """
    keep = None if names is None else set(names)
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "time": json_number(now.time)}
    if source is not None:
        doc["source"] = dict(source)
    doc["engines"] = {
        str(e.engine): {
            "up": e.up,
            "state": e.state or ("up" if e.up else "down"),
            "endpoint": e.endpoint,
            "writers": list(e.writers),
            "age_seconds": json_number(e.age),
            "counters": _keyed(now, e.counters, keep),
            "gauges": _keyed(now, e.gauges, keep),
            "histograms": _keyed(now, e.histograms, keep, buckets),
        }
        for e in sorted(now.engines.values(), key=lambda e: e.engine)
    }
    doc["writers"] = {
        w: {"age_seconds": json_number(i.age), "closed": i.closed, "live": i.live}
        for w, i in now.writers.items()
    }
    doc["skipped"] = dict(now.skipped)
    doc.update(recent_document(now, earlier, requested=requested, summary=summary, names=keep))
    return doc
