"""prometheus_client-shaped metric classes that write to a redis_stats writer.

vLLM builds part of its metrics through classes it is handed instead of prometheus_client's:
``KVConnectorProm`` and ``ECConnectorProm`` pass ``{Gauge: ..., Counter: ..., Histogram: ...}`` to
the connector's ``build_prom_metrics``, and ``SpecDecodingProm``/``PerfMetricsProm`` read a
``_counter_cls`` class attribute (vLLM's Ray logger swaps in Ray metrics the same way). The
classes made by :func:`metric_classes` take the constructor arguments and the
``labels``/``inc``/``set``/``observe`` calls of prometheus_client's, so vLLM's own code (and a
connector's) defines each family here with its own name, help, label names and buckets, and its
values land in Redis under the same names, whatever the connector.

The ``engine`` label is the writer's engine index (as every redis_stats series has one); a metric
without it (vLLM declares a few) is kept under *fallback_engine*. Nothing here imports vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from redis_stats.catalog import COUNTER, ENGINE_LABEL, GAUGE, HISTOGRAM, CatalogError, MetricSpec
from redis_stats.writer import WriterCore

__all__ = ["gauge_mode", "metric_classes"]

# prometheus_client's default histogram buckets, used when a caller gives none (as it does).
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


def gauge_mode(multiprocess_mode: str | None) -> str:
    """The redis_stats roll-up for a prometheus_client ``multiprocess_mode``.

    ``live*`` modes keep only live processes, which redis_stats does for every gauge; ``all``
    (prometheus_client's default: one series per pid) has no pid label here, so the newest write
    wins, as for vLLM's scheduler gauges.
    """
    mode = (multiprocess_mode or "all").removeprefix("live")
    return mode if mode in ("sum", "max", "min", "mostrecent") else "mostrecent"


class _GaugeChild:
    """A bound gauge with prometheus_client's extra gauge methods."""

    __slots__ = ("_child",)

    def __init__(self, child: Any) -> None:
        self._child = child

    def set(self, value: float) -> None:
        self._child.set(value)

    def inc(self, amount: float = 1) -> None:
        self._child.inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._child.dec(amount)

    def set_to_current_time(self) -> None:
        self._child.set(time.time())


def _full_name(namespace: str, subsystem: str, name: str, unit: str) -> str:
    """A family's name as prometheus_client makes it of its parts."""
    full = "_".join(part for part in (namespace, subsystem, name) if part)
    if unit and not full.endswith("_" + unit):
        full += "_" + unit
    return full


class _RedisMetric:
    """Base of the generated classes: one metric family defined in the writer's catalogue."""

    _writer: WriterCore
    _fallback_engine: int
    _kind: str

    def __init__(
        self,
        name: str,
        documentation: str = "",
        labelnames: Iterable[str] = (),
        *,
        buckets: Sequence[float] | None = None,
        multiprocess_mode: str | None = None,
        namespace: str = "",
        subsystem: str = "",
        unit: str = "",
        **_ignored: Any,  # registry=, _labelvalues=, ...: prometheus_client options with no meaning here
    ) -> None:
        full = _full_name(namespace, subsystem, name, unit)
        self._labelnames = tuple(labelnames)
        self._engine_pos = self._labelnames.index(ENGINE_LABEL) if ENGINE_LABEL in self._labelnames else None
        spec = MetricSpec(
            full,
            self._kind,
            documentation,
            tuple(n for n in self._labelnames if n != ENGINE_LABEL),
            buckets=tuple(DEFAULT_BUCKETS if buckets is None else buckets) if self._kind == HISTOGRAM else (),
            mode=gauge_mode(multiprocess_mode) if self._kind == GAUGE else "mostrecent",
        )
        # Defining the same family twice (a second connector instance) returns the first; a
        # different definition under the same name raises CatalogError, as prometheus_client
        # raises on a duplicate name.
        self._handle = self._writer.define(spec)
        self._name = self._handle.spec.name
        self._bound: Any = None

    def labels(self, *values: object, **kwvalues: object) -> Any:
        """The series with these label values (positional in declared order, or by name)."""
        if values and kwvalues:
            raise ValueError("can't pass both *args and **kwargs")
        if values:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: incorrect label count (expected {self._labelnames})")
            kwvalues = dict(zip(self._labelnames, values, strict=True))
        elif set(kwvalues) != set(self._labelnames):
            raise ValueError(f"{self._name}: incorrect label names (expected {self._labelnames})")
        engine = self._fallback_engine
        if self._engine_pos is not None:
            raw = kwvalues.pop(ENGINE_LABEL)
            try:
                engine = int(str(raw))
            except ValueError:
                raise CatalogError(
                    f"metric {self._name!r}: engine label {raw!r} is not an engine index"
                ) from None
        return self._wrap(self._handle.labels(engine, **kwvalues))

    def _wrap(self, child: Any) -> Any:
        return child

    def _unlabelled(self) -> Any:
        # prometheus_client lets a metric without label names be used directly.
        if self._bound is None:
            if self._labelnames:
                raise ValueError(f"{self._name}: metric has label names {self._labelnames}; call labels()")
            self._bound = self.labels()
        return self._bound


class _Counter(_RedisMetric):
    _kind = COUNTER

    def inc(self, amount: float = 1) -> None:
        self._unlabelled().inc(amount)


class _Gauge(_RedisMetric):
    _kind = GAUGE

    def _wrap(self, child: Any) -> Any:
        return _GaugeChild(child)

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def inc(self, amount: float = 1) -> None:
        self._unlabelled().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._unlabelled().dec(amount)

    def set_to_current_time(self) -> None:
        self._unlabelled().set_to_current_time()


class _Histogram(_RedisMetric):
    _kind = HISTOGRAM

    def observe(self, value: float) -> None:
        self._unlabelled().observe(value)


def metric_classes(writer: WriterCore, fallback_engine: int = 0) -> tuple[type, type, type]:
    """``(Gauge, Counter, Histogram)`` classes that define their families in *writer*'s catalogue
    and record into it; series without an ``engine`` label go to *fallback_engine*."""
    attrs = {"_writer": writer, "_fallback_engine": fallback_engine}
    return (
        type("RedisGauge", (_Gauge,), dict(attrs)),
        type("RedisCounter", (_Counter,), dict(attrs)),
        type("RedisHistogram", (_Histogram,), dict(attrs)),
    )
