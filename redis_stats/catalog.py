"""MetricSpec and Catalog: what a metric is (kind, help, labels, buckets, gauge roll-up).

A catalogue is declared in code by writers, stored in Redis (``rs:{NS}:meta``) with the first
flush, and read back by readers, so that a reader with no code for a metric can still render it.
Mistakes here are programming errors and raise :class:`CatalogError` at definition time.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn

from redis_stats.errors import CatalogError  # defined in errors.py; importable from here as it always was

__all__ = [
    "COUNTER",
    "ENGINE_LABEL",
    "GAUGE",
    "GAUGE_MODES",
    "HISTOGRAM",
    "RESERVED_PREFIX",
    "Catalog",
    "CatalogError",
    "MetricSpec",
]

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)
# How the values of one gauge series written by several live writers combine into one.
GAUGE_MODES = ("mostrecent", "sum", "max", "min")
# Every series carries the engine index as this label; a spec may not declare it itself.
ENGINE_LABEL = "engine"
# redis_stats' own metrics (redis_stats_up, redis_stats_writer_*, ...) are served next to the
# catalogue's: a catalogue metric with this prefix could print the same series twice.
RESERVED_PREFIX = "redis_stats_"
# Sample names a family of each kind prints besides its own name, as prometheus_client's registry
# counts them when it refuses two collectors that would clash (registry.py, _get_names).
_SUFFIXES = {
    COUNTER: ("_total", "_created"),
    GAUGE: (),
    HISTOGRAM: ("_bucket", "_count", "_sum", "_created"),
}

_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


_BOUNDS_HINT = " (bounds are the buckets' upper limits, in increasing order, e.g. [0.1, 0.5, 1, 5])"


def _bucket_bounds(name: str, buckets: object) -> tuple[float, ...]:
    """Each bound of a histogram's ``buckets`` as a float, or a CatalogError naming the one that
    is not a number (``float()`` would raise ValueError or TypeError, naming no metric)."""
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Iterable):
        raise CatalogError(
            f"histogram {name!r}: buckets must be a sequence of numbers, got {buckets!r}{_BOUNDS_HINT}"
        )
    bounds = []
    for bound in buckets:
        # A number, or a string of one ("+Inf", "0.5": prometheus_client takes those too).
        if isinstance(bound, bool) or not isinstance(bound, (int, float, str)):
            raise CatalogError(f"histogram {name!r}: bucket bound {bound!r} is not a number{_BOUNDS_HINT}")
        try:
            bounds.append(float(bound))
        except ValueError:
            raise CatalogError(
                f"histogram {name!r}: bucket bound {bound!r} is not a number{_BOUNDS_HINT}"
            ) from None
    return tuple(bounds)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its name, kind, help text, label names and, by kind, buckets or gauge roll-up.

    ``name`` is the family name: a counter named ``requests`` is exposed as ``requests_total``
    (a trailing ``_total`` given at definition is stripped, as prometheus_client does).
    ``buckets`` are the finite upper bounds of a histogram; ``+Inf`` is always implied.
    """

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    mode: str = "mostrecent"
    _index: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_name()
        labels = tuple(self.labels)
        object.__setattr__(self, "labels", labels)
        self._check_labels(labels)
        if self.kind == HISTOGRAM:
            object.__setattr__(self, "buckets", self._histogram_buckets())
        elif self.buckets:
            raise CatalogError(f"{self.kind} {self.name!r} cannot have buckets")
        if self.kind == GAUGE and self.mode not in GAUGE_MODES:
            raise CatalogError(f"gauge {self.name!r}: mode {self.mode!r} is not one of {GAUGE_MODES}")
        if not isinstance(self.help, str):
            raise CatalogError(f"metric {self.name!r}: help must be a string")
        self._index.update({label: i for i, label in enumerate(labels)})

    def _check_name(self) -> None:
        """Check the kind and the name; a counter's trailing ``_total`` is dropped."""
        if self.kind not in KINDS:
            raise CatalogError(f"metric {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if not isinstance(self.name, str) or not _METRIC_NAME_RE.match(self.name):
            raise CatalogError(
                f"metric name {self.name!r} is not a valid Prometheus name ([a-zA-Z_:][a-zA-Z0-9_:]*)"
            )
        if self.kind == COUNTER and self.name.endswith("_total"):
            object.__setattr__(self, "name", self.name[: -len("_total")])
        if self.name.startswith(RESERVED_PREFIX):
            raise CatalogError(
                f"metric name {self.name!r}: names starting with {RESERVED_PREFIX!r} are reserved for "
                "redis_stats' own metrics (redis_stats_up, redis_stats_writer_..., see "
                "docs/self-metrics.md); choose another prefix"
            )

    def _check_labels(self, labels: tuple[str, ...]) -> None:
        seen: set[str] = set()
        for label in labels:
            self._check_label(label)
            if label in seen:
                raise CatalogError(f"metric {self.name!r}: label {label!r} is declared twice")
            seen.add(label)

    def _check_label(self, label: object) -> None:
        if not isinstance(label, str) or not _LABEL_NAME_RE.match(label) or label.startswith("__"):
            raise CatalogError(f"metric {self.name!r}: label name {label!r} is not valid")
        if label == ENGINE_LABEL:
            raise CatalogError(
                f"metric {self.name!r}: label {ENGINE_LABEL!r} is added by redis_stats to every "
                "series; do not declare it"
            )
        if label.startswith(RESERVED_PREFIX):
            # redis_stats_namespace is added to every series by an exporter of several namespaces.
            raise CatalogError(
                f"metric {self.name!r}: label names starting with {RESERVED_PREFIX!r} are reserved for "
                "the labels redis_stats adds (redis_stats_namespace); choose another name"
            )
        if self.kind == HISTOGRAM and label == "le":
            raise CatalogError(f"histogram {self.name!r}: label 'le' is reserved for buckets")

    def _histogram_buckets(self) -> tuple[float, ...]:
        """The histogram's finite bounds (a given ``+Inf`` dropped), checked: finite, increasing."""
        buckets = tuple(b for b in _bucket_bounds(self.name, self.buckets) if not b == math.inf)
        if not buckets:
            raise CatalogError(f"histogram {self.name!r} needs at least one finite bucket bound")
        if any(math.isnan(b) or math.isinf(b) for b in buckets):
            raise CatalogError(f"histogram {self.name!r}: bucket bounds must be finite numbers")
        if any(b >= c for b, c in itertools.pairwise(buckets)):
            raise CatalogError(
                f"histogram {self.name!r}: bucket bounds {buckets} must be strictly increasing"
            )
        return buckets

    def label_values(self, labels: dict[str, object]) -> tuple[str, ...]:
        """Order *labels* as declared, as strings (``str()`` of each value).

        Raises CatalogError for a missing or unknown label name, and for a value that has no
        string form or cannot be encoded as UTF-8 (a lone surrogate): it could never be sent.
        """
        if len(labels) != len(self.labels) or any(k not in self._index for k in labels):
            self._wrong_labels(labels)
        values = []
        for k in self.labels:
            v = labels[k]
            if type(v) is not str:
                v = self._label_text(k, v)
            if not v.isascii():  # the cheap test first: nearly every label value is ASCII
                self._check_utf8(k, v)
            values.append(v)
        return tuple(values)

    def _wrong_labels(self, labels: dict[str, object]) -> NoReturn:
        missing = [k for k in self.labels if k not in labels]
        unknown = [k for k in labels if k not in self._index]
        raise CatalogError(
            f"metric {self.name!r} takes labels {list(self.labels)}; missing {missing}, unknown {unknown}"
        )

    def _label_text(self, label: str, value: object) -> str:
        try:
            return str(value)
        except Exception as exc:
            raise CatalogError(
                f"metric {self.name!r}: label {label!r}: str() of the value failed "
                f"({type(exc).__name__}: {exc}); pass a string"
            ) from None

    def _check_utf8(self, label: str, value: str) -> None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            # Refused here, or every later flush of the writer would fail to encode it.
            raise CatalogError(
                f"metric {self.name!r}: label {label!r} value {value!r} cannot be encoded as UTF-8 "
                f"({exc.reason} at index {exc.start}); pass valid text, e.g. decode the "
                "source with errors='replace'"
            ) from None

    def conflicts_with(self, other: MetricSpec) -> bool:
        """Whether *other* defines this metric differently in a way that changes what its stored
        series mean: kind, label names, buckets or gauge mode (the help text does not count)."""
        return (self.kind, self.labels, self.buckets, self.mode) != (
            other.kind,
            other.labels,
            other.buckets,
            other.mode,
        )

    @property
    def sample_names(self) -> tuple[str, ...]:
        """Every sample name this metric can print: its name and its kind's suffixed names
        (``_total``/``_created``; ``_bucket``/``_count``/``_sum``/``_created``)."""
        return (self.name, *(self.name + suffix for suffix in _SUFFIXES[self.kind]))

    def to_json(self) -> str:
        """The spec as stored in ``rs:{NS}:meta`` (field ``m:<name>``)."""
        doc: dict[str, object] = {"kind": self.kind, "help": self.help, "labels": list(self.labels)}
        if self.kind == HISTOGRAM:
            doc["buckets"] = list(self.buckets)
        if self.kind == GAUGE:
            doc["mode"] = self.mode
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, name: str, text: str) -> MetricSpec:
        """Inverse of :meth:`to_json`; raises CatalogError (or ValueError) on a malformed document."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise CatalogError(f"stored spec of {name!r} is not an object")
        return cls(
            name=name,
            kind=doc.get("kind", ""),
            help=doc.get("help", ""),
            labels=tuple(doc.get("labels", ())),
            buckets=tuple(doc.get("buckets", ())),
            mode=doc.get("mode", "mostrecent"),
        )


class Catalog:
    """An ordered set of :class:`MetricSpec`, looked up by name.

    Defining the same metric twice with the same spec returns the existing one; with a different
    spec it raises :class:`CatalogError` (two parts of a program disagreeing on a metric). Two
    metrics whose sample names overlap (counter ``x`` prints ``x_total``, so a gauge ``x_total``
    beside it would print a second series of that name) raise :class:`CatalogError` too, as
    prometheus_client refuses them at registration.
    """

    def __init__(self, specs: Iterable[MetricSpec] = ()) -> None:
        self._specs: dict[str, MetricSpec] = {}
        self._owners: dict[str, MetricSpec] = {}  # sample name -> the spec that prints it
        for spec in specs:
            self.add(spec)

    def add(self, spec: MetricSpec) -> MetricSpec:
        """Add *spec* (or return the identical one already there)."""
        existing = self._specs.get(spec.name)
        if existing is not None:
            if existing != spec:
                raise CatalogError(
                    f"metric {spec.name!r} is already defined differently: {existing} vs {spec}"
                )
            return existing
        clash = self.clash(spec)
        if clash is not None:
            raise CatalogError(clash)
        self._insert(spec)
        return spec

    def clash(self, spec: MetricSpec) -> str | None:
        """Why *spec* cannot join this catalogue beside another metric (the sample name both
        would print), or None."""
        for sample in spec.sample_names:
            other = self._owners.get(sample)
            if other is not None and other.name != spec.name:
                return (
                    f"{spec.kind} {spec.name!r} and {other.kind} {other.name!r} would both print "
                    f"samples named {sample!r} (a {spec.kind} prints {', '.join(spec.sample_names)}; "
                    f"a {other.kind} prints {', '.join(other.sample_names)}): rename one of them"
                )
        return None

    def _insert(self, spec: MetricSpec) -> None:
        self._specs[spec.name] = spec
        for sample in spec.sample_names:
            self._owners[sample] = spec

    def counter(self, name: str, help: str, labels: Iterable[str] = ()) -> MetricSpec:
        """Define a monotonic counter (exposed as ``<name>_total``)."""
        return self.add(MetricSpec(name, COUNTER, help, tuple(labels)))

    def gauge(self, name: str, help: str, labels: Iterable[str] = (), mode: str = "mostrecent") -> MetricSpec:
        """Define a gauge; *mode* says how the values of several live writers combine."""
        return self.add(MetricSpec(name, GAUGE, help, tuple(labels), mode=mode))

    def histogram(
        self, name: str, help: str, buckets: Iterable[float], labels: Iterable[str] = ()
    ) -> MetricSpec:
        """Define a histogram with the given finite upper bounds (``+Inf`` is implied)."""
        return self.add(
            MetricSpec(name, HISTOGRAM, help, tuple(labels), buckets=_bucket_bounds(name, buckets))
        )

    def get(self, name: str) -> MetricSpec | None:
        """The spec named *name*, or None."""
        return self._specs.get(name)

    def __getitem__(self, name: str) -> MetricSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise CatalogError(
                f"unknown metric {name!r}; define it in the catalogue first "
                f"(known: {', '.join(sorted(self._specs)) or 'none'})"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def merged(
        self,
        other: Iterable[MetricSpec],
        on_clash: Callable[[MetricSpec, str], None] | None = None,
    ) -> Catalog:
        """A new catalogue with this one's specs, plus those of *other* it does not define.

        A spec of *other* whose sample names clash with this catalogue's, or with one of *other*
        earlier in name order, is left out (a reader must never print one series twice) and
        passed to *on_clash* with the reason. Name order, not the order *other* comes in, so that
        every reader of the same stored catalogue keeps the same metrics.
        """
        out = Catalog(self)
        for spec in sorted(other, key=lambda s: s.name):
            if spec.name in out:
                continue
            clash = out.clash(spec)
            if clash is None:
                out._insert(spec)
            elif on_clash is not None:
                on_clash(spec, clash)
        return out
