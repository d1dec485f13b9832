"""What a caller holds of a writer's metrics: a :class:`MetricHandle` per metric, whose
``labels(...)`` binds one series for the hot path, typed by the metric's kind
(:class:`CounterSeries`, :class:`GaugeSeries`, :class:`HistogramSeries`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from redis_stats.catalog import CatalogError, MetricSpec

if TYPE_CHECKING:  # the writer a handle binds series of (core.py imports this module)
    from redis_stats.writer.core import WriterCore

__all__ = ["CounterSeries", "GaugeSeries", "HistogramSeries", "MetricHandle"]


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
