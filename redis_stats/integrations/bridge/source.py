"""One bridged source: each scrape of its body stored as one writer's absolute totals.

**Exact at the scrape instant.** The writer's record API counts deltas; its flush stores its
absolute totals (schema 2). A source serves absolute totals, so each scrape records, per series,
the difference from what this incarnation recorded last: a counter's amount is chosen so that
the writer's total (``total + amount``, the addition the writer makes) *is* the source's value,
bit for bit, floats included (:func:`exact_amounts`; at a float rounding tie no single amount
lands there, and a second, exact amount follows with a flush of its own); a histogram's bucket
counts are ints and its sum is chosen the same way; a gauge is set to the source's value. Each
record is followed by a flush, and nothing is recorded again before a flush has taken it (a
flush that failed is retried first): so after each stored scrape the writer's totals in Redis
equal the body.

**Incarnations.** A counter or histogram bucket lower than last time, or a new
``process_start_time_seconds``, means the source restarted: the writer of the old incarnation is
closed (its totals stay in the store, its gauges stop counting at once) and a new writer starts
from zero, so the fleet's counters never go backwards. A family whose kind, label names or
buckets change within one incarnation cannot be stored beside its old definition: the body is
refused.

**A restarted bridge** (the source kept running) continues what the earlier writers of the same
source hold (:mod:`.handover`): their totals stay in the store and the new writer records only
what came since, so nothing counts twice, however many bridges came before. Each writer leaves
its handover record before its first flush.

**Failures cost this source only.** A scrape that fails (down, timeout, an HTTP error, a body
over the cap, cut short, garbage, a changed definition) stores nothing and sends no heartbeat:
this source's engines read down once ``stale_after`` passes, and the other sources (each its own
writer and thread) go on. Each failure is counted (:class:`SourceStats`, and the writer's
``redis_stats_writer_dropped_updates{reason="scrape_<reason>"}``); a warning is logged when a
source starts failing (or fails for another reason), one line when it recovers.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM, Catalog, MetricSpec
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, make_client
from redis_stats.errors import error_kind
from redis_stats.load import LoadMap
from redis_stats.writer import StatsWriter, new_writer_id

from .body import Body, BodyError, Family, parse_body
from .fetch import ACCEPT, ScrapeError, SourceURL, fetch
from .handover import Predecessor, find_predecessor, forget_earlier, write_record

__all__ = ["DEFAULT_MAX_BYTES", "BridgedSource", "SourceStats", "exact_amounts"]

log = logging.getLogger("redis_stats.bridge")

# The largest body a scrape reads (bytes): a full vLLM body with 8 engines is about 0.5 MB.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


def exact_amounts(total: int | float, target: int | float) -> tuple[int | float, int | float]:
    """Amounts *a*, *b* for which ``(total + a) + b == target`` in Python's arithmetic (the
    additions the writer makes to its total, one per flush), ``b`` 0 whenever one addition can
    land on *target*: ``target - total`` when that is exact (always for ints), else a float next
    to it that lands there. At a rounding tie no float does: *a* then lands just below *target*
    and *b* (exact: the two are neighbours) adds the rest. Both are >= 0 when *target* >= *total*.
    """
    amount = target - total
    if type(amount) is int or total + amount == target:
        return amount, 0
    for direction in (math.inf, -math.inf):
        candidate = amount
        for _ in range(4):
            candidate = math.nextafter(candidate, direction)
            if total + candidate == target:
                return candidate, 0
    while total + amount > target:
        amount = math.nextafter(amount, -math.inf)
    return amount, target - (total + amount)


@dataclass
class SourceStats:
    """What one source's scrapes did: bodies stored, failures by reason, incarnations."""

    stored: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    incarnations: int = 0
    last_error: str = ""
    last_stored: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)
    """Families left out (summaries, ...) with the reason."""


class _Incarnation:
    """One run of the source, as one writer: what it recorded of every series."""

    def __init__(self, writer: StatsWriter, start_time: float | None, engines: set[int]) -> None:
        self.writer = writer
        self.start_time = start_time
        self.engines = engines  # those it started with: they place its home shard (its record)
        self.handed_over = False  # the earlier writers' records deleted (after its first flush)
        self.counters: dict[tuple[str, int, tuple[str, ...]], int | float] = {}
        # series -> [sum as recorded, per-bucket counts as recorded]
        self.hists: dict[tuple[str, int, tuple[str, ...]], tuple[float, list[int]]] = {}
        self.flushed = True  # the last flush was confirmed: the next record starts a new take
        # What a rounding tie left to add (series, amount), with a flush of its own (exact_amounts).
        self.corrections: list[tuple[Any, int | float, bool]] = []

    def flush_pending(self) -> bool:
        """Confirm what was recorded before recording again: retry a failed flush, then add the
        corrections of rounding ties (one more flush). True when nothing is left unconfirmed."""
        writer = self.writer
        if not self.flushed:
            self.flushed = writer.flush()
            if not self.flushed:
                return False
        if self.corrections:
            for child, amount, histogram in self.corrections:
                if histogram:
                    child.add([0] * len(child.bounds), amount)
                else:
                    child.inc(amount)
            self.corrections = []
            self.flushed = writer.flush()
        return self.flushed

    def restarted(self, body: Body) -> str | None:
        """Why *body* comes from another run of the source than the one recorded, or None."""
        if body.start_time is not None and self.start_time is not None and body.start_time != self.start_time:
            return f"process_start_time_seconds went from {self.start_time!r} to {body.start_time!r}"
        for name, fam in body.families.items():
            why = self._went_back(name, fam)
            if why is not None:
                return why
        return None

    def _went_back(self, name: str, fam: Family) -> str | None:
        """Why *fam* is below what this incarnation recorded of it, or None."""
        if fam.spec.kind == COUNTER:
            for (engine, values), value in fam.series.items():
                old = self.counters.get((name, engine, values))
                if old is not None and value < old:
                    return f"counter {name!r} went from {old!r} to {value!r}"
        elif fam.spec.kind == HISTOGRAM:
            for (engine, values), (_sum, counts) in fam.series.items():
                found = self.hists.get((name, engine, values))
                if found is not None and any(n < o for n, o in zip(counts, found[1])):
                    return f"histogram {name!r} lost observations"
        return None


class BridgedSource:
    """Scrapes one metrics endpoint and stores it as one writer per source incarnation.

    *url* may carry a user and password (HTTP Basic auth); it is never printed unmasked.
    *engine_label* names the label holding a series' engine index (vLLM's ``engine``; series
    without it, and every series when it is None, belong to engine 0); *config*'s
    ``engine_offset`` is added to every index. *known* is a catalogue whose specs are kept where
    a family matches one by name, kind, label names and buckets (the help text and gauge
    roll-up mode then come from it). *include* are shell patterns of family names to store
    (empty: all but :data:`~.body.PROCESS_FAMILIES`, the source's own process). *client* is the
    Redis client every writer of this source uses (default: one built from *config*). *load* is
    the load feed's map (``GET /load``, ``/get_load``, ``/v1/loads``: which family feeds which
    field, e.g. ``redis_stats.integrations.vllm.load.VLLM_LOAD``); None: the bridged engines have
    no load entries.
    """

    def __init__(
        self,
        url: str,
        config: StatsConfig,
        *,
        engine_label: str | None = None,
        known: Catalog | None = None,
        include: tuple[str, ...] = (),
        accept: str = "any",
        timeout: float = 5.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        client: Client | None = None,
        load: LoadMap | None = None,
    ) -> None:
        self.source = SourceURL.parse(url)
        self.load = load
        if accept not in ACCEPT:
            raise ValueError(f"accept={accept!r} must be one of {', '.join(ACCEPT)}")
        if not timeout > 0 or not max_bytes > 0:
            raise ValueError(f"timeout={timeout!r} and max_bytes={max_bytes!r} must be > 0")
        self.config = config
        self.engine_label = engine_label or None
        self.known = known or Catalog()
        self.include = tuple(include)
        self.accept = ACCEPT[accept]
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.stats = SourceStats()
        self._client = client
        self._lookup: Any = None  # the client of the predecessor lookup (made at first use)
        self._inc: _Incarnation | None = None
        self._failing: str | None = None  # the reason of the failures going on, if any
        self._failed_run = 0

    def __repr__(self) -> str:
        wid = self._inc.writer.writer_id if self._inc else None
        return f"BridgedSource({self.source.safe!r}, writer={wid!r}, offset={self.config.engine_offset})"

    @property
    def safe_url(self) -> str:
        """The source's URL as it may be printed."""
        return self.source.safe

    @property
    def writer(self) -> StatsWriter | None:
        """The writer of the current incarnation (None before the first stored scrape)."""
        return self._inc.writer if self._inc else None

    def scrape(self) -> bool:
        """One scrape: fetch, check, record and flush. True when the body is stored in Redis;
        never raises for a source or Redis problem (counted in :attr:`stats`)."""
        try:
            resp = fetch(self.source, accept=self.accept, timeout=self.timeout, max_bytes=self.max_bytes)
            body = parse_body(
                resp.data, resp.content_type, engine_label=self.engine_label, include=self.include
            )
            return self._store(body)
        except (ScrapeError, BodyError) as exc:
            # A JSON body's message starts "answered JSON": it names the URL that answered it.
            message = f"{self.safe_url} {exc}" if exc.reason == "json" else str(exc)
            self._failed(exc.reason, self.source.redact(message))
            return False

    def close(self, timeout: float | None = None) -> bool:
        """Close the current writer (marked closed in Redis: its gauges stop counting)."""
        inc, self._inc = self._inc, None
        return inc.writer.close(timeout) if inc else True

    # -- storing a body -------------------------------------------------------------------------

    def _store(self, body: Body) -> bool:
        inc = self._continuing(body)
        specs = self._specs(body, inc)  # BodyError before anything is recorded
        if inc is None:
            inc = self._begin(body)
            if inc is None:
                return False
        # The last record not confirmed yet: retry it before recording again, so that each
        # record is taken alone (its amounts then land exactly on the source's values).
        if not inc.flush_pending():
            return False
        self._note_skipped(body)
        self._record(inc, body, specs)
        inc.flushed = inc.writer.flush()
        if inc.flushed and inc.corrections:
            inc.flushed = inc.flush_pending()
        if inc.flushed:
            self._recovered()
            self.stats.stored += 1
            self.stats.last_stored = time.time()
            if not inc.handed_over:
                self._forget_earlier(inc)
        return inc.flushed

    def _continuing(self, body: Body) -> _Incarnation | None:
        """The incarnation *body* continues; None when there is none yet or the source
        restarted (the writer of its previous run is closed then)."""
        inc = self._inc
        if inc is None:
            return None
        why = inc.restarted(body)
        if why is None:
            return inc
        log.warning(
            "source %s restarted (%s): closing writer %s, the new run is a new writer",
            self.safe_url,
            why,
            inc.writer.writer_id,
        )
        self.close()
        return None

    def _begin(self, body: Body) -> _Incarnation | None:
        """A new incarnation for *body*, continuing what earlier bridges stored of the source on
        this process's first run of it; None when Redis could not be read or written (counted:
        nothing is recorded rather than count twice)."""
        writer_id = new_writer_id("bridge")
        try:
            base = self._predecessor(body) if not self.stats.incarnations else None
            start_time = body.start_time if body.start_time is not None or base is None else base.start_time
            write_record(self._redis(), self.config, writer_id, self.owner, start_time, base, body.engines())
        except Exception as exc:  # Redis down: record nothing rather than count twice
            self._failed("redis", f"the handover of earlier bridge writers failed ({error_kind(exc)})")
            return None
        inc = self._inc = _Incarnation(self._new_writer(body, writer_id), start_time, body.engines())
        self.stats.incarnations += 1
        if base is not None:
            inc.counters.update(base.counters)
            inc.hists.update(base.hists)
        return inc

    def _redis(self) -> Any:
        """The client of the handover (reads and records, outside the writer's flushes)."""
        if self._lookup is None:
            self._lookup = self._client if self._client is not None else make_client(self.config)
        return self._lookup

    def _forget_earlier(self, inc: _Incarnation) -> None:
        """Delete the handover records of this source's earlier writers (this one is the newest
        now); tried again after the next stored scrape when Redis refuses."""
        try:
            forget_earlier(self._redis(), self.config, inc.writer.writer_id, self.owner, inc.engines)
            inc.handed_over = True
        except Exception as exc:
            log.debug(
                "source %s: deleting earlier handover records failed (%s)", self.safe_url, error_kind(exc)
            )

    def _specs(self, body: Body, inc: _Incarnation | None) -> dict[str, MetricSpec]:
        """The spec each family is stored under; a family whose definition changed within this
        incarnation refuses the body, one whose sample names clash with another is left out."""
        out: dict[str, MetricSpec] = {}
        catalog = inc.writer.catalog if inc else Catalog()
        new = Catalog()  # the families this body adds, for the clash check among them
        for name, fam in list(body.families.items()):
            stored = catalog.get(name)
            if stored is not None:
                _check_unchanged(name, stored, fam.spec)
                out[name] = stored
                continue
            spec = self._known_spec(name, fam.spec)
            clash = catalog.clash(spec) or new.clash(spec)
            if clash is not None:
                del body.families[name]
                body.skipped[name] = clash
                continue
            out[name] = new.add(spec)
        return out

    def _known_spec(self, name: str, spec: MetricSpec) -> MetricSpec:
        """*spec*, or the known catalogue's where that one matches it (its help text and gauge
        roll-up mode then count)."""
        known = self.known.get(name)
        if known is None:
            return spec
        if _shape(known) == _shape(spec):
            return known
        if known.kind == GAUGE == spec.kind:
            return MetricSpec(spec.name, GAUGE, spec.help, spec.labels, mode=known.mode)
        return spec

    @property
    def owner(self) -> str:
        """The owner every writer of this source claims its engines as (no secret in it)."""
        return ("bridge " + self.safe_url).replace("|", "/")

    def _predecessor(self, body: Body) -> Predecessor | None:
        found = find_predecessor(self._redis(), self.config, self.owner, body)
        if found is None:
            return None
        why = found.below(body)
        if why is not None:
            log.info(
                "source %s restarted since writer %s of an earlier bridge (%s): starting from zero",
                self.safe_url,
                found.writer_id,
                why,
            )
            return None
        log.warning(
            "source %s was bridged by writer %s before: what the earlier bridges stored stays in "
            "the store and this bridge adds only what came since (were that bridge still running, "
            "its increments would count twice: run one bridge per source)%s",
            self.safe_url,
            found.writer_id,
            ""
            if found.recorded
            else "; it left no handover record (a bridge of an earlier version, or the record lost): "
            "the chunks of this source's writers are the base, as far back as its counters allow",
        )
        return found

    def _new_writer(self, body: Body, writer_id: str) -> StatsWriter:
        owner = self.owner
        writer = StatsWriter(
            self.config,
            Catalog(),
            engines=sorted(body.engines()),
            writer_id=writer_id,
            role="bridge",
            owner=owner,
            client=self._client,
            start=False,
            load=self.load,
        )
        log.info("source %s is writer %s (engines %s)", self.safe_url, writer.writer_id, _engines(writer))
        return writer

    def _record(self, inc: _Incarnation, body: Body, specs: dict[str, MetricSpec]) -> None:
        writer = inc.writer
        catalog = writer.catalog
        engines = body.engines() - set(writer.engines)
        if engines:
            writer.add_engines(sorted(engines))
        for name, fam in body.families.items():
            spec = specs[name]
            if name not in catalog:
                writer.define(spec)
            if spec.kind == COUNTER:
                self._counters(inc, spec, fam)
            elif spec.kind == GAUGE:
                for (engine, values), value in fam.series.items():
                    writer.series(spec, engine, values).set(value)  # type: ignore[attr-defined]
            else:
                self._histograms(inc, spec, fam)

    @staticmethod
    def _counters(inc: _Incarnation, spec: MetricSpec, fam: Family) -> None:
        recorded = inc.counters
        for (engine, values), value in fam.series.items():
            key = (spec.name, engine, values)
            total = recorded.get(key, 0)
            child: Any = inc.writer.series(spec, engine, values)
            amount, rest = exact_amounts(total, value)
            child.inc(amount)
            if rest:
                inc.corrections.append((child, rest, False))
            recorded[key] = value

    @staticmethod
    def _histograms(inc: _Incarnation, spec: MetricSpec, fam: Family) -> None:
        recorded = inc.hists
        for (engine, values), (total, counts) in fam.series.items():
            key = (spec.name, engine, values)
            old_sum, old_counts = recorded.get(key, (0.0, [0] * len(counts)))
            child: Any = inc.writer.series(spec, engine, values)
            amount, rest = exact_amounts(old_sum, total)
            child.add([n - o for n, o in zip(counts, old_counts)], amount)
            if rest:
                inc.corrections.append((child, rest, True))
            recorded[key] = (total, counts)

    # -- failures -------------------------------------------------------------------------------

    def _failed(self, reason: str, message: str) -> None:
        self.stats.errors[reason] += 1
        self.stats.last_error = f"{reason}: {message}"
        self._failed_run += 1
        if self._inc is not None:
            self._inc.writer.count_drop(f"scrape_{reason}")
        if self._failing != reason:
            self._failing = reason
            log.warning(
                "source %s: scrape failed (%s: %s); nothing stored, its engines read down after %g s "
                "unless it recovers",
                self.safe_url,
                reason,
                message,
                self.config.stale_after,
            )
        else:
            log.debug("source %s: scrape failed again (%s: %s)", self.safe_url, reason, message)

    def _recovered(self) -> None:
        if self._failing is not None:
            log.warning("source %s: stored again after %d failed scrapes", self.safe_url, self._failed_run)
        self._failing = None
        self._failed_run = 0

    def _note_skipped(self, body: Body) -> None:
        for name, why in body.skipped.items():
            if name not in self.stats.skipped:
                self.stats.skipped[name] = why
                log.info("source %s: family %r is not stored: %s", self.safe_url, name, why)


def _shape(spec: MetricSpec) -> tuple[object, ...]:
    """What a stored family's series mean: kind, label names, buckets (not help, not mode)."""
    return (spec.kind, spec.labels, spec.buckets)


def _check_unchanged(name: str, stored: MetricSpec, spec: MetricSpec) -> None:
    """Refuse a family whose definition changed without a restart of the source."""
    if _shape(stored) != _shape(spec):
        raise BodyError(
            "definition",
            f"family {name!r} changed from a {_describe(stored)} to a {_describe(spec)} "
            "without a restart of the source: refused (the store keeps one definition "
            "per family; it takes the new one when the source restarts)",
        )


def _describe(spec: MetricSpec) -> str:
    text = f"{spec.kind} with labels {list(spec.labels)}"
    return text + (f" and buckets {list(spec.buckets)}" if spec.kind == HISTOGRAM else "")


def _engines(writer: StatsWriter) -> str:
    offset = writer.config.engine_offset
    return ",".join(str(e + offset) for e in writer.engines) or "none yet"
