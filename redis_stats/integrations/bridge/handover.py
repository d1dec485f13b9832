"""What earlier bridge processes stored of a source: the totals a new bridge process continues.

The store's view of a series is the sum of every writer's part (and of what gc folded in from
departed writers). For the run of the source that is going on, the parts of the bridge writers
that bridged it add up, after each stored scrape, to the source's value at that scrape. A bridge
process that starts while its source keeps running must continue from that value, recording
only what came since; starting from zero would count the source a second time.

No one writer's chunks hold that value: the newest writer holds only what came since *it*
started (issue 32: taking its chunks as the base counted the source again from the third
bridge on). So each bridge writer leaves a **handover record** before its first flush: its
*base* (what the writers before it held of the source's run, per series) and the source's
``process_start_time_seconds``. A new writer's base is the newest writer's record plus that
writer's own chunks: exact after any number of restarts, clean or kill -9, and whatever gc folded
of the earlier writers meanwhile (a record is taken when its writer starts; folding a departed
writer into the base fields leaves the view's sum as it was).

Records are fields of the hash ``bridges`` of the writer's home shard (docs/key-schema.md),
named ``<owner digest>|<writer id>``, the value JSON. Once a writer's first flush is confirmed,
the records of its owner's earlier writers are deleted (only the newest writer's is ever read),
so a source leaves one record, however often it was bridged.

No base (the new writer starts from zero): no earlier writer of the owner is in the namespace
(none ever, or gc collected them and their engines: the view forgot them too), or the source
restarted since the newest one's last scrape (a counter or bucket below the base, or another
``process_start_time_seconds`` than the record's). A newest writer without a record (a bridge
of an earlier version, or the record lost) is continued from the chunks of the owner's writers,
newest first, as far back as the source's values do not go below them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from redis_stats import codec
from redis_stats.catalog import COUNTER, HISTOGRAM
from redis_stats.config import StatsConfig
from redis_stats.keys import Keys, shard_of

from .body import Body

__all__ = ["Predecessor", "find_predecessor", "forget_earlier", "write_record"]

# (name, engine before the offset, label values in spec order)
SeriesId = tuple[str, int, tuple[str, ...]]
Counters = dict[SeriesId, int | float]
Hists = dict[SeriesId, tuple[float, list[int]]]


class Predecessor:
    """The newest earlier writer of this source: its id, and the source's totals as the writers
    up to it hold them (``counters``: a number; ``hists``: ``(sum, per-bucket counts)``)."""

    def __init__(self, writer_id: str, start_time: float | None, recorded: bool) -> None:
        self.writer_id = writer_id
        self.start_time = start_time
        self.recorded = recorded
        """Whether the writer left a handover record (else the chunks of the writers before it
        are walked, :func:`find_predecessor`)."""
        self.counters: Counters = {}
        self.hists: Hists = {}

    def below(self, body: Body) -> str | None:
        """Why *body* cannot continue these totals (another run of the source), or None."""
        if None not in (body.start_time, self.start_time) and body.start_time != self.start_time:
            return f"process_start_time_seconds is {body.start_time!r}, it was {self.start_time!r}"
        for name, fam in body.families.items():
            for (engine, values), value in fam.series.items():
                key = (name, engine, values)
                if fam.spec.kind == COUNTER and value < self.counters.get(key, 0):
                    return f"counter {name!r} is below what the bridge stored before"
                if fam.spec.kind == HISTOGRAM and key in self.hists:
                    counts = self.hists[key][1]
                    if len(counts) != len(value[1]) or any(n < o for n, o in zip(value[1], counts)):
                        return f"histogram {name!r} is below what the bridge stored before"
        return None

    def plus(self, older: Predecessor) -> Predecessor:
        """These totals and *older*'s (a writer before this one) together, under this id."""
        out = Predecessor(self.writer_id, self.start_time or older.start_time, self.recorded)
        for part in (self, older):
            for key, number in part.counters.items():
                out.add_counter(key, number)
            for key, (total, counts) in part.hists.items():
                out.add_histogram(key, total, counts)
        return out

    def add_counter(self, key: SeriesId, number: int | float) -> None:
        """Add one writer's part of a counter."""
        self.counters[key] = self.counters.get(key, 0) + number

    def add_histogram(self, key: SeriesId, total: float, counts: list[int]) -> None:
        """Add one writer's part of a histogram (other bucket bounds are not the same run)."""
        old = self.hists.get(key)
        if old is None:
            self.hists[key] = (total, counts)
        elif len(old[1]) == len(counts):
            self.hists[key] = (old[0] + total, [a + b for a, b in zip(old[1], counts)])


def _text(x: Any) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def home_keys(config: StatsConfig, engines: set[int]) -> Keys:
    """The keys of the shard a writer of *engines* (before the offset) keeps its self-metrics
    and handover record in (the writer's home: the lowest of its engines' shards)."""
    offset, k = config.engine_offset, config.shards
    home = min((shard_of(e + offset, k) for e in engines), default=0)
    return Keys(config.namespace).shard(home, k)


def record_field(owner: str, writer_id: str) -> str:
    """The field of *writer_id*'s record in the ``bridges`` hash: the owner's digest first, so
    a bridge finds and deletes its own source's records without reading anyone else's."""
    return _digest(owner) + "|" + writer_id


def _digest(owner: str) -> str:
    return hashlib.sha1(owner.encode()).hexdigest()[:16]


def find_predecessor(client: Any, config: StatsConfig, owner: str, body: Body) -> Predecessor | None:
    """The newest writer of *owner* in the namespace, with the source's totals as the writers up
    to it hold them, for *body*'s engines; None when there is none. Redis errors are raised.

    The newest writer's record plus its chunks, when it has a record. Without one (an earlier
    version's bridge, the record lost), the chunks of the owner's writers, newest first, for as
    long as *body* does not go below their sum (an older one holds an earlier run of the source)
    and down to the first that has a record."""
    home = home_keys(config, body.engines())
    kinds = {name: fam.spec.kind for name, fam in body.families.items()}
    hashes: dict[int, dict[str, str]] = {}  # engine hashes read so far (one read each)
    found: Predecessor | None = None
    for writer_id in _owner_writers(client, home, owner):
        record = _parse_record(client.hget(home.bridges, record_field(owner, writer_id)), owner)
        part = _holdings(client, config, writer_id, record, body, kinds, hashes)
        if found is None:
            found = part
        else:
            merged = found.plus(part)
            if merged.below(body) is not None:
                break  # this writer (and those before it) bridged an earlier run of the source
            found = merged
        if record:
            break  # its record holds what every writer before it held
    return found


def _holdings(
    client: Any,
    config: StatsConfig,
    writer_id: str,
    record: dict[str, Any],
    body: Body,
    kinds: dict[str, str],
    hashes: dict[int, dict[str, str]],
) -> Predecessor:
    """What *writer_id*'s record (its base) and its chunks hold of the source, per series."""
    found = Predecessor(writer_id, record.get("start_time"), bool(record))
    offset = config.engine_offset
    for name, engine, values, number in record.get("counters", []):
        found.add_counter((name, engine - offset, tuple(values)), number)
    for name, engine, values, total, counts in record.get("hists", []):
        found.add_histogram((name, engine - offset, tuple(values)), total, counts)
    # Its chunks: in every engine it wrote (as its stats say), or the record had, or the body has.
    home = home_keys(config, body.engines())
    listed = _text(client.hget(home.writer_stats(writer_id), "engines") or "")
    engines = {e + offset for e in body.engines()} | {int(e) for e in listed.split(",") if e.isdigit()}
    engines |= {e for key in ("counters", "hists") for _n, e, *_ in record.get(key, [])}
    for engine in sorted(engines):
        if engine not in hashes:
            keys = Keys(config.namespace).shard(shard_of(engine, config.shards), config.shards)
            hashes[engine] = {_text(f): _text(v) for f, v in client.hgetall(keys.counters(engine)).items()}
        for names_text, values_text in _chunks_of(hashes[engine], writer_id):
            _read_chunk(
                found, kinds, engine - offset, codec.chunk_lines(names_text), codec.chunk_lines(values_text)
            )
    return found


def _owner_writers(client: Any, home: Keys, owner: str) -> Iterator[str]:
    """The writers of *owner*, newest heartbeat first. A writer is the owner's when it left a
    record under the owner's digest or its self-metrics say so (read as the walk needs them)."""
    prefix = _digest(owner) + "|"
    recorded = {_text(f)[len(prefix) :] for f in client.hkeys(home.bridges) if _text(f).startswith(prefix)}
    scored = client.zrange(home.writers, 0, -1, withscores=True)
    for raw_id, _score in sorted(scored, key=lambda item: -abs(item[1])):
        wid = _text(raw_id)
        if ":bridge:" not in wid:
            continue
        if wid in recorded or _text(client.hget(home.writer_stats(wid), "owner") or "") == owner:
            yield wid


def _parse_record(raw: Any, owner: str) -> dict[str, Any]:
    """A record's content; ``{}`` when there is none or it cannot be read (another owner's
    under a colliding digest, garbage): the chunks alone are the base then."""
    if raw is None:
        return {}
    try:
        record = json.loads(_text(raw))
        if not isinstance(record, dict) or record.get("owner") != owner:
            return {}
        for key, size in (("counters", 4), ("hists", 5)):
            entries = record.get(key, [])
            if not isinstance(entries, list) or any(not _entry_ok(e, size) for e in entries):
                return {}
        start = record.get("start_time")
        if start is not None and not isinstance(start, (int, float)):
            return {}
        return record
    except ValueError:
        return {}


def _entry_ok(entry: Any, size: int) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == size
        and isinstance(entry[0], str)
        and isinstance(entry[1], int)
        and isinstance(entry[2], list)
        and all(isinstance(v, str) for v in entry[2])
        and isinstance(entry[3], (int, float))
        and (size == 4 or (isinstance(entry[4], list) and all(isinstance(c, int) for c in entry[4])))
    )


def write_record(
    client: Any,
    config: StatsConfig,
    writer_id: str,
    owner: str,
    start_time: float | None,
    base: Predecessor | None,
    engines: set[int],
) -> None:
    """Store *writer_id*'s record: *base*'s totals (none: it starts from zero) and the source's
    start time. Called before the writer's first flush, so a writer in the namespace always has
    one (a kill -9 in between leaves a record of no writer, deleted by the next bridge)."""
    offset = config.engine_offset
    record: dict[str, Any] = {"owner": owner, "start_time": start_time, "counters": [], "hists": []}
    if base is not None:
        record["counters"] = [[n, e + offset, list(v), x] for (n, e, v), x in base.counters.items()]
        record["hists"] = [[n, e + offset, list(v), s, c] for (n, e, v), (s, c) in base.hists.items()]
    home = home_keys(config, engines)
    client.hset(home.bridges, record_field(owner, writer_id), json.dumps(record))


def forget_earlier(client: Any, config: StatsConfig, writer_id: str, owner: str, engines: set[int]) -> None:
    """Delete the records of *owner*'s writers but *writer_id* (whose first flush is confirmed:
    it is the newest now, the only one a next bridge reads)."""
    home = home_keys(config, engines)
    mine = record_field(owner, writer_id)
    prefix = _digest(owner) + "|"
    stale = [f for f in map(_text, client.hkeys(home.bridges)) if f.startswith(prefix) and f != mine]
    if stale:
        client.hdel(home.bridges, *stale)


def _chunks_of(stored: dict[str, str], writer_id: str) -> list[tuple[str, str]]:
    """The (names, values) texts of *writer_id*'s chunks among an engine's counter fields."""
    prefix = codec.chunk_field(writer_id, 0)[: -len("0")]
    chunks = []
    for field, values_text in stored.items():
        if not field.startswith(prefix) or field.endswith(codec.NAMES_SUFFIX):
            continue
        names_text = stored.get(field + codec.NAMES_SUFFIX)
        if names_text is not None:
            chunks.append((names_text, values_text))
    return chunks


def _read_chunk(
    found: Predecessor, kinds: dict[str, str], engine: int, names: list[str], values: list[str]
) -> None:
    if len(names) != len(values):
        return  # not a chunk this version wrote: nothing to continue from
    for name_field, text in zip(names, values):
        try:
            parts = codec.decode(name_field)
            kind = kinds.get(parts[0])
            if kind == COUNTER:
                found.add_counter((parts[0], engine, tuple(parts[1:])), codec.counter_total(text))
            elif kind == HISTOGRAM:
                total, counts = codec.histogram_counts(text)
                found.add_histogram((parts[0], engine, tuple(parts[1:-1])), total, counts)
        except (ValueError, IndexError):
            continue  # one bad line costs that series only
