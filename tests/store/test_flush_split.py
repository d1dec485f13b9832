"""A flush of more changes than one call carries (issue 33): no call above 3,999 words (keys and
arguments with ``EVALSHA``, its SHA and the key count: ElastiCache Serverless refuses a request
of more), each part a batch of its own, exactly once, and every total exact after it — also when
a part's answer is lost, Redis stops between two parts, or the store loses its data between them.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
import redis
import redis.asyncio

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats._scripts import load_script
from redis_stats.catalog import Catalog
from tests.server.test_load_feed import LOAD, record
from tests.server.test_load_feed import catalog as load_catalog

LIMIT = 3_999
# 50,000 series, one chunk per engine: before the split one call of ~16,000 words (K = 1), or
# ~5,300 per shard (K = 3).
ENGINES, PER_ENGINE = 2_000, 25
FLUSH_SHA = hashlib.sha1(load_script("flush").encode()).hexdigest()


def _catalog() -> Catalog:
    cat = Catalog()
    cat.counter("requests", "Finished requests.", labels=["reason"])
    cat.histogram("latency_seconds", "Request latency.", buckets=[0.1, 1.0])
    return cat


def _cfg(namespace: str, url: str, **kw: Any) -> StatsConfig:
    return StatsConfig(url=url, namespace=namespace, **kw)


class Counting(redis.Redis):
    """A client that counts the words of every flush call it sends, and can make one fail
    (*fail*: the call number, from 1, and how: ``before`` it runs, ``after`` it ran — its
    answer lost — or ``flush`` — the store loses everything first)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.calls: list[int] = []
        self.fail: tuple[int, str] | None = None

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args and args[0] == "HSET":  # the load lane's calls
            self.calls.append(len(args))
        if args and args[0] == "EVALSHA" and args[1] == FLUSH_SHA:
            self.calls.append(len(args))
            if self.fail is not None and self.fail[0] == len(self.calls):
                how = self.fail[1]
                if how == "before":
                    raise redis.ConnectionError("cut off before the call (test)")
                if how == "flush":
                    super().execute_command("FLUSHALL")
                elif how == "after":
                    super().execute_command(*args, **options)
                    raise redis.ConnectionError("answer lost (test)")
        return super().execute_command(*args, **options)


def _record(w: StatsWriter, engines: range, n: int) -> None:
    for e in engines:
        child = w.counter("requests")
        for i in range(PER_ENGINE - 1):
            child.labels(engine=e, reason=f"r{i}").inc(n * (e + i + 1))
        w.histogram("latency_seconds").labels(engine=e).observe(0.5)


def _check_exact(url: str, namespace: str, rounds: int, shards: int = 1) -> None:
    snap = StatsReader(_cfg(namespace, url, shards=shards), _catalog()).snapshot()
    assert sorted(snap.engines) == list(range(ENGINES))
    bad = [
        (e, i)
        for e, eng in snap.engines.items()
        for i in range(PER_ENGINE - 1)
        if eng.counter("requests", f"r{i}") != rounds * (e + i + 1)
    ]
    assert not bad, f"{len(bad)} counters not exact, e.g. {bad[:3]}"
    counts = {eng.histogram("latency_seconds").count for eng in snap.engines.values()}
    assert counts == {rounds}


def _owner_writer(url: str, namespace: str, engines: int) -> tuple[StatsConfig, Counting, StatsWriter]:
    """A writer of *engines* engines with an owner (it claims them) and the load feed, on a
    client that counts its flush calls' words."""
    cfg = _cfg(namespace, url)
    client = Counting.from_url(url, decode_responses=True)
    w = StatsWriter(
        cfg, load_catalog(), engines=list(range(engines)), owner="o1", client=client, start=False, load=LOAD
    )
    return cfg, client, w


@pytest.mark.parametrize("shards", [1, 3])
def test_a_flush_of_50000_changed_series_never_sends_a_call_above_3999_words(core_server, namespace, shards):
    client = Counting.from_url(core_server.url)
    w = StatsWriter(_cfg(namespace, core_server.url, shards=shards), _catalog(), client=client, start=False)
    _record(w, range(ENGINES), 1)
    assert w.flush() and not w.pending()
    first = list(client.calls)
    assert max(first) <= LIMIT, f"a call of {max(first)} words"
    assert len(first) > shards  # one flush of 50,000 series, sent in parts
    _check_exact(core_server.url, namespace, 1, shards)
    # Every series changed again: the chunks only (names held), still in parts, still exact.
    client.calls.clear()
    _record(w, range(ENGINES), 1)
    assert w.flush() and not w.pending()
    assert max(client.calls) <= LIMIT and len(client.calls) >= shards
    _check_exact(core_server.url, namespace, 2, shards)
    assert w.close()


@pytest.mark.parametrize("how", ["after", "before", "flush"])
@pytest.mark.parametrize("shards", [1, 3])
def test_a_part_refused_loses_and_doubles_nothing(redis_server, namespace, shards, how):
    """The second part of a flush fails: its answer lost (the retry is answered
    "already applied"), cut off before it ran (retried as it is), or the store lost everything
    just before it (found behind: everything again). The parts before it stay applied, the
    writer sends what is left by the protocol, and every total is exact once: never lost, never
    doubled."""
    client = Counting.from_url(redis_server.url)
    w = StatsWriter(_cfg(namespace, redis_server.url, shards=shards), _catalog(), client=client, start=False)
    _record(w, range(ENGINES), 1)
    client.fail = (shards + 1, how)  # the first second part (K = 3: shard 0's)
    assert w.flush() is (how == "flush")  # answered "behind" (nothing applied) is an answer
    assert w.pending()
    for _ in range(4):  # the part again, then the rest (after a loss: everything, in parts)
        if w.flush() and not w.pending():
            break
    assert not w.pending()
    assert max(client.calls) <= LIMIT
    _check_exact(redis_server.url, namespace, 1, shards)
    _record(w, range(ENGINES), 1)
    assert w.flush() and not w.pending()
    _check_exact(redis_server.url, namespace, 2, shards)
    assert w.close()


def test_redis_stopped_between_two_parts(own_redis_server, namespace):
    """Redis stops (saving its data) between two parts of one flush and comes back: the first
    part is there, the rest goes with the next flushes, exactly once."""
    server = own_redis_server
    client = Counting.from_url(server.url)
    w = StatsWriter(_cfg(namespace, server.url), _catalog(), client=client, start=False)
    _record(w, range(ENGINES), 1)

    calls = 0
    original = client.execute_command

    def stopping(*args: Any, **options: Any) -> Any:
        nonlocal calls
        if args and args[0] == "EVALSHA":
            calls += 1
            if calls == 2:
                server.stop(keep_data=True)
        return original(*args, **options)

    client.execute_command = stopping  # type: ignore[method-assign]
    assert not w.flush()
    server.start()
    client.connection_pool.disconnect()
    for _ in range(4):
        if w.flush() and not w.pending():
            break
    assert not w.pending()
    assert max(client.calls) <= LIMIT
    _check_exact(server.url, namespace, 1)
    assert w.close()


def test_a_closing_flush_in_parts_closes_the_writer_with_its_last_part(redis_server, namespace):
    """close() with 50,000 series pending: every part confirmed, and the writer marked closed
    (by the last part only: a reader never sees it closed while parts are still to come)."""
    client = Counting.from_url(redis_server.url)
    w = StatsWriter(_cfg(namespace, redis_server.url), _catalog(), client=client, start=False)
    _record(w, range(ENGINES), 1)
    assert w.close()
    assert len(client.calls) > 1 and max(client.calls) <= LIMIT
    snap = StatsReader(_cfg(namespace, redis_server.url), _catalog()).snapshot()
    assert snap.writers[w.writer_id].closed
    _check_exact(redis_server.url, namespace, 1)


def test_a_writer_of_5000_engines_claims_and_feeds_the_load_in_calls_of_at_most_3999_words(
    redis_server, namespace
):
    """Claims (one word an engine) and load entries (two) of 5,000 engines do not fit one call
    either: they ride on the parts of the flush, each call within 3,999 words; every engine is
    claimed and fed, the load lane's calls are split too, and a close deletes every entry
    (with every part of its closing flush, the writer closed by the last)."""
    cfg, client, w = _owner_writer(redis_server.url, namespace, 5000)
    for e in range(5000):
        record(w, e, e, 0, 0.1)
    assert w.flush() and not w.pending() and not w.stats.errors
    assert len(client.calls) > 3 and max(client.calls) <= LIMIT
    assert client.hlen(w.keys.claims) == 5000 and client.hlen(w.keys.load) == 5000
    view = StatsReader(cfg).load()
    assert [view.engines[e].requests_running for e in (0, 2500, 4999)] == [0, 2500, 4999]
    for e in range(5000):  # every engine's numbers change: the load lane stores all of them, split too
        record(w, e, e + 1, 0, 0.1)
    client.calls.clear()
    assert w.flush_load() and not w.stats.errors
    assert len(client.calls) > 1 and max(client.calls) <= LIMIT
    assert StatsReader(cfg).load().engines[4999].requests_running == 5000
    client.calls.clear()
    assert w.close()
    assert max(client.calls) <= LIMIT and client.hlen(w.keys.load) == 0
    snap = StatsReader(cfg, load_catalog()).snapshot()
    assert snap.writers[w.writer_id].closed


class CountingAsync(redis.asyncio.Redis):
    """:class:`Counting` for the asyncio writer."""

    calls: list[int]

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if args and args[0] == "EVALSHA" and args[1] == FLUSH_SHA:
            self.calls.append(len(args))
        return await super().execute_command(*args, **options)


def test_the_asyncio_writer_sends_a_big_flush_in_parts_too(redis_server, namespace):
    from redis_stats.aio import AsyncStatsWriter

    async def scenario() -> list[int]:
        client = CountingAsync.from_url(redis_server.url)
        client.calls = []
        w = AsyncStatsWriter(_cfg(namespace, redis_server.url), _catalog(), client=client)
        _record(w, range(ENGINES), 1)  # type: ignore[arg-type]
        assert await w.flush() and not w.pending()
        calls = list(client.calls)
        assert await w.close()
        await client.aclose()
        return calls

    calls = asyncio.run(scenario())
    assert len(calls) > 1 and max(calls) <= LIMIT
    _check_exact(redis_server.url, namespace, 1)


def test_a_batch_sent_again_after_its_extras_grew_still_fits_one_call(redis_server, namespace):
    """A batch whose call is cut off goes again unchanged, but with the extras of the round that
    sends it: here 250 more engines got load entries meanwhile (500 words more). Each batch
    leaves room for the most extras a call carries, so the call sent again stays within 3,999
    words, and everything lands once. (Before: the room was this round's extras, the batch
    filled it, and the call sent again was ~500 words over: refused by a store that caps it,
    for as long as the extras stayed.)"""
    cfg, client, w = _owner_writer(redis_server.url, namespace, 500)
    for e in range(250):
        record(w, e, e, 0, 0.1)
    for e in range(500):
        for k in range(8):
            w.metric("other").labels(e, k=str(k)).inc(e + k)
    client.fail = (1, "before")
    assert not w.flush()
    for e in range(250, 500):
        record(w, e, e, 0, 0.1)
    for _ in range(4):
        if w.flush() and not w.pending():
            break
    assert not w.pending() and max(client.calls) <= LIMIT
    snap = StatsReader(cfg, load_catalog()).snapshot()
    assert [snap.engines[e].counter("other", str(3)) for e in (0, 499)] == [3, 502]
    assert client.hlen(w.keys.load) == 500
    assert w.close()
