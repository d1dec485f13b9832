"""The load feed's read without its I/O: the load hashes, the engines and the writers only.

One read of the feed (:meth:`redis_stats.reader.StatsReader.load`, and its asyncio twin) is
the steps of :meth:`LoadRead.steps`: on a single server one transaction of native reads covers
every shard, planned from the last read's lists as the snapshot's transaction read is; on a
Cluster (or over ``maxmemory``, or when the fleet changes faster than it is read) one
``load_read.lua`` per shard. Their replies are decoded into a :class:`~redis_stats.load.LoadView`
by :meth:`LoadRead.view`, with the rule every reader applies
(:class:`~redis_stats._core.liveness.Liveness`): so ``/load``, ``/snapshot`` and
``redis_stats_engine_up`` never disagree. The numbers themselves are :mod:`redis_stats.load`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from redis.exceptions import ExecAbortError, OutOfMemoryError

from redis_stats._core import fields
from redis_stats._core.decoder import unreadable
from redis_stats._core.liveness import Liveness
from redis_stats._core.slices import Engines, is_among
from redis_stats._core.steps import Steps
from redis_stats.config import StatsConfig
from redis_stats.connection import flat_reply
from redis_stats.errors import refused_for_memory
from redis_stats.keys import Keys
from redis_stats.load import LoadView, load_view

Plan = tuple[tuple[str, ...], tuple[str, ...]]  # (engines, writers) a transaction read asks for
# One read of the feed without its I/O: yields (what, argument) steps, is sent their results,
# returns the view.
LoadSteps = Steps[LoadView]


class Fleet(Protocol):
    """What the load feed's read needs of the reader it reads for: its shards, and the K values
    a writer lists in shard 0's catalogue (see :class:`redis_stats.reader.ReaderCore`)."""

    config: StatsConfig

    @property
    def shard_keys(self) -> list[Keys]:
        """The keys of every shard the reader reads."""
        ...

    def note_layouts(self, meta_flat: Any) -> bool:
        """Take the K values listed in shard 0's catalogue *meta_flat*; True if one is new."""
        ...


class LoadRead:
    """What one reader keeps from a read of the load feed to the next: each shard's plan (the
    engines and writers its last transaction found) and each engine's chunk writers, kept by
    its chunk fields' names."""

    def __init__(self) -> None:
        self._plans: dict[str, Plan] = {}  # per shard (its root)
        self._owners: dict[tuple[str, ...], frozenset[str]] = {}  # chunk fields -> writers

    def steps(self, fleet: Fleet, engines: Engines = None, cluster: bool = False) -> LoadSteps:
        """The steps of one read of the load feed of *fleet*, ending with the :class:`LoadView`
        (of *engines* only, when given). On a single server one transaction of native reads
        covers every shard (``("transaction", commands)``); on a Cluster (or over
        ``maxmemory``, or when the fleet changes faster than it is read) one ``load_read.lua``
        per shard (``("load", calls)``). Shards a writer listed in shard 0's catalogue and the
        fleet did not know are read at once, as the snapshot read does."""
        for _ in range(2):
            shards = fleet.shard_keys
            replies = None if cluster else (yield from self._transaction_steps(shards))
            if replies is None:
                calls: list[tuple[list[str], list[str]]] = [
                    ([k.engines, k.writers, k.load, k.meta], [k.prefix]) for k in shards
                ]
                replies = yield ("load", calls)
            listed = replies[0][4] if replies else None
            if not (listed.__class__ is str and fleet.note_layouts(["shards", listed])):
                break
        assert replies is not None
        return self.view(replies, engines, fleet.config.stale_after)

    def _transaction_steps(self, shards: list[Keys]) -> Steps[list[Any] | None]:
        """The load feed read as one transaction per try (three at most, replanned when the
        fleet changed): its replies, or None when the plans kept changing or the server refused
        the transaction over ``maxmemory``."""
        try:
            for _ in range(3):
                plans = [self._plans.get(k.root, ((), ())) for k in shards]
                results = yield ("transaction", self.transaction(shards, plans))
                replies = self.assemble(results, shards, plans)
                if replies is not None:
                    return replies
        except (OutOfMemoryError, ExecAbortError) as exc:
            if not refused_for_memory(exc):
                raise
        return None

    def transaction(self, shards: list[Keys], plans: list[Plan]) -> list[tuple[Any, ...]]:
        """The commands of one transaction read of the load feed: each shard's lists and load
        hash, then per planned writer its ``stale_ms`` and per planned engine its hash's field
        names (``HKEYS``: never a value)."""
        cmds: list[tuple[Any, ...]] = [("MULTI",), ("TIME",)]
        for k in shards:
            cmds += [
                ("ZRANGE", k.engines, 0, -1, "WITHSCORES"),
                ("ZRANGE", k.writers, 0, -1, "WITHSCORES"),
                ("HGETALL", k.load),
                ("HGET", k.meta, "shards"),
            ]
        for k, (engine_list, writer_list) in zip(shards, plans):
            cmds += [("HGET", k.writer_stats(w), "stale_ms") for w in writer_list]
            cmds += [("HKEYS", k.counters(e)) for e in engine_list]
        cmds.append(("EXEC",))
        return cmds

    def assemble(self, results: list[Any], shards: list[Keys], plans: list[Plan]) -> list[list[Any]] | None:
        """The EXEC results of :meth:`transaction` as one ``load_read.lua``-shaped reply per
        shard, or None when a shard's lists differ from its plan (the new plans are kept)."""
        results = [flat_reply(r) for r in results]
        now = results[0]
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        at = 1 + 4 * len(shards)
        out, stale = [], False
        for i, (k, (engine_list, writer_list)) in enumerate(zip(shards, plans)):
            engine_flat, writer_flat, flat, listed = results[1 + 4 * i : 5 + 4 * i]
            found = (
                tuple(engine_flat[0::2]) if engine_flat.__class__ is list else (),
                tuple(writer_flat[0::2]) if writer_flat.__class__ is list else (),
            )
            stale_ms = results[at : at + len(writer_list)]
            at += len(writer_list)
            # every field name: view takes the chunk writers out (the other names give none)
            owners = [n if n.__class__ is list else [] for n in results[at : at + len(engine_list)]]
            at += len(engine_list)
            if found != (engine_list, writer_list):
                self._plans[k.root] = found
                stale = True
                continue
            out.append([now_ms, engine_flat, writer_flat, flat, listed, stale_ms, owners])
        return None if stale else out

    def view(self, replies: list[Any], engines: Engines, stale_after: float) -> LoadView:
        """The :class:`LoadView` of ``load_read.lua``'s replies (one per shard, shard 0 first).

        ``up``, and the writers whose entries count in each engine, are decided by the rule
        every reader applies (:class:`~redis_stats._core.liveness.Liveness`, on what the
        writers stored: their heartbeats, their own ``stale_ms``, the engine's chunk writers;
        *stale_after*: the configured seconds), with the writers live in the engine's own
        shard(s), as the snapshot decodes them."""
        skipped: dict[str, int] = {}

        def skip(why: str) -> None:
            skipped[why] = skipped.get(why, 0) + 1

        now_ms = max(float(r[0]) for r in replies)
        stats: dict[str, dict[str, str]] = {}
        load_flat: list[Any] = []
        judge = False
        # engine text -> [newest heartbeat, chunk writers, shards it was read from]
        found: dict[str, list[Any]] = {}
        kept = self._owners
        now_kept: dict[tuple[str, ...], frozenset[str]] = {}
        for at, reply in enumerate(replies):
            engine_flat, writer_flat, flat, stale, owners = reply[1], reply[2], reply[3], reply[5], reply[6]
            for part in (engine_flat, writer_flat, flat):
                if part.__class__ is not list:  # a key of the wrong type: the others are shown
                    skip(unreadable(part) or "unreadable")
            if flat.__class__ is list:
                load_flat += flat
            if writer_flat.__class__ is list:
                judge = True
                _note_stale_ms(stats, writer_flat, stale)
            if engine_flat.__class__ is list:
                _note_engines(found, at, engine_flat, owners, kept, now_kept)
        self._owners = now_kept  # one store: a read at once keeps its own
        rule = Liveness.of(now_ms, stats, stale_after * 1000.0, judge_owners=judge)
        live_in = [rule.live_in(reply[2]) for reply in replies]
        states, live = _engine_states(found, rule, live_in, engines, skip)
        return load_view(now_ms, states, live, load_flat, skipped)


def _note_stale_ms(stats: dict[str, dict[str, str]], writer_flat: list[Any], stale: list[Any]) -> None:
    """Each listed writer in *stats*, with its own ``stale_ms`` where it stored one."""
    for wid, ms in zip(writer_flat[0::2], stale):
        if ms.__class__ is str:
            stats.setdefault(wid, {})["stale_ms"] = ms
        else:
            stats.setdefault(wid, {})


def _note_engines(
    found: dict[str, list[Any]],
    at: int,
    engine_flat: list[Any],
    owners: list[Any],
    kept: dict[tuple[str, ...], frozenset[str]],
    now_kept: dict[tuple[str, ...], frozenset[str]],
) -> None:
    """Add shard *at*'s engines to *found*: their newest heartbeat, their chunk writers (from
    their field names), the shards they were read from."""
    for engine, score, held in zip(engine_flat[0::2], engine_flat[1::2], owners):
        # An engine's chunk fields change only when a writer comes or goes: their
        # writers are kept by the fields' text, for the next read (this read's only).
        names = tuple(held)
        writers_of = kept.get(names)
        if writers_of is None:
            writers_of = frozenset(
                w for name in names if name.__class__ is str and (w := fields.chunk_writer(name)) is not None
            )
        now_kept[names] = writers_of
        seen = found.get(engine)
        if seen is None:
            found[engine] = [float(score), writers_of, [at]]
            continue
        seen[0] = max(seen[0], float(score))
        seen[1] = seen[1] | writers_of
        seen[2].append(at)


def _engine_states(
    found: dict[str, list[Any]],
    rule: Liveness,
    live_in: list[set[str]],
    engines: Engines,
    skip: Callable[[str], None],
) -> tuple[dict[int, tuple[bool, float]], dict[int, set[str]]]:
    """Per engine of *found* (of *engines* only, when given): (up, age) and the writers live in
    it, by *rule*; an engine whose index is not a canonical integer is skipped (counted)."""
    keep = None if engines is None else is_among(engines)
    states: dict[int, tuple[bool, float]] = {}
    live: dict[int, set[str]] = {}
    for engine_text, (score, owners_of, where) in found.items():
        if keep is not None and not keep(engine_text):
            continue
        engine = _engine_index(engine_text)
        if engine is None:
            skip("bad_engine")
            continue
        here = live_in[where[0]] if len(where) == 1 else set().union(*(live_in[at] for at in where))
        states[engine] = (rule.engine_up(score, owners_of, here), rule.age(score))
        live[engine] = here
    return states, live


def _engine_index(text: str) -> int | None:
    """An engine's index from its listed name; None for anything but a canonical integer >= 0
    ("+3" or " 3" would be a second 3)."""
    try:
        engine = int(text)
    except ValueError:
        return None
    return engine if engine >= 0 and str(engine) == text else None
