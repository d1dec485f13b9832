"""The load feed: what a router or an autoscaler needs of every engine, read without the catalogue.

Per engine: ``up``, ``age_seconds``, requests running and waiting, KV-cache usage and capacity,
the most requests it runs at once, recent prompt and generation tokens per second and prefix-cache
queries and hits per second; per fleet: the sum, mean and max of each over
the live engines (``GET /load``, :meth:`redis_stats.reader.StatsReader.load`; the document's
JSON Schema is ``redis_stats/schemas/load.schema.json``, its stability promise in docs/load.md).

Where the numbers come from. A writer given a :class:`LoadMap` (which metric feeds which
field: the integration's, e.g. ``redis_stats.integrations.vllm.load.VLLM_LOAD``; this module
knows no product's names) stores one small **entry** per engine it records, beside its flush, in
its shard's load hash (``load.lua``, docs/key-schema.md): the gauges' current values, the
roll-up mode of each, their newest stamp (in the server's clock, as the flushed gauges'), and
the recent rates of the counters (over
:data:`RATE_WINDOW` seconds, computed by the writer, which knows its own increments exactly). A
reader reads the load hash, the engines' field names, the writers and their
``stale_ms`` (:data:`redis_stats.reader.LOAD`: a few kilobytes per engine fewer than the
snapshot) and adds each engine's entries up over the writers the reader
judges live, by the snapshot's own rule (:func:`redis_stats._core.read.values.roll_up` for gauges; a
rate is the sum of the live writers' rates).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from redis_stats import codec
from redis_stats._core.read.decoder import ShardReply, judged_by, judges, listed_engines, unreadable
from redis_stats._core.read.liveness import DOWN, UP, Liveness
from redis_stats._core.read.values import float_mean, float_sum, roll_up
from redis_stats.codec import (
    ENTRY_VERSION,
    FIELDS,
    MODE_CODES,
    LoadEntry,
    decode_entries,
    decode_entry,
    encode_entry,
)
from redis_stats.snapshot import Skipped

__all__ = [  # the load entry's codec (redis_stats/codec.py) too: where callers have taken it from
    "COUNTED_FIELDS",
    "ENTRY_VERSION",
    "FIELDS",
    "GAUGE_FIELDS",
    "LOAD_SCHEMA_VERSION",
    "MODE_CODES",
    "RATE_FIELDS",
    "RATE_WINDOW",
    "EngineLoad",
    "LoadEntry",
    "LoadMap",
    "LoadSource",
    "LoadView",
    "add_bookings",
    "count_bookings",
    "decode_entries",
    "decode_entry",
    "encode_entry",
    "engine_load",
    "load_view",
    "read_view",
]

# The version of the load document (``schema_version``; see docs/load.md for what may change
# within a version and what needs a new one).
LOAD_SCHEMA_VERSION = 1

RATE_FIELDS = tuple(f for f in FIELDS if f.endswith("_per_second"))
COUNTED_FIELDS = ("in_flight",)
"""Fields a writer's process counts itself (the requests its front end holds: redis_stats.arrivals),
summed over an engine's live writers whatever their metrics' modes: each process holds its own."""
GAUGE_FIELDS = tuple(f for f in FIELDS if f not in RATE_FIELDS and f not in COUNTED_FIELDS)
MAPPED_FIELDS = tuple(f for f in FIELDS if f not in COUNTED_FIELDS)
"""The fields a metric feeds (a :class:`LoadMap`'s)."""
SUMMARISED = (*FIELDS, "booked", "expected_in_flight")
"""What ``/load``'s ``fleet`` sums, averages and maxes over the live engines."""

# Field index -> its index among the rates (the rate fields' running totals), and the gauge fields'
# indexes, in FIELDS order.
_RATE_AT = {FIELDS.index(f): j for j, f in enumerate(RATE_FIELDS)}
_GAUGE_AT = tuple(FIELDS.index(f) for f in GAUGE_FIELDS)
_SUMMED_AT = (*_RATE_AT, *(FIELDS.index(f) for f in COUNTED_FIELDS))  # added up over the writers

# Seconds over which a writer computes the recent rates it stores.
RATE_WINDOW = 5.0


class LoadSource(NamedTuple):
    """Which metric feeds one field of the feed.

    A gauge's value is the sum of the engine's series of it (one per engine, usually); with
    *labels*, the value is the product of those label values of the engine's series (an info
    gauge such as a cache configuration: ``num_gpu_blocks`` x ``block_size`` tokens). A counter
    feeds a ``*_per_second`` field: its recent rate. With *constant* (and no *metric*), a gauge
    field is that number for every engine the writer records: a setting the integration knows
    and no metric carries (vLLM's ``max_num_seqs``).
    """

    metric: str
    labels: tuple[str, ...] = ()
    constant: float | None = None


@dataclass(frozen=True)
class LoadMap:
    """Which metric feeds which field of the load feed (each optional: a field without a source
    is ``null`` in the feed). Given to a writer (``StatsWriter(load=...)``); an integration
    defines its own (``redis_stats.integrations.vllm.load.VLLM_LOAD``)."""

    requests_running: LoadSource | None = None
    requests_waiting: LoadSource | None = None
    kv_cache_usage: LoadSource | None = None
    kv_cache_capacity_tokens: LoadSource | None = None
    prompt_tokens_per_second: LoadSource | None = None
    generation_tokens_per_second: LoadSource | None = None
    max_running_requests: LoadSource | None = None
    prefix_cache_queries_per_second: LoadSource | None = None
    prefix_cache_hits_per_second: LoadSource | None = None

    def __post_init__(self) -> None:
        for name in MAPPED_FIELDS:
            source = getattr(self, name)
            if source is None:
                continue
            if not isinstance(source, LoadSource):
                raise TypeError(f"LoadMap.{name}={source!r} is not a LoadSource (or None)")
            if source.constant is not None and (
                name in RATE_FIELDS
                or source.metric
                or not isinstance(source.constant, (int, float))
                or not math.isfinite(source.constant)
            ):
                raise ValueError(
                    f"LoadMap.{name}: a constant source is a finite number with no metric, for a "
                    f"gauge field (not a *_per_second one); got {source!r}"
                )

    def sources(self) -> dict[str, LoadSource]:
        """Field -> its source, for the fields that have one."""
        return {name: s for name in MAPPED_FIELDS if (s := getattr(self, name)) is not None}


@dataclass
class EngineLoad:
    """One engine's load: None for a field no live writer reports (and for every field of an
    engine that is not up)."""

    engine: int
    up: bool
    age_seconds: float
    """Seconds since the newest entry of a live writer was stored (server clock); without one,
    since the engine's last heartbeat."""
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    kv_cache_capacity_tokens: float | None = None
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    max_running_requests: float | None = None
    prefix_cache_queries_per_second: float | None = None
    prefix_cache_hits_per_second: float | None = None
    in_flight: float | None = None
    """Requests the engine's front end holds (arrived, not ended), over its live writers' processes;
    None where no front end counts them (redis_stats.arrivals)."""
    booked: int | None = None
    """Routers' bookings of requests on this engine not yet confirmed by its front end, ended or
    timed out, of routers whose lease is live (redis_stats.bookings); None when the engine is not
    up."""
    writers: int = 0
    """Live writers whose entries make up this engine's numbers."""
    state: str = ""
    """``up``, ``stale`` (up, but a flush or more behind) or ``down``: the one rule of
    ``redis_stats._core.read.liveness`` (``""``: not judged, a view made by hand: ``up`` tells)."""
    seq: int | None = None
    """The sequence number of the newest flush of the live writers of this engine (their entries
    in the seq hash): which flush its numbers come from; None when none is known."""
    endpoint: str | None = None
    """The endpoint its writers are served behind (``StatsConfig.endpoint``), None if none said."""
    live_writers: frozenset[str] = frozenset()
    """The writers whose entries count in this engine, by the reader's rule (empty: not judged);
    what a later read of the load hash alone is rolled up over (:func:`engine_load`)."""

    def set_values(self, values: Sequence[float | None]) -> None:
        """Set the fields of :data:`FIELDS`, in their order."""
        for name, value in zip(FIELDS, values):
            setattr(self, name, value)

    def values(self) -> tuple[float | None, ...]:
        """The fields of :data:`FIELDS`, in their order."""
        return tuple(getattr(self, name) for name in FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``/load``'s ``engines.<index>``)."""
        out: dict[str, Any] = {
            "up": self.up,
            "state": self.state or (UP if self.up else DOWN),
            "age_seconds": round(self.age_seconds, 3),
            "seq": self.seq,
        }
        for name in FIELDS:
            v = getattr(self, name)
            out[name] = None if v is None else _rounded(name, v)
        out["booked"] = self.booked
        expected = self.expected_in_flight
        out["expected_in_flight"] = None if expected is None else _rounded("in_flight", expected)
        return out

    @property
    def expected_in_flight(self) -> float | None:
        """What a router balances on: the engine's own count (:attr:`in_flight`, or requests
        running plus waiting where no front end counts arrivals) plus :attr:`booked`; None when
        the engine is not up, reports neither, or reports a count no engine can have (a bad
        gauge: negative, not finite): not a number to balance on."""
        if not self.up:
            return None
        truth = self.in_flight
        if truth is None:
            counts = [v for v in (self.requests_running, self.requests_waiting) if v is not None]
            if not counts or not all(0 <= v < math.inf for v in counts):
                return None
            truth = float_sum(counts)
        return truth + (self.booked or 0)


def _rounded(name: str, v: float) -> float | int | None:
    """Fewer digits than a float carries: a body that changes only when a value does (its ETag)
    and stays small at a thousand engines. An infinity (a sum past the float range) is written as
    the largest float of its sign: the document is strict JSON, and its schema promises a number
    (``null`` means "not reported"); docs/load.md."""
    if math.isinf(v):
        return math.copysign(_MAX, v)
    if v != v:  # (never: entries hold finite values, and their sums are none) strict JSON all the same
        return None
    if name == "kv_cache_usage":
        return round(v, 4)
    if v == int(v) and abs(v) < 2**53:
        return int(v)
    return round(v, 1 if name.endswith("_per_second") else 3)


@dataclass
class LoadView:
    """Every engine's load at server time :attr:`time`, and the fleet's figures over the live
    engines (what ``GET /load`` answers)."""

    time: float
    engines: dict[int, EngineLoad]
    skipped: dict[str, int] = field(default_factory=dict)
    """Entries and keys skipped, by reason (``bad_entry``, ``wrong_type``, ``bad_engine``)."""

    def fleet(self) -> dict[str, Any]:
        """Counts of engines, and per field the ``sum``, ``mean`` and ``max`` over the live
        engines that report it (``null`` when none does)."""
        live = [e for e in self.engines.values() if e.up]
        out: dict[str, Any] = {"engines": len(self.engines), "engines_up": len(live)}
        for name in SUMMARISED:
            values = [v for e in live if (v := getattr(e, name)) is not None]
            if not values:
                out[name] = {"sum": None, "mean": None, "max": None, "engines": 0}
                continue
            total = float_sum(values)  # +-inf past the float range, never an exception
            out[name] = {
                "sum": _rounded(name, total),
                "mean": _rounded(name, float_mean(values, total)),
                "max": _rounded(name, max(values)),
                "engines": len(values),
            }
        return out

    def by_endpoint(self) -> tuple[dict[str, list[int]], list[int]]:
        """The engines behind each endpoint stored (in engine order), and the engines that store
        none (their writers were given no ``endpoint``)."""
        behind: dict[str, list[int]] = {}
        unassigned = []
        for engine in sorted(self.engines):
            endpoint = self.engines[engine].endpoint
            if endpoint is None:
                unassigned.append(engine)
            else:
                behind.setdefault(endpoint, []).append(engine)
        return behind, unassigned

    def why_no_engine_behind(self, endpoint: str) -> str:
        """Why no engine of this view is served behind *endpoint*, as an answer that has no load
        to give says it: nothing stored at all, no engine storing an endpoint, or other endpoints."""
        behind, unassigned = self.by_endpoint()
        where = f"no engine is served behind endpoint {endpoint!r}"
        if not self.engines:
            return (
                f"{where}: this namespace holds no engine's load (nothing has written here with the "
                "load feed: check the namespace, and that the writers run)"
            )
        if not behind:
            return (
                f"{where}: no engine of this namespace stores an endpoint (engines {_few(unassigned)} "
                "have none: give their writers one, REDIS_STATS_ENDPOINT or endpoint=)"
            )
        return f"{where}; the endpoints stored are {_few(sorted(behind))} (GET /endpoints lists them)"

    def signature(self) -> str:
        """What a body of this view says but its times (ages, ``time``): equal for equal
        values and ups (``/load``'s ETag is a digest of it)."""
        rows = [(e, v.up, v.state, v.values(), v.booked) for e, v in sorted(self.engines.items())]
        return repr((rows, sorted(self.skipped.items())))

    def to_dict(self, *, namespace: str | None = None) -> dict[str, Any]:
        """The ``/load`` document (``redis_stats/schemas/load.schema.json``)."""
        doc: dict[str, Any] = {"schema_version": LOAD_SCHEMA_VERSION}
        if namespace is not None:
            doc["namespace"] = namespace
        doc["time"] = round(self.time, 3)
        doc["fleet"] = self.fleet()
        doc["engines"] = {str(e): self.engines[e].to_dict() for e in sorted(self.engines)}
        doc["skipped"] = dict(self.skipped)
        return doc


def read_view(
    replies: list[ShardReply],
    stale_after: float,
    kept: dict[tuple[str, ...], frozenset[str]],
) -> tuple[LoadView, dict[tuple[str, ...], frozenset[str]]]:
    """The :class:`LoadView` of one read of the load feed (a reply per shard, shard 0 first), and
    the engines' chunk writers by their hash's field names, for the next read (*kept*: the last
    read's; they change only when a writer comes or goes).

    ``up``, and the writers whose entries count in each engine, are decided by the rule every
    reader applies (:class:`~redis_stats._core.read.liveness.Liveness`, on what the writers stored:
    their heartbeats, their own ``stale_ms``, the engine's chunk writers; *stale_after*: the
    configured seconds), with the writers live in the engine's own shard(s), as the snapshot
    decodes them (the same functions of :mod:`redis_stats._core.read.decoder`)."""
    skipped = Skipped()
    now_ms = max(r.now_ms for r in replies)
    stats: dict[str, dict[str, str]] = {}
    beats: dict[str, float] = {}
    load_flat: list[Any] = []
    for reply in replies:
        why = unreadable(reply.load)
        if why is not None:  # a key of the wrong type: the others are shown
            skipped.note(why, reply.keys.load)
        else:
            load_flat += reply.load
        if reply.writers.__class__ is list:
            for wid, score in zip(reply.writers[0::2], reply.writers[1::2]):
                beat = float(score)
                if abs(beat) >= abs(beats.get(wid, 0.0)):
                    beats[wid] = beat
            for wid, flat in zip(reply.writers[0::2], reply.stats):
                if flat.__class__ is list and flat:  # stored in the writer's home shard only
                    stats[wid] = dict(zip(flat[0::2], flat[1::2]))
                else:
                    stats.setdefault(wid, {})
    rule = Liveness.of(now_ms, stats, stale_after * 1000.0, beats=beats)
    judged = judges(replies, rule, skipped)
    seqs = [_seqs(r.seq) for r in replies]
    states: dict[int, tuple[bool, float]] = {}
    about: dict[int, tuple[str, int | None, str | None]] = {}
    live_of: dict[int, set[str]] = {}
    now_kept: dict[tuple[str, ...], frozenset[str]] = {}
    for name, (score, parts) in listed_engines(replies, skipped).items():
        owners: frozenset[str] = frozenset()
        for at, j in parts:
            names = replies[at].hashes[j]
            held = tuple(names) if names.__class__ is list else ()
            writers = kept.get(held)
            if writers is None:
                writers = frozenset(
                    w for n in held if n.__class__ is str and (w := codec.chunk_writer(n)) is not None
                )
            now_kept[held] = writers
            owners |= writers
        here, judge = judged_by(parts, judged)
        state = judge.engine_state(float(score), owners, here)
        states[int(name)] = (state != DOWN, rule.age(float(score)))
        live_of[int(name)] = here
        newest = _newest_seq(seqs, parts, owners & here)
        about[int(name)] = (state, newest, rule.endpoint_of(owners, here))
    view = load_view(
        now_ms, states, live_of, load_flat, skipped, booked=count_bookings(replies, now_ms, skipped)
    )
    frozen: dict[int, frozenset[str]] = {}  # one copy per set: most engines share their shard's
    for engine, (state, newest, endpoint) in about.items():
        load = view.engines[engine]
        load.state, load.seq, load.endpoint = state, newest, endpoint
        here = live_of[engine]
        if (live := frozen.get(id(here))) is None:
            live = frozen[id(here)] = frozenset(here)
        load.live_writers = live
    return view, now_kept


def _newest_seq(
    seqs: list[dict[str, int]], parts: list[tuple[int, int]], writers: Iterable[str]
) -> int | None:
    """The newest sequence number of *writers* in the shards of an engine's *parts* (None: none)."""
    found = [n for at, _ in parts for w in writers if (n := seqs[at].get(w)) is not None]
    return max(found, default=None)


def _seqs(flat: Any) -> dict[str, int]:
    """Writers' entries of a seq hash, read flat (writer -> its last applied sequence number,
    flush.lua), as writer -> that number; what does not parse (a tombstone ``x<seq>:<ms>`` of a
    writer gc removed, garbage, a key of the wrong type) is left out: only ``seq`` depends on it."""
    if flat.__class__ is not list:
        return {}
    return {
        w: int(text)
        for w, text in zip(flat[0::2], flat[1::2])
        if text.__class__ is str and text.isascii() and text.isdigit()
    }


def count_bookings(replies: list[ShardReply], now_ms: float, skipped: Skipped) -> dict[int, int] | None:
    """Per engine, the bookings that count at server time *now_ms*: stored in the shards'
    ``bookings`` hashes, not past their bounded time, of a router whose lease (its score in the
    ``routers`` zset) has not ended. None when the read did not fetch bookings; a booking that
    cannot be read is skipped and counted (``bad_booking``)."""
    if all(r.bookings is None for r in replies):
        return None
    counts: dict[int, int] = {}
    for reply in replies:
        if (why := unreadable(reply.routers)) is not None:
            skipped.note(why, reply.keys.routers)
            continue
        if (why := unreadable(reply.bookings)) is not None:
            skipped.note(why, reply.keys.bookings)
            continue
        flat = reply.routers or []
        leases = {r: float(end) for r, end in zip(flat[0::2], flat[1::2])}
        bad = add_bookings(counts, (reply.bookings or [])[1::2], leases, now_ms)
        for _ in range(bad):
            skipped.note("bad_booking", reply.keys.bookings)
    return counts


def add_bookings(
    counts: dict[int, int], stored: Iterable[Any], leases: Mapping[str, float], now_ms: float
) -> int:
    """Add to *counts* (engine -> bookings) the *stored* bookings (the values of a bookings hash)
    that count at server time *now_ms*: not past their bound, of a router whose lease (*leases*:
    router -> its end, ms) has not ended; how many could not be read."""
    bad = 0
    for text in stored:
        booking = codec.decode_booking(text)
        if booking is None:
            bad += 1
        elif booking.ends_ms > now_ms and leases.get(booking.router, 0.0) > now_ms:
            counts[booking.engine] = counts.get(booking.engine, 0) + 1
    return bad


def load_view(
    now_ms: float,
    engines: Mapping[int, tuple[bool, float]],
    live: Mapping[int, set[str]],
    load_flat: list[Any],
    skipped: Mapping[str, int] | None = None,
    *,
    booked: Mapping[int, int] | None = None,
) -> LoadView:
    """The view of one read: *engines* (engine -> (up, age of its heartbeat in s), as the
    reader judged them), *live* (engine -> the writers whose values in it count, by the
    reader's rule), *load_flat* (the load hashes' fields and values, flat; several shards'
    concatenated). An entry of a writer not live in its engine, or of an engine not up, is not
    counted; one that cannot be read is skipped and counted as ``bad_entry``. *booked*: the
    bookings that count, by engine (:func:`count_bookings`); an engine up gets its number (0
    without one), one not up None."""
    skipped = dict(skipped or {})
    found, bad = _live_entries(live, load_flat)
    if bad:
        skipped["bad_entry"] = skipped.get("bad_entry", 0) + bad
    out: dict[int, EngineLoad] = {}
    for engine, (up, beat_age) in engines.items():
        entries = found.get(engine) if up else None
        out[engine] = (
            _engine_load(engine, up, beat_age, entries, now_ms)
            if entries
            else EngineLoad(engine, up, beat_age)
        )
        if up and booked is not None:
            out[engine].booked = booked.get(engine, 0)
    return LoadView(now_ms / 1000.0, out, skipped)


def _live_entries(
    live: Mapping[int, set[str]], load_flat: list[Any]
) -> tuple[dict[int, list[LoadEntry]], int]:
    """The entries of the live writers by engine, and how many fields could not be read."""
    bad = 0
    found: dict[int, list[LoadEntry]] = {}
    for name, entry in zip(load_flat[0::2], decode_entries(load_flat[1::2])):
        engine_text, sep, writer = name.partition("|") if name.__class__ is str else ("", "", "")
        if entry is None or not sep or not (engine_text.isdigit() and engine_text.isascii()):
            bad += 1
            continue
        engine = int(engine_text)
        if writer in live.get(engine, ()):
            held = found.get(engine)
            if held is None:
                found[engine] = [entry]
            else:
                held.append(entry)
    return found, bad


def engine_load(
    engine: int, up: bool, beat_age: float, entries: list[LoadEntry], now_ms: float
) -> EngineLoad:
    """*engine*'s load from *entries* (its live writers' entries, read at server time *now_ms*), as
    a read of the whole feed rolls them up; without an entry (or not *up*), its fields are None and
    its age *beat_age*."""
    if not up or not entries:
        return EngineLoad(engine, up, beat_age)
    return _engine_load(engine, up, beat_age, entries, now_ms)


def _engine_load(
    engine: int, up: bool, beat_age: float, entries: list[LoadEntry], now_ms: float
) -> EngineLoad:
    """An engine's load from its live writers' entries (at least one)."""
    newest = max(e.stored_ms for e in entries)
    age = max(0.0, (now_ms - newest) / 1000.0)
    load = EngineLoad(engine, up, age, writers=len(entries))
    if len(entries) == 1:  # one writer: its values are the roll-up of any mode
        load.set_values(entries[0].values)
    else:
        load.set_values(_rolled_up(entries))
    return load


def _rolled_up(entries: list[LoadEntry]) -> list[float | None]:
    """Every field of several writers' entries: a gauge rolled up by its mode, a rate summed."""
    values: list[float | None] = [None] * len(FIELDS)
    if entries[0].modes == 0:
        _most_recent_gauges(entries, values)
    else:
        for i in _GAUGE_AT:
            readings = [(e.stamp_ms, v, "") for e in entries if (v := e.values[i]) is not None]
            values[i] = roll_up(entries[0].mode(i), readings) if readings else None
    for i in _SUMMED_AT:
        summed = [v for e in entries if (v := e.values[i]) is not None]
        values[i] = float_sum(summed) if summed else None
    return values


def _most_recent_gauges(entries: list[LoadEntry], values: list[float | None]) -> None:
    """Every gauge field mostrecent (vLLM's) into *values*: the newest entry's, field by field
    the newest that reports it (roll_up's rule: the first of equal stamps in read order; an older
    writer's entry, without the fields appended since, reports none of them)."""
    ordered = sorted(entries, key=_stamp, reverse=True)
    for i in _GAUGE_AT:
        values[i] = next((x for e in ordered if (x := e.values[i]) is not None), None)


_MAX = 1.7976931348623157e308
_stamp = operator.attrgetter("stamp_ms")


def _few(items: list[Any], shown: int = 10) -> str:
    """*items* in a message: the first *shown*, and how many more."""
    text = ", ".join(map(str, items[:shown]))
    return text + (f" and {len(items) - shown} more" if len(items) > shown else "")
