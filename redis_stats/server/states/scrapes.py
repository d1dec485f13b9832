"""What ``/metrics`` keeps between scrapes: the slices' readers and renderers, and its own figures.

- :class:`SliceReaders`: what every ``?slice=`` of one namespace shares (two readers, a plan per
  slice each), and per slice asked its renderer (:class:`SliceText`, kept by the server: bounded
  in bytes, dropped when idle; of :data:`KEPT_SLICES` slices at most);
- :class:`ScrapeStats`: the duration and size of the answers, and :class:`Clashes`: the families
  left out of a namespace on the whole ``/metrics`` of several, as the exporter's own metrics.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from redis_stats._core.read.slices import EngineSlice
from redis_stats.prometheus.collector import ReadErrors, RedisCollector
from redis_stats.prometheus.exposition import TextRenderer
from redis_stats.reader import SNAPSHOT_LEAN
from redis_stats.server.source import Source

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["KEPT_SLICES", "SCRAPE_BUCKETS", "Clashes", "ScrapeStats", "SliceReaders", "SliceText"]

log = logging.getLogger("redis_stats.exporter")

# Buckets of redis_stats_exporter_scrape_duration_seconds: a scrape takes milliseconds for a few
# engines and up to seconds for a thousand on a loaded host.
SCRAPE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# What one slice's kept renderer holds: its catalogue's headers, and per character of its last
# text the text around the numbers (its heads and text plan) measured with tracemalloc
# (tests/server/test_kept_views.py and test_attack_memory.py keep the estimate honest).
SLICE_BYTES = 16 * 1024

KEPT_SLICES = 16
"""Slices of a namespace whose renderers are kept at most (a sliced layout scrapes 4 or 8); the
renderer of any other is made for its request alone. A renderer spares a scrape ~40 % of its time
(~90 ms of ~150 for a quarter of 1,024 engines x 2), and one made and dropped per request leaves
no memory behind, where a thousand kept ones left the process' memory fragmented when dropped."""
SLICE_BYTES_PER_CHARACTER = 2


class ScrapeStats:
    """Duration and size of the exporter's ``/metrics`` answers, as metrics (thread safe).

    A scrape's own duration and size are known only after its body is built, so each body carries
    the figures of the scrapes before it (as prometheus_client's own collectors do).
    """

    def __init__(self, app: App | None = None) -> None:
        self._lock = threading.Lock()
        self._buckets = [0] * len(SCRAPE_BUCKETS)
        self._count = 0
        self._sum = 0.0
        self._bytes = 0.0
        self._last_bytes = 0.0

    def observe(self, seconds: float, size: int) -> None:
        """Count one scrape that took *seconds* and answered *size* bytes (before compression)."""
        with self._lock:
            for i, bound in enumerate(SCRAPE_BUCKETS):
                if seconds <= bound:
                    self._buckets[i] += 1
            self._count += 1
            self._sum += seconds
            self._bytes += size
            self._last_bytes = size

    def describe(self) -> list[Metric]:
        """Nothing to describe ahead (registering must stay cheap)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The scrape figures so far."""
        with self._lock:
            buckets, count, total = list(self._buckets), self._count, self._sum
            size, last = self._bytes, self._last_bytes
        hist = HistogramMetricFamily(
            "redis_stats_exporter_scrape_duration_seconds",
            "Time taken to build the answers to /metrics (read of Redis, render, encode).",
        )
        pairs = [(repr(b), float(c)) for b, c in zip(SCRAPE_BUCKETS, buckets)] + [("+Inf", float(count))]
        hist.add_metric([], pairs, total)
        yield hist
        sent = CounterMetricFamily(
            "redis_stats_exporter_scrape_bytes", "Bytes of /metrics bodies built (before compression)."
        )
        sent.add_metric([], size)
        yield sent
        last_size = GaugeMetricFamily(
            "redis_stats_exporter_last_scrape_size_bytes",
            "Size of the last /metrics body (before compression).",
        )
        last_size.add_metric([], last)
        yield last_size

    def close(self) -> None:
        """Nothing runs."""


class Clashes:
    """Families left out of a namespace on the whole ``/metrics`` of several: counted, and logged
    once each (``redis_stats_exporter_family_type_clashes_total{family}``)."""

    def __init__(self, app: App | None = None) -> None:
        self._counts: Counter[str] = Counter()

    def clashed(self, names: list[str]) -> None:
        """Count families a namespace declared with another type than the one served."""
        for name in names:
            if not self._counts[name]:
                log.warning(
                    "family %s has another type in one namespace than in another: left out of the "
                    "namespace whose type is not served (it would merge two types in one family)",
                    name,
                )
            self._counts[name] += 1

    def describe(self) -> list[Metric]:
        """Nothing ahead (registering must stay cheap)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The clashes so far."""
        clashes = CounterMetricFamily(
            "redis_stats_exporter_family_type_clashes",
            "Families left out of a namespace's series on the whole /metrics: another namespace "
            "declares the same name with another type.",
            labels=["family"],
        )
        for name, n in sorted(self._counts.items()):
            clashes.add_metric([name], float(n))
        yield clashes

    def close(self) -> None:
        """Nothing runs."""


class SliceReaders:
    """What every ``?slice=`` of one namespace shares (a view state): two readers, a plan per
    slice each (slice 0 reads every writer's stats for the writers' self-metrics it shows; the
    others, :data:`~redis_stats.reader.SNAPSHOT_LEAN`, only the liveness fields of the writers
    holding chunks in their engines), and the count of their failed reads. Per slice only its
    renderer is kept (:class:`SliceText`: the text around its numbers, for its next scrape), of
    :data:`KEPT_SLICES` slices at most."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.first = source.new_reader()
        self.others = source.new_reader()
        self.others.snapshot_fetch = SNAPSHOT_LEAN
        self.errors = ReadErrors()

    def collector(self, part: EngineSlice) -> tuple[RedisCollector, SliceText]:
        """The collector of slice *part* for one request, and its kept renderer."""
        source = self.source
        text = source.kept("slice", part, lambda: SliceText(source), most=KEPT_SLICES)
        return RedisCollector(
            self.first if part.index == 0 else self.others,
            engines=part,
            writers=part.index == 0,
            namespace_label=bool(source.labels),
            renderer=lambda labels: text.renderer,
            errors=self.errors,
        ), text

    def close(self) -> None:
        """Nothing runs (its readers' client is the namespace's: never closed here)."""


class SliceText:
    """One ``?slice=``'s renderer, kept by the server (bounded in bytes, dropped when idle)."""

    def __init__(self, source: Source) -> None:
        self.size = 0
        self.renderer = TextRenderer(source.labels)

    def kept_bytes(self) -> int:
        """An estimate of its renderer's bytes: the text around its last text's numbers."""
        return SLICE_BYTES + SLICE_BYTES_PER_CHARACTER * self.size

    def close(self) -> None:
        """Nothing runs."""
