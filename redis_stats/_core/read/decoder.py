"""The decoder: one read of a namespace (a reply per shard) as the one decoded form.

Sans-I/O (the sync and asyncio readers share it) and tolerant: a field or value that does not
parse (written by hand, or by a newer version), or a key of the wrong type, is skipped and
counted in ``Snapshot.skipped`` under the key it was read from (in its shard); it never fails
the read. Shards compose: each shard's reply is a :class:`ShardReply` that carries its own
:class:`~redis_stats.keys.Keys`; engines and writers are grouped by name across them (an engine
found in two shards, only after K changed, adds both parts up); one shard is a list of one.

:meth:`SnapshotDecoder.decode` gives a :class:`Decoded`: the snapshot's shell (time, catalogue,
writers, engines' liveness, what was skipped) and per engine its series as
:class:`~redis_stats._core.read.groups.Group` s of numbers, writers added up. The snapshot
(:meth:`Decoded.snapshot`), the collector's families and the ``/metrics`` text
(:mod:`redis_stats.prometheus.exposition`) are all made from it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any, NamedTuple

from redis_stats import codec
from redis_stats._core.read.groups import (
    Base,
    ChunkRead,
    Group,
    Layout,
    by_lines,
    disjoint,
    in_bulk,
    parse_field,
)
from redis_stats._core.read.liveness import DOWN, Liveness
from redis_stats.catalog import Catalog, MetricSpec
from redis_stats.codec import ENDPOINT_FIELD, FLUSH_FIELD, STALE_FIELD, number_text
from redis_stats.errors import CatalogError, SchemaMismatch
from redis_stats.keys import SCHEMA_VERSION, Keys
from redis_stats.snapshot import EngineSnapshot, HistogramValue, Skipped, Snapshot, WriterInfo

log = logging.getLogger("redis_stats.reader")

_INF = float("inf")

# A writer's stats hash (WriterStats.as_fields): fields holding text; every other known field
# holds a number. Unknown fields (a newer writer's) are kept as they are: nothing reads them.
_WRITER_TEXT_FIELDS = frozenset({"engines", "owner", ENDPOINT_FIELD})
_WRITER_NUMBER_FIELDS = frozenset(
    {
        "flushes",
        "lane",
        "duplicates",
        "conflicts",
        "pending",
        "dur_sum",
        "last_ok_ms",
        STALE_FIELD,
        FLUSH_FIELD,
    }
)


def _pairs(flat: Sequence[Any]) -> Iterable[tuple[Any, Any]]:
    return zip(flat[0::2], flat[1::2])


_LAYOUT = attrgetter("layout")


def unreadable(part: Any) -> str | None:
    """Why a part of a reply that should hold a key's contents (a list) does not: the key has
    the wrong type (``wrong_type``) or the read of it failed (``unreadable``); None if it is
    fine. One command of the read failing costs that key only."""
    if part.__class__ is list:
        return None
    if isinstance(part, Exception) and str(part).startswith("WRONGTYPE"):
        return "wrong_type"
    return "unreadable"


class ShardReply(NamedTuple):
    """One shard's part of a read, as it came off the wire, with the keys it was read from (see
    :class:`redis_stats._core.read.fetch.Fetch`). A part that could not be read (a key of the wrong type)
    is its error, and costs that key only."""

    keys: Keys
    now_ms: float
    engines: Any
    """The ``engines`` zset, flat ``[engine, heartbeat ms, ...]``: the engines read."""
    writers: Any
    """The ``writers`` zset, flat ``[writer, heartbeat ms, ...]`` (negative once closed)."""
    version: Any
    """The catalogue version (``""``: no catalogue yet)."""
    listed: Any
    """The shard counts listed in the catalogue's ``shards`` field (None: none)."""
    conflicts: Any
    """The ``conflicts`` hash, flat (the snapshot's read; None in the load feed's)."""
    load: Any
    """The ``load`` hash, flat (the load feed's read; None in the snapshot's)."""
    hashes: list[Any]
    """Per engine of :attr:`engines`: its hash, flat (the snapshot's), or its field names (the
    load feed's)."""
    bases: list[Any]
    """Per engine of :attr:`engines`: its base hash, flat (departed writers' totals, folded in
    by gc: the snapshot's read; empty in the load feed's)."""
    stats: list[Any]
    """Per writer of :attr:`writers`: its stats hash, flat (the snapshot's: whole; the load
    feed's: its ``stale_ms``, ``flush_ms`` and ``endpoint`` fields only)."""
    seq: Any = None
    """The seq hash, flat (writer -> ``x<seq>:<ms>``: the load feed's read; None in the
    snapshot's)."""
    bookings: Any = None
    """The bookings hash, flat (request id -> ``<engine>|<ends ms>|<router>``: the load feed's
    read; None in the snapshot's)."""
    routers: Any = None
    """The routers zset, flat (router -> the end of its lease, server ms: the load feed's read)."""


class Read(NamedTuple):
    """One consistent read of every series of a namespace: a reply per shard (shard 0 first;
    one shard: a list of one), and the catalogue: its *version* (the shards' versions) and, when
    the decoder may not hold it, the stored catalogue *meta* (flat, or the error reading it).
    *notes*: ``(reason, key)`` of what the reader could not read besides (another shard's
    catalogue)."""

    shards: list[ShardReply]
    version: Any
    meta: Any
    notes: tuple[tuple[str, str], ...] = ()


class EngineGroups(NamedTuple):
    """One engine of a read: its snapshot (liveness; no series yet) and its series, added up."""

    engine: str
    snapshot: EngineSnapshot
    groups: list[Group]


class Decoded(NamedTuple):
    """A read decoded: the snapshot without series, and every engine's series as groups."""

    shell: Snapshot
    engines: list[EngineGroups]

    def snapshot(self) -> Snapshot:
        """The snapshot, each engine's series filled in from its groups (once per read)."""
        for engine in self.engines:
            fill(engine.snapshot, engine.groups)
        return self.shell


def _number_field(name: Any) -> str | None:
    """The prefix of a writer's stats field that holds a number (``""`` for one without a
    prefix, ``"dur:"`` for a duration bucket, ...), None for a field of text or unknown."""
    if name in _WRITER_TEXT_FIELDS or not isinstance(name, str):
        return None
    prefix = name[: name.find(":") + 1]
    if name in _WRITER_NUMBER_FIELDS or prefix in ("err:", "shards_err:", "drop:", "lost:", "dur:"):
        return prefix
    return None


def _stat(name: Any, value: Any, bounds: set[float]) -> tuple[Any, str | None]:
    """One field of a writer's stats hash: (value to keep, None), or (None, why it is skipped).
    *bounds*: the duration buckets seen so far (one bound twice is a bad field)."""
    prefix = _number_field(name)
    if prefix is None:
        return value, None  # text, or unknown: a newer writer's field, read by nothing here
    if prefix == "dur:":
        bound = number_text(name[4:])
        if bound is None or float(bound) in bounds:
            return None, "bad_field"
        bounds.add(float(bound))
    text = number_text(value)
    if text is None or (prefix == "dur:" and float(text) < 0):
        return None, "bad_value"
    return text, None


def _home(homes: dict[str, tuple[str, list[Any]]], wid: str, key: str, flat: Any, skipped: Skipped) -> None:
    """Keep a writer's stats hash read from *key* as its home's when it is the first one, or
    the first one not empty; one that cannot be read is counted under its own key."""
    why = unreadable(flat)
    if why is not None:
        skipped.note(why, key)
    elif wid not in homes or (flat and not homes[wid][1]):
        homes[wid] = (key, flat)


def _float(x: Any) -> float:
    try:
        return float(x)
    except OverflowError:  # an int past a float's range (writers' counters added up)
        return _INF


def _floats(xs: Sequence[Any]) -> list[float]:
    try:
        return [*map(float, xs)]
    except OverflowError:
        return [*map(_float, xs)]


def fill(snap: EngineSnapshot, groups: list[Group]) -> None:
    """An engine's series, from its groups, as the snapshot holds them (floats)."""
    counters, histograms, gauges = snap.counters, snap.histograms, snap.gauges
    for group in groups:
        layout = group.layout
        keys = layout.keys
        for i, value in zip(layout.counters, _floats(group.counters)):
            counters[keys[i]] = value  # type: ignore[index]
        counts = _floats(group.counts) if layout.histograms else []
        for i, bounds, where, total in zip(layout.histograms, layout.bounds, layout.count_slices, group.sums):
            histograms[keys[i]] = HistogramValue(bounds, tuple(counts[where]), float(total))  # type: ignore[index]
        for i, gauge in zip(layout.gauges, group.gauges):
            if gauge is not None:
                gauges[keys[i]] = gauge  # type: ignore[index]


def judges(shards: list[ShardReply], rule: Liveness, skipped: Skipped) -> list[tuple[set[str], Liveness]]:
    """Per shard: the writers live by its heartbeats (whose gauges in its engines count: a
    writer cut off from one shard alone has its values there frozen), and the rule its engines
    are judged by: *rule*, or, when the shard's writers zset cannot be read (no writer is known
    there), each engine by its own heartbeat alone (one bad key must not take them down). The
    shard's lists that could not be read are counted here."""
    out = []
    for shard in shards:
        for part, key in ((shard.engines, shard.keys.engines), (shard.writers, shard.keys.writers)):
            why = unreadable(part)
            if why is not None:
                skipped.note(why, key)
        out.append((rule.live_in(shard.writers), rule if shard.writers.__class__ is list else rule.blind()))
    return out


def judged_by(
    parts: list[tuple[int, int]], judged: list[tuple[set[str], Liveness]]
) -> tuple[set[str], Liveness]:
    """For an engine with *parts* in some shards (``(shard, part)``): its live writers (those
    live in each such shard) and the rule that judges it (see :func:`judges`)."""
    if len(parts) == 1:
        return judged[parts[0][0]]
    here: set[str] = set()
    rule = judged[parts[0][0]][1]
    for at, _ in parts:
        live, by = judged[at]
        here |= live
        if not by.judge_owners:
            rule = by
    return here, rule


def listed_engines(
    shards: list[ShardReply], skipped: Skipped
) -> dict[str, tuple[Any, list[tuple[int, int]]]]:
    """Every engine the shards list, by name: its latest heartbeat and where it was read in each
    shard listing it (the shard's index, and the engine's in that shard's :attr:`~ShardReply.hashes`
    and :attr:`~ShardReply.bases`). A bad engine name (``"+3"`` would be a second 3) is counted
    under its listing."""
    found: dict[str, tuple[Any, list[tuple[int, int]]]] = {}
    for at, shard in enumerate(shards):
        flat = shard.engines
        if flat.__class__ is not list:
            continue  # counted by judges
        for part, (name, score) in enumerate(zip(flat[0::2], flat[1::2])):
            if not (name.__class__ is str and name.isdigit() and name.isascii() and str(int(name)) == name):
                skipped.note("bad_engine", shard.keys.engines, str(name))  # "+3", " 3", "03": a second 3
                continue
            seen = found.get(name)
            if seen is None:
                found[name] = (score, [(at, part)])
            else:
                seen[1].append((at, part))
                found[name] = (max(seen[0], score, key=float), seen[1])
    return found


class SnapshotDecoder:
    """Turns reads (:class:`Read`) into :class:`Decoded` forms and snapshots.

    Keeps what changes rarely, for the catalogue it holds: the catalogue stored in Redis (read
    again only when its version changes), the meaning of every names field (a :class:`Layout`,
    keyed by its text: it changes only when a writer adds a series, and the engines serving one
    model share it) and whether an engine's groups hold each series once. Both are plain
    dictionaries, dropped when the catalogue changes or when they hold more than twice what a
    read used; nothing to begin or end. Safe to share between threads: every entry is
    immutable, one dictionary store each, and tagged with its catalogue.
    *keys* names the keys of what is skipped (default: a namespace called ``?``). A label value
    longer than *max_label_length* characters (0: no cap) is replaced where its names field is
    parsed (:func:`~redis_stats._core.read.groups.short_label`), so every view made from a read shows
    the same shortened value, and counted in the snapshot's ``labels_replaced``.
    """

    def __init__(
        self,
        catalog: Catalog | None = None,
        *,
        stale_after: float = 30.0,
        keys: Keys | None = None,
        max_label_length: int = 0,
    ) -> None:
        self.local = catalog if catalog is not None else Catalog()
        self.stale_after_ms = stale_after * 1000.0
        self.meta_version = ""
        self.catalog = self.local
        self.keys = keys if keys is not None else Keys("?")
        self.cap = max_label_length
        self._layouts: dict[str, Layout] = {}
        self._disjoint: dict[tuple[Layout, ...], bool] = {}
        self._tags: dict[tuple[float, ...], str] = {}

    # Local specs that conflict with the stored ones (names), counted in every read's ``skipped``.
    _conflicting: tuple[str, ...] = ()

    # -- the catalogue -----------------------------------------------------------------------

    def _update_meta(self, version: str, flat: list[Any], skipped: Skipped) -> None:
        """Merge the catalogue stored in Redis (*flat*, at *version*) with the local one.

        The stored definition wins (it is the first one written, see docs/key-schema.md): stored
        series are always read with the labels they were written with. A local spec that conflicts
        with it (kind, labels, buckets, mode) is not used, and is counted in every read as
        ``skipped["catalog_conflict"]``; local specs Redis does not hold are used as they are.
        """
        if version != self.meta_version:
            stored = self._stored_specs(flat, skipped)
            conflicting = []
            base = Catalog()
            for spec in self.local:
                theirs = stored.pop(spec.name, None)
                if theirs is not None and theirs.conflicts_with(spec):
                    conflicting.append(spec.name)
                    log.warning(
                        "metric %r is stored in Redis as %s, but this reader's code defines it as %s: "
                        "shown as stored (the first definition wins); fix the code or the namespace",
                        spec.name,
                        theirs.to_json(),
                        spec.to_json(),
                    )
                try:
                    base.add(theirs if theirs is not None else spec)
                except CatalogError:
                    # A stored spec taking a local one's place whose samples would repeat another
                    # local metric's: one series printed twice is worse than one metric missing.
                    skipped.note("name_clash", self.keys.meta, "m:" + spec.name)

            # A stored spec whose samples would repeat another's (written by an older or foreign
            # writer) is left out, for the same reason.
            def clash(spec: MetricSpec, why: str) -> None:
                skipped.note("name_clash", self.keys.meta, "m:" + spec.name)

            self.catalog = base.merged(stored.values(), clash)
            self._layouts, self._disjoint, self._tags = {}, {}, {}  # made for the old catalogue
            self._conflicting = tuple(conflicting)
            self.meta_version = version
        if self._conflicting:
            skipped["catalog_conflict"] += len(self._conflicting)

    def _stored_specs(self, flat: list[Any], skipped: Skipped) -> dict[str, MetricSpec]:
        stored: dict[str, MetricSpec] = {}
        for name, value in _pairs(flat):
            if name == "schema":
                self._check_schema(value)
            if not name.startswith("m:"):
                continue
            try:
                stored[name[2:]] = MetricSpec.from_json(name[2:], value)
            except (ValueError, TypeError):
                skipped.note("bad_spec", self.keys.meta, name)
        return stored

    def _check_schema(self, stored: Any) -> None:
        """Raise :class:`SchemaMismatch` when the namespace was written in another format than
        this reader's: reading it as ours would miscount or drop series without a word."""
        if stored == SCHEMA_VERSION:
            return
        known = {
            "1": "schema 1: deltas merged into one field per series by the flush script, gauges in "
            "rs:{NS}:e:<engine>:g; written by redis_stats before issue 15",
        }
        what = known.get(str(stored), f"schema {stored!r}, which this version does not know (a newer one?)")
        raise SchemaMismatch(
            f"namespace {self.keys.namespace!r}: {self.keys.meta} says its data is in {what}; this "
            f"reader reads schema {SCHEMA_VERSION}. Read it with the redis_stats version that wrote it, "
            "or run every writer and reader of the namespace at one version (a new namespace starts "
            "afresh); nothing was read"
        )

    def _catalogue(self, read: Read, skipped: Skipped) -> Catalog:
        version, meta = read.version or "", read.meta or []
        why = unreadable(version) if version.__class__ is not str else unreadable(meta) if meta else None
        if why is not None:  # the catalogue hash itself: only the code's own catalogue is left
            skipped.note(why, read.shards[0].keys.meta if read.shards else self.keys.meta)
            version, meta = "", []
        if version == self.meta_version or meta or version == "":
            self._update_meta(version, meta, skipped)
        # else: a read planned against an older catalogue version by another thread, without
        # the catalogue itself: keep the one we hold (at least as new) rather than drop it.
        return self.catalog

    def layout(self, names: str, catalog: Catalog) -> Layout:
        """What a chunk's names field (its text) means for *catalog*, kept by the text."""
        found = self._layouts.get(names)
        if found is not None and found.catalog is catalog:
            return found
        lines = tuple(codec.chunk_lines(names))
        tags = self._tags
        cap = self.cap
        layout = Layout(catalog, lines, [parse_field(line, catalog, tags, cap) for line in lines])
        self._layouts[names] = layout  # one store of an immutable object: thread-safe
        return layout

    # -- one read ------------------------------------------------------------------------------

    def decode(self, read: Read) -> Decoded:
        """The decoded form of *read*: liveness and catalogue, and every engine's groups."""
        skipped = Skipped()
        for why, key in read.notes:
            skipped.note(why, key)
        catalog = self._catalogue(read, skipped)
        shards = read.shards
        now_ms = max(map(attrgetter("now_ms"), shards), default=0.0)
        rule, writers = self._liveness(shards, now_ms, skipped)
        judged = judges(shards, rule, skipped)
        conflicts = self._conflicts(shards, now_ms, rule.fallback_ms, skipped)
        shell = Snapshot(now_ms / 1000.0, {}, writers, catalog, skipped)
        engines: list[EngineGroups] = []
        used: set[str] = set()
        listed = listed_engines(shards, skipped)
        for name in sorted(listed, key=int):  # in engine order: one text for one store
            score, parts = listed[name]
            live, judge = judged_by(parts, judged)
            chunks, base, owners = self._contents(name, parts, shards, catalog, skipped, used)
            beat = float(score)
            state = judge.engine_state(beat, owners, live)
            snap = EngineSnapshot(int(name), beat / 1000.0, rule.age(beat), state != DOWN)
            snap.state, snap.endpoint = state, rule.endpoint_of(owners, live)
            snap.writers = rule.newest_first(owners, live)
            if state == DOWN and owners:  # stopped on purpose, or gone silent (an alert's question)
                snap.closed = all(w in writers and writers[w].closed for w in owners)
            snap.conflict = conflicts.get(name, ())
            shell.engines[snap.engine] = snap
            groups = self._groups(chunks, base, live, snap.up, catalog, skipped)
            for group in groups:
                shell.labels_replaced += group.layout.replaced
            engines.append(EngineGroups(name, snap, groups))
        self._trim(used, len(engines))
        return Decoded(shell, engines)

    def _trim(self, used: set[str], engines: int) -> None:
        """Drop what the read did not use once the caches hold more than twice what it used:
        names fields no writer holds any more, engines' sets of names fields that changed."""
        layouts = self._layouts
        if len(layouts) > 2 * len(used):
            self._layouts = {k: layouts[k] for k in used if k in layouts}
            self._disjoint = {}
        if len(self._disjoint) > 2 * engines:
            self._disjoint = {}

    def _liveness(
        self, shards: list[ShardReply], now_ms: float, skipped: Skipped
    ) -> tuple[Liveness, dict[str, WriterInfo]]:
        """The read's liveness rule, by what the writers stored, never by this reader's settings
        (issue 24: every reader of the namespace gives the same answer at the same moment), and
        every writer's entry."""
        scores, stats_of = self._writers(shards, skipped)
        rule = Liveness.of(now_ms, stats_of, self.stale_after_ms, beats=scores)
        writers = {
            wid: WriterInfo(abs(score) / 1000.0, rule.age(score), score < 0, rule.writer_live(wid, score))
            for wid, score in scores.items()
        }
        for wid, stats in stats_of.items():
            writers[wid].stats = stats
        return rule, writers

    def snapshot(self, read: Read) -> Snapshot:
        """The snapshot of *read*."""
        return self.decode(read).snapshot()

    def _contents(
        self,
        engine: str,
        parts: list[tuple[int, int]],
        shards: list[ShardReply],
        catalog: Catalog,
        skipped: Skipped,
        used: set[str],
    ) -> tuple[list[ChunkRead], list[Base], set[str]]:
        """An engine's hash and base hash (one part per shard holding it): its writers'
        well-formed chunks and its base fields (those of the base hash, and any an older gc left
        in the hash itself), each with the key it was read from, and the writers holding chunks in
        it (well-formed or not: they say who owns the engine). A chunk whose names field is
        missing or does not match its values line for line, or whose field is malformed, is
        skipped and counted (``bad_chunk``): it costs that chunk only; *used* gets the names
        fields read."""
        chunks: list[ChunkRead] = []
        base: list[Base] = []
        owners: set[str] = set()
        suffix, cut = codec.NAMES_SUFFIX, -len(codec.NAMES_SUFFIX)
        for at, j in parts:
            shard = shards[at]
            if shard.bases:  # departed writers' totals, in the engine's base hash
                base_key, flat = shard.keys.base(engine), shard.bases[j]
                why = unreadable(flat)
                if why is not None:
                    skipped.note(why, base_key)
                elif flat:
                    base += [Base(name, raw, base_key) for name, raw in zip(flat[0::2], flat[1::2])]
            key, flat = shard.keys.counters(engine), shard.hashes[j]
            why = unreadable(flat)
            if why is not None:
                skipped.note(why, key)
                continue
            held: dict[str, Any] = {}
            for name, raw in zip(flat[0::2], flat[1::2]):
                if name.__class__ is str and name.startswith(codec.CHUNK_PREFIX):
                    held[name] = raw
                else:
                    base.append(Base(name, raw, key))
            for name, values in held.items():
                if name.endswith(suffix):  # a names field: read with its values
                    if name[:cut] not in held:
                        skipped.note("bad_chunk", key, name)  # names without values
                    continue
                writer = codec.chunk_writer(name)
                names = held.get(name + suffix)
                if writer is not None:
                    owners.add(writer)
                if writer is None or names.__class__ is not str or values.__class__ is not str:
                    skipped.note("bad_chunk", key, name)
                    continue
                used.add(names)
                layout = self.layout(names, catalog)
                lines = codec.chunk_lines(values)
                if len(layout.fields) != len(lines):
                    skipped.note("bad_chunk", key, name)
                    continue
                chunks.append(ChunkRead(writer, key, layout, lines))
        return chunks, base, owners

    def _groups(
        self,
        chunks: list[ChunkRead],
        base: list[Base],
        live: set[str],
        up: bool,
        catalog: Catalog,
        skipped: Skipped,
    ) -> list[Group]:
        """The engine's series added up: in bulk when its data is clean, else line by line."""
        layouts = tuple(dict.fromkeys(map(_LAYOUT, chunks)))
        if len(layouts) > 1:  # several names fields (a writer's second chunk, or other series)
            apart = self._disjoint.get(layouts)
            if apart is None:
                apart = self._disjoint[layouts] = disjoint(layouts)
            if not apart:
                return by_lines(chunks, base, live, up, catalog, skipped, self._tags, self.cap)
        found = in_bulk(chunks, base, live, up) if chunks else None
        if found is None:
            return by_lines(chunks, base, live, up, catalog, skipped, self._tags, self.cap)
        return found

    # -- writers, liveness, conflicts ----------------------------------------------------------

    def _writers(
        self, shards: list[ShardReply], skipped: Skipped
    ) -> tuple[dict[str, float], dict[str, dict[str, str]]]:
        """Every writer listed, by id: its latest heartbeat (ms; negative once it closed), and
        the self-metrics of the shard holding them (its home: the one whose hash is not empty).
        A stats hash that cannot be read is counted under its own key."""
        scores: dict[str, float] = {}
        homes: dict[str, tuple[str, list[Any]]] = {}
        for shard in shards:
            listed = shard.writers if shard.writers.__class__ is list else []
            for (wid, score), flat in zip(_pairs(listed), shard.stats):
                score = float(score)
                if abs(score) > abs(scores.get(wid, 0.0)) or wid not in scores:
                    scores[wid] = score
                _home(homes, wid, shard.keys.writer_stats(wid), flat, skipped)
        stats = {wid: self._writer_stats(*homes.get(wid, ("", [])), skipped) for wid in scores}
        return scores, stats

    def _writer_stats(self, key: str, flat: list[Any], skipped: Skipped) -> dict[str, str]:
        """A writer's stats hash (*flat*, as read from *key*), its malformed fields dropped and
        counted (the self-metrics built from it must not fail a scrape)."""
        out: dict[str, str] = {}
        bounds: set[float] = set()
        for name, value in _pairs(flat):
            text, why = _stat(name, value, bounds)
            if why is not None:
                skipped.note(why, key, name)
            else:
                out[name] = text
        return out

    def _conflicts(
        self, shards: list[ShardReply], now_ms: float, window_ms: float, skipped: Skipped
    ) -> dict[str, tuple[str, ...]]:
        """Engines claimed by two live owners within *window_ms* (the namespace's stale_after):
        engine -> (owner a, owner b).
        An engine with an entry in two shards (K changed: its old shard and its new one) shows
        the newer."""
        out: dict[str, tuple[str, ...]] = {}
        seen_ms: dict[str, float] = {}
        for shard in shards:
            key = shard.keys.conflicts
            why = unreadable(shard.conflicts)
            if why is not None:
                skipped.note(why, key)
                continue
            for engine, text in _pairs(shard.conflicts):
                parts = str(text).split("|")
                if len(parts) < 3 or number_text(parts[-1]) is None:
                    skipped.note("bad_value", key, str(engine))
                    continue
                ms = float(parts[-1])
                if now_ms - ms <= window_ms and ms >= seen_ms.get(engine, -_INF):
                    out[engine] = tuple(parts[:-1])
                    seen_ms[engine] = ms
        return out
