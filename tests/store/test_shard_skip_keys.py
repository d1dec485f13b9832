"""What a reader skips in a sharded namespace is reported under the key it was read from
(docs/key-schema.md, "Shards"): an engine of shard s >= 1 has its hash under shard s's hash tag,
and a skipped field or a wrong-typed hash of it was reported under shard 0's key of the engine
(``rs:{NS}:v2:e:<engine>:c``), a key that does not exist. Each test failed before its fix."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import fakeredis
import pytest

from redis_stats import RedisCollector, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsReader
from redis_stats.keys import Keys
from redis_stats.ops import inspection
from tests import chunked
from tests.conftest import sample_catalog
from tests.store.test_shards import K, _cfg, _engine_4_after_k_changed

# A base field with a value that is not a number, one naming no metric, a chunk's values without
# its names field (engine_chunks), and a chunk line that is not a number (the chunk is read line
# by line then): every place that names an engine's hash.
GARBAGE = {"tokens": "abc", "no_such_metric": "1"}
BAD_CHUNK = chunked.chunk_field("ghost", 0)


def _written(fake_client: Any, namespace: str) -> StatsWriter:
    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[0, 1, 2], client=fake_client(), start=False
    )
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    assert w.flush()
    return w


def _spoil(fake_client: Any, namespace: str, writer: StatsWriter) -> tuple[str, set[tuple[str, str, str]]]:
    """Garbage in engine 1's hash (shard 1 of K=3) and in a line of its writer's chunk; the key
    and what a reader must name."""
    key = Keys(namespace).shard(1, K).counters(1)
    raw = fake_client()
    assert raw.exists(key) and not raw.exists(Keys(namespace).counters(1))
    chunk = chunked.chunk_field(writer.writer_id, 0)
    names = raw.hget(key, chunk + chunked.NAMES_SUFFIX).split("\n")
    values = raw.hget(key, chunk).split("\n")
    values[names.index("tokens")] = "1_000"
    raw.hset(key, mapping={**GARBAGE, BAD_CHUNK: "1", chunk: "\n".join(values)})
    expected = {
        ("bad_value", key, "tokens"),  # the base field, and the chunk's line
        ("unknown_metric", key, "no_such_metric"),
        ("bad_chunk", key, BAD_CHUNK),
    }
    return key, expected


def _check(skipped: Any, key: str, expected: set[tuple[str, str, str]]) -> None:
    assert dict(skipped) == {"bad_value": 2, "unknown_metric": 1, "bad_chunk": 1}, skipped
    assert set(skipped.where) == expected, skipped.where
    assert all(named == key for _, named, _ in skipped.where), skipped.where


@pytest.mark.parametrize("reader_k", [K, 1])  # K from the config, or learnt from shard 0's catalogue
def test_a_snapshot_names_the_shard_1_key_of_what_it_skips(fake_client, namespace, reader_k):
    w = _written(fake_client, namespace)
    key, expected = _spoil(fake_client, namespace, w)
    reader = StatsReader(_cfg(namespace, shards=reader_k), sample_catalog(), client=fake_client())
    for _ in range(2):
        snap = reader.snapshot()
        _check(snap.skipped, key, expected)
        assert snap.engines[1].counter("tokens") == 0  # the one value of it is garbage
        assert snap.engines[2].counter("tokens") == 3
    w.close()


def test_the_exporter_text_path_names_the_shard_1_key_of_what_it_skips(fake_client, namespace):
    w = _written(fake_client, namespace)
    key, expected = _spoil(fake_client, namespace, w)
    reader = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client())
    collector = RedisCollector(reader)
    text = collector.render_text()
    assert 'redis_stats_skipped_fields{reason="bad_value"} 2.0\n' in text
    assert 'redis_stats_skipped_fields{reason="unknown_metric"} 1.0\n' in text
    assert 'redis_stats_skipped_fields{reason="bad_chunk"} 1.0\n' in text
    assert 'tokens_total{engine="2"} 3\n' in text
    shell = reader.decoded(reader.read()).shell  # what render_text counts
    _check(shell.skipped, key, expected)
    w.close()


def _async_snapshots(fake_client: Any, namespace: str) -> list[Any]:
    """Two snapshots by the asyncio reader, configured without K (it learns the shards from
    shard 0's catalogue), of what the sync client wrote."""
    server = fake_client().connection_pool.connection_kwargs["server"]

    async def read() -> list[Any]:
        client = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
        reader = AsyncStatsReader(_cfg(namespace), sample_catalog(), client=client)
        snaps = [await reader.snapshot() for _ in range(2)]
        await reader.aclose()
        return snaps

    return asyncio.run(read())


def test_the_async_reader_names_the_shard_1_key_of_what_it_skips(fake_client, namespace):
    w = _written(fake_client, namespace)
    key, expected = _spoil(fake_client, namespace, w)
    for snap in _async_snapshots(fake_client, namespace):
        _check(snap.skipped, key, expected)
    w.close()


def test_inspect_names_the_shard_1_key_of_what_it_skips(fake_client, namespace, monkeypatch):
    w = _written(fake_client, namespace)
    key, _ = _spoil(fake_client, namespace, w)
    monkeypatch.setattr(inspection, "make_client", lambda config: fake_client())
    lines = list(inspection.inspect_namespace(_cfg(namespace), sample_catalog()))
    assert f"    bad_value: key {key} field 'tokens'" in lines, lines
    assert f"    bad_chunk: key {key} field {BAD_CHUNK!r}" in lines, lines
    assert not any(Keys(namespace).counters(1) in line for line in lines), lines
    w.close()


@pytest.mark.parametrize("reader_k", [K, 1])
def test_a_wrong_typed_engine_hash_of_shard_1_is_named_by_its_key(
    fake_client, namespace, reader_k, monkeypatch
):
    w = _written(fake_client, namespace)
    key = Keys(namespace).shard(1, K).counters(1)
    raw = fake_client()
    raw.delete(key)
    raw.set(key, "garbage")
    reader = StatsReader(_cfg(namespace, shards=reader_k), sample_catalog(), client=fake_client())
    for _ in range(2):
        snap = reader.snapshot()
        assert dict(snap.skipped) == {"wrong_type": 1} and snap.skipped.where == [("wrong_type", key, "")]
        assert sorted(snap.engines) == [0, 1, 2] and not snap.engines[1].counters
        shell = reader.decoded(reader.read()).shell
        assert shell.skipped.where == [("wrong_type", key, "")]
    text = RedisCollector(reader).render_text()
    assert 'redis_stats_skipped_fields{reason="wrong_type"} 1.0\n' in text
    monkeypatch.setattr(inspection, "make_client", lambda config: fake_client())
    lines = list(inspection.inspect_namespace(_cfg(namespace), sample_catalog()))
    assert f"    wrong_type: key {key} (the whole key)" in lines, lines
    assert any(line.startswith("    engine 1: ") and key in line for line in lines), lines  # its fields
    w.close()


def _in_two_shards(fake_client: Any, namespace: str) -> tuple[StatsWriter, str, str]:
    """Engine 4 written with K=1 (shard 0), then with K=3 (shard 1): the live writer, both keys."""
    _, new = _engine_4_after_k_changed(fake_client, namespace)
    return new, Keys(namespace).counters(4), Keys(namespace).shard(1, K).counters(4)


@pytest.mark.parametrize("bad", [0, 1])
def test_an_engine_in_two_shards_names_the_part_each_skipped_field_came_from(fake_client, namespace, bad):
    """After K changed, engine 4's hash is read from shards 0 and 1 and put together: what is
    skipped is named by the key of the shard that holds it (both hold a base field ``tokens``)."""
    w, zero, one = _in_two_shards(fake_client, namespace)
    keys = [zero, one]
    raw = fake_client()
    raw.hset(keys[bad], mapping={"tokens": "abc", f"no_such_metric_{bad}": "1"})
    raw.hset(keys[1 - bad], "tokens", "100")
    reader = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client())
    snap = reader.snapshot()
    expected = {("bad_value", keys[bad], "tokens"), ("unknown_metric", keys[bad], f"no_such_metric_{bad}")}
    assert set(snap.skipped.where) == expected, snap.skipped.where
    assert snap.engines[4].counter("tokens") == 112
    shell = reader.decoded(reader.read()).shell
    assert set(shell.skipped.where) == expected, shell.skipped.where
    # A line of a writer's chunk: the shard holding that writer's chunks (shard 1 here).
    chunk = chunked.chunk_field(w.writer_id, 0)
    assert raw.hget(one, chunk) == "7"
    raw.hset(one, chunk, "x7")
    for skipped in (reader.snapshot().skipped, reader.decoded(reader.read()).shell.skipped):
        assert ("bad_value", one, "tokens") in skipped.where, skipped.where
    w.close()


@pytest.mark.parametrize("bad", [0, 1])
def test_an_engine_in_two_shards_with_one_hash_wrong_typed_counts_it(fake_client, namespace, bad):
    """One of engine 4's two hashes of the wrong type: the other shard's part is shown, and the
    wrong-typed one is counted under its own key (the merge dropped it without a word)."""
    w, zero, one = _in_two_shards(fake_client, namespace)
    keys = [zero, one]
    raw = fake_client()
    raw.delete(keys[bad])
    raw.set(keys[bad], "garbage")
    reader = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client())
    for _ in range(2):
        snap = reader.snapshot()
        assert snap.skipped.where == [("wrong_type", keys[bad], "")], snap.skipped.where
        assert dict(snap.skipped) == {"wrong_type": 1}
        assert snap.engines[4].counter("tokens") == (7 if bad == 0 else 5)
        text = RedisCollector(reader).render_text()
        assert 'redis_stats_skipped_fields{reason="wrong_type"} 1.0\n' in text
    # Both of the wrong type: each is counted, by its own key.
    other = keys[1 - bad]
    raw.delete(other)
    raw.set(other, "garbage")
    snap = reader.snapshot()
    assert sorted(snap.skipped.where) == sorted([("wrong_type", zero, ""), ("wrong_type", one, "")])
    assert dict(snap.skipped) == {"wrong_type": 2} and not snap.engines[4].counters
    w.close()


# The other keys a reader reads from every shard and names in what it skips: the conflicts hash,
# a writer's self-metrics hash (``w:<id>``, in its home shard) and the engines zset. Each case
# puts garbage in shard 1's key (K=3): the writers to close, the (reason, key, field) a reader must
# name, and what it counts.
CASES = [
    "conflicts",
    "writer_stats",
    "writer_stats_two_shards",
    "writer_wrong_type",
    "writer_wrong_type_two_shards",
    "engines",
]


def _spoiled(
    fake_client: Any, namespace: str, case: str
) -> tuple[list[StatsWriter], list[tuple[str, str, str]]]:
    shard1 = Keys(namespace).shard(1, K)
    raw = fake_client()
    if case in ("conflicts", "engines"):
        w = _written(fake_client, namespace)
        if case == "conflicts":
            raw.hset(shard1.conflicts, "1", "garbage")
            return [w], [("bad_value", shard1.conflicts, "1")]
        assert raw.zscore(shard1.engines, "1") is not None
        raw.zadd(shard1.engines, {"x1": raw.zscore(shard1.engines, "1")})
        return [w], [("bad_engine", shard1.engines, "x1")]
    # A writer whose engines are all in shard 1 (its home; [1, 2]: it also heartbeats in shard 2,
    # whose w:<id> is empty: a wrong-typed one in shard 1 was dropped by the merge, not counted)
    # and one of shard 0.
    engines = [1, 2] if case.endswith("two_shards") else [1, 4]
    other = _written(fake_client, namespace)
    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=engines, client=fake_client(), start=False
    )
    w.counter("tokens").labels(engine=1).inc(1)
    assert w.flush()
    key = shard1.writer_stats(w.writer_id)
    assert raw.exists(key) and not raw.exists(Keys(namespace).writer_stats(w.writer_id))
    if case.startswith("writer_wrong_type"):
        raw.delete(key)
        raw.set(key, "garbage")
        return [other, w], [("wrong_type", key, "")]
    raw.hset(key, mapping={"flushes": "abc", "dur:xyz": "1"})
    return [other, w], [("bad_value", key, "flushes"), ("bad_field", key, "dur:xyz")]


def _close(writers: list[StatsWriter]) -> None:
    for w in writers:
        w.close()


@pytest.mark.parametrize("reader_k", [K, 1])
@pytest.mark.parametrize("case", CASES)
def test_a_snapshot_names_the_shard_1_key_of_conflicts_writer_stats_and_engines(
    fake_client, namespace, case, reader_k
):
    writers, expected = _spoiled(fake_client, namespace, case)
    reader = StatsReader(_cfg(namespace, shards=reader_k), sample_catalog(), client=fake_client())
    for _ in range(2):
        snap = reader.snapshot()
        assert sorted(snap.skipped.where) == sorted(expected), snap.skipped.where
        assert dict(snap.skipped) == dict(Counter(reason for reason, _, _ in expected))
        assert {0, 1, 2} <= set(snap.engines) and snap.engines[2].counter("tokens") == 3
    _close(writers)


@pytest.mark.parametrize("case", CASES)
def test_the_exporter_text_path_names_the_shard_1_key_of_conflicts_writer_stats_and_engines(
    fake_client, namespace, case
):
    writers, expected = _spoiled(fake_client, namespace, case)
    reader = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client())
    text = RedisCollector(reader).render_text()
    for reason, count in Counter(reason for reason, _, _ in expected).items():
        assert f'redis_stats_skipped_fields{{reason="{reason}"}} {float(count)}\n' in text, text
    assert 'tokens_total{engine="2"} 3\n' in text
    shell = reader.decoded(reader.read()).shell  # what render_text counts
    assert sorted(shell.skipped.where) == sorted(expected), shell.skipped.where
    _close(writers)


@pytest.mark.parametrize("case", CASES)
def test_the_async_reader_names_the_shard_1_key_of_conflicts_writer_stats_and_engines(
    fake_client, namespace, case
):
    writers, expected = _spoiled(fake_client, namespace, case)
    for snap in _async_snapshots(fake_client, namespace):
        assert sorted(snap.skipped.where) == sorted(expected), snap.skipped.where
    _close(writers)


@pytest.mark.parametrize("case", CASES)
def test_inspect_names_the_shard_1_key_of_conflicts_writer_stats_and_engines(
    fake_client, namespace, case, monkeypatch
):
    writers, expected = _spoiled(fake_client, namespace, case)
    monkeypatch.setattr(inspection, "make_client", lambda config: fake_client())
    lines = list(inspection.inspect_namespace(_cfg(namespace), sample_catalog()))
    for reason, key, field in expected:
        line = f"    {reason}: key {key}" + (f" field {field!r}" if field else " (the whole key)")
        assert line in lines, lines
    _close(writers)


def test_a_bad_engine_name_in_two_shards_names_both_engines_sets(fake_client, namespace):
    w = _written(fake_client, namespace)
    zero, one = Keys(namespace).engines, Keys(namespace).shard(1, K).engines
    raw = fake_client()
    raw.zadd(zero, {"x1": 1})
    raw.zadd(one, {"x1": 2, "+4": 2})
    reader = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client())
    snap = reader.snapshot()
    # each listing counted under its own key
    assert sorted(snap.skipped.where) == [
        ("bad_engine", one, "+4"),
        ("bad_engine", one, "x1"),
        ("bad_engine", zero, "x1"),
    ]
    assert sorted(snap.engines) == [0, 1, 2]
    w.close()


def test_a_wrong_typed_writer_stats_hash_outside_its_home_is_counted_by_its_key(fake_client, namespace):
    """A writer of engines 1 and 2 (K=3) is listed in shards 1 (its home) and 2; its w:<id> of
    the wrong type in shard 2 was dropped by the merge without being counted."""
    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[1, 2], client=fake_client(), start=False
    )
    w.counter("tokens").labels(engine=1).inc(1)
    assert w.flush()
    key = Keys(namespace).shard(2, K).writer_stats(w.writer_id)
    raw = fake_client()
    assert raw.zscore(Keys(namespace).shard(2, K).writers, w.writer_id) is not None and not raw.exists(key)
    raw.set(key, "garbage")
    reader = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client())
    for _ in range(2):
        snap = reader.snapshot()
        assert snap.skipped.where == [("wrong_type", key, "")], snap.skipped.where
        assert "flushes" in snap.writers[w.writer_id].stats  # its home's
    assert 'redis_stats_skipped_fields{reason="wrong_type"} 1.0\n' in RedisCollector(reader).render_text()
    w.close()


@pytest.mark.parametrize("newer_in_shard", [0, 1])
def test_an_engine_with_conflicts_in_two_shards_shows_the_newer_one(fake_client, namespace, newer_in_shard):
    """After K changed, an engine's conflicts hash entries can be in its old shard and its new
    one; both within the window. The reader showed whichever shard it merged last; it shows the
    newer conflict, wherever it is."""
    _, new = _engine_4_after_k_changed(fake_client, namespace)
    raw = fake_client()
    now_ms = int(raw.time()[0]) * 1000
    homes = [Keys(namespace).conflicts, Keys(namespace).shard(1, K).conflicts]
    raw.hset(homes[newer_in_shard], "4", f"w-a|w-b|{now_ms - 100}")
    raw.hset(homes[1 - newer_in_shard], "4", f"w-c|w-d|{now_ms - 2000}")
    for reader_k in (K, 1):
        reader = StatsReader(_cfg(namespace, shards=reader_k), sample_catalog(), client=fake_client())
        snap = reader.snapshot()
        assert snap.engines[4].conflict == ("w-a", "w-b"), (reader_k, snap.engines[4].conflict)
    new.close()
