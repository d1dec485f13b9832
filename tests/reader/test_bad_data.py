"""Whatever is in Redis, a scrape serves what is readable: a bad field or a key of the wrong type
costs that field or key only, is counted in ``redis_stats_skipped_fields{reason}`` on both render
paths, and is named (key and field) by ``redis-stats inspect``. Each case is a row of the "What
bad data does" table in docs/operations.md."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.connection import make_client
from redis_stats.keys import Keys
from redis_stats.ops.inspection import inspect_namespace
from redis_stats.server import Exporter
from tests import chunked
from tests.chunked import set_series_value
from tests.conftest import sample_catalog, scripted_client

VOLATILE = {
    "redis_stats_read_duration_seconds",
    "redis_stats_engine_data_age_seconds",
    "redis_stats_writer_last_flush_age_seconds",
    "redis_stats_store_used_memory_bytes",
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in VOLATILE:
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def skipped_of(found: dict) -> dict[str, float]:
    name = "redis_stats_skipped_fields"
    return {dict(labels)["reason"]: v for (n, labels), v in found.items() if n == name}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def as_string(key: str) -> Callable[[Any, Keys, str], None]:
    """A key of the wrong type: a string where a hash or a sorted set should be."""

    def plant(client: Any, keys: Keys, writer: str) -> None:
        client.delete(key.format(keys=keys, writer=writer))
        client.set(key.format(keys=keys, writer=writer), "garbage")

    return plant


def field(key: str, name: str, value: str) -> Callable[[Any, Keys, str], None]:
    def plant(client: Any, keys: Keys, writer: str) -> None:
        client.hset(key.format(keys=keys, writer=writer), name, value)

    return plant


def line(key: str, series: str, value: str) -> Callable[[Any, Keys, str], None]:
    """Garbage in one series' line of the writer's chunk (schema 2: an engine's series live in
    its writers' chunks, docs/key-schema.md)."""

    def plant(client: Any, keys: Keys, writer: str) -> None:
        set_series_value(client, key.format(keys=keys, writer=writer), series, value)

    return plant


def names(key: str, value: str) -> Callable[[Any, Keys, str], None]:
    """A chunk's names field that does not match its values line for line."""

    def plant(client: Any, keys: Keys, writer: str) -> None:
        client.hset(key.format(keys=keys, writer=writer), chunked.chunk_field(writer, 0) + "|n", value)

    return plant


TOKENS_0 = ("tokens_total", (("engine", "0"),))
TOKENS_1 = ("tokens_total", (("engine", "1"),))
RUNNING_1 = ("running", (("engine", "1"),))
COUNT_0 = ("latency_seconds_count", (("engine", "0"),))
WRITER_UP = "redis_stats_writer_up"

# (case, plant, skipped by reason, key named by inspect, field named, series kept, series gone)
# fmt: off
CASES = [
    ("writer stats field not a number: dur:abc", field("{keys.prefix}w:{writer}", "dur:abc", "1"),
     {"bad_field": 1}, "{keys.prefix}w:{writer}", "dur:abc", [TOKENS_0, TOKENS_1, RUNNING_1], []),
    ("writer stats value not a number", field("{keys.prefix}w:{writer}", "flushes", "lots"),
     {"bad_value": 1}, "{keys.prefix}w:{writer}", "flushes", [TOKENS_0, TOKENS_1, RUNNING_1], []),
    # schema 2: an engine's gauges live in the same hash as its counters (docs/key-schema.md)
    ("engine hash is a string", as_string("{keys.prefix}e:1:c"),
     {"wrong_type": 1}, "{keys.prefix}e:1:c", "", [TOKENS_0], [TOKENS_1, RUNNING_1]),
    ("chunk names do not match its values", names("{keys.prefix}e:1:c", "tokens"),
     {"bad_chunk": 1}, "{keys.prefix}e:1:c", "@|", [TOKENS_0], [TOKENS_1, RUNNING_1]),
    ("engines sorted set is a string", as_string("{keys.prefix}engines"),
     {"wrong_type": 1}, "{keys.prefix}engines", "", [], [TOKENS_0, TOKENS_1]),
    ("writers sorted set is a string", as_string("{keys.prefix}writers"),
     {"wrong_type": 1}, "{keys.prefix}writers", "", [TOKENS_0, TOKENS_1], [RUNNING_1]),
    ("catalogue hash is a string", as_string("{keys.prefix}meta"),
     {"wrong_type": 1}, "{keys.prefix}meta", "", [TOKENS_0, TOKENS_1, RUNNING_1], []),
    ("conflicts hash is a string", as_string("{keys.prefix}conflicts"),
     {"wrong_type": 1}, "{keys.prefix}conflicts", "", [TOKENS_0, TOKENS_1, RUNNING_1], []),
    ("writer stats hash is a string", as_string("{keys.prefix}w:{writer}"),
     {"wrong_type": 1}, "{keys.prefix}w:{writer}", "", [TOKENS_0, TOKENS_1, RUNNING_1], []),
    ("histogram bucket counts go down", line("{keys.prefix}e:0:c", "latency_seconds|", "1.5 3 2 2 2 2"),
     {"bad_value": 1}, "{keys.prefix}e:0:c", "latency_seconds|", [TOKENS_0], [COUNT_0]),
    ("counter value 1_000 (float() takes it, Prometheus does not)",
     line("{keys.prefix}e:0:c", "tokens", "1_000"),
     {"bad_value": 1}, "{keys.prefix}e:0:c", "tokens", [TOKENS_1], [TOKENS_0]),
]
# fmt: on


@pytest.mark.parametrize(
    ("case", "plant", "skipped", "key", "field_name", "kept", "gone"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_data_costs_only_its_key_or_field(
    redis_server, namespace, case, plant, skipped, key, field_name, kept, gone
):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, stale_after=120)
    catalog = sample_catalog()
    writer = StatsWriter(cfg, catalog, engines=[0, 1], start=False)
    for e in (0, 1):
        writer.counter("tokens").labels(engine=e).inc(10 + e)
        writer.gauge("running").labels(engine=e).set(e)
        writer.histogram("latency_seconds").labels(engine=e).observe(0.2)
    assert writer.flush()
    keys = Keys(namespace)
    client = make_client(cfg)
    plant(client, keys, writer.writer_id)

    exporter = Exporter(StatsReader(cfg, catalog), port=0).start()
    try:
        status, body = get(exporter.url + "/metrics")
        snap_status, snap_body = get(exporter.url + "/snapshot")
    finally:
        exporter.close()
    assert status == 200
    text = samples(body)
    assert text[("redis_stats_up", ())] == 1.0
    assert skipped_of(text) == skipped
    for series in kept:
        assert series in text, series
    for series in gone:
        assert series not in text, series
    assert any(name == WRITER_UP for name, _ in text) or "writers" in case

    reg = CollectorRegistry()
    reg.register(RedisCollector(StatsReader(cfg, catalog)))
    assert samples(generate_latest(reg).decode()) == text  # both render paths skip the same

    assert snap_status == 200
    doc = json.loads(snap_body)
    engines = set() if "engines sorted set" in case else {"0", "1"}
    assert set(doc["engines"]) == engines

    # read.lua (the Cluster read, and the read under maxmemory) checks types too
    by_script = StatsReader(cfg, catalog, client=scripted_client(cfg.url)).snapshot()
    by_transaction = StatsReader(cfg, catalog).snapshot()
    assert dict(by_script.skipped) == dict(by_transaction.skipped) == skipped
    assert {e: s.counters for e, s in by_script.engines.items()} == {
        e: s.counters for e, s in by_transaction.engines.items()
    }

    lines = "\n".join(inspect_namespace(cfg))
    named = key.format(keys=keys, writer=writer.writer_id)
    line = next(line for line in lines.splitlines() if f"key {named}" in line)
    assert next(iter(skipped)) in line
    assert (f"field '{field_name}" in line) if field_name else "(the whole key)" in line
    writer._closed = True


# -- both render paths skip the same things, whatever the garbage ----------------------------------

_numbers = st.sampled_from(["0", "7", "007", "2.5", "-1", "1e400", "1.", ".5", "+3", "1e-3", "inf", "-Inf"])
_garbage = st.sampled_from(["", " 5", "5 ", "1_000", "nan", "NaN", "abc", "0x10", "٣", "1,5", "5\n", "++1"])
_value = st.one_of(
    _numbers,
    _garbage,
    st.text(max_size=8),
    # histogram-like: "<sum> <c0> ... <cN>", counts that may go down or be garbage
    st.lists(st.one_of(_numbers, _garbage), min_size=1, max_size=7).map(" ".join),
    # gauge-like: "<wall ms>|<value>"
    st.tuples(st.one_of(_numbers, _garbage), st.one_of(_numbers, _garbage)).map("|".join),
)


@st.composite
def _fields(draw: Any, writer: str) -> str:
    name = draw(st.sampled_from(["tokens", "requests", "running", "inflight", "latency_seconds", "nosuch"]))
    labels = draw(st.lists(st.sampled_from(["stop", "", "a|b", "x\\y", "é"]), max_size=2))
    suffix = draw(st.sampled_from([[], [writer], ["other-writer"], ["h:00000000"], ["<layout>"]]))
    if suffix == ["<layout>"]:
        from tests.chunked import bucket_tag as layout_of

        suffix = [layout_of(sample_catalog().get("latency_seconds"))]
    raw = draw(st.sampled_from(["encoded", "raw"]))
    parts = [name, *labels, *suffix]
    return chunked.encode(parts) if raw == "encoded" else "|".join(parts)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_both_render_paths_agree_on_any_garbage(fake_client, namespace, data):
    client = fake_client()
    client.flushall()
    cfg = StatsConfig(namespace=namespace, stale_after=120)
    catalog = sample_catalog()
    writer = StatsWriter(cfg, catalog, engines=[0, 1], client=fake_client(), start=False)
    for e in (0, 1):
        writer.counter("requests").labels(engine=e, reason="stop").inc(e + 1)
        writer.counter("tokens").labels(engine=e).inc(3)
        for gauge in ("running", "inflight", "peak", "floor"):
            writer.gauge(gauge).labels(engine=e).set(e)
        writer.histogram("latency_seconds").labels(engine=e).observe(0.3)
    assert writer.flush()
    keys = Keys(namespace)
    hashes = [keys.counters(0), keys.gauges(0), keys.counters(1), keys.writer_stats(writer.writer_id)]
    # garbage beside good data, and over good data (existing fields get garbage values)
    for _ in range(data.draw(st.integers(1, 12))):
        key = data.draw(st.sampled_from(hashes))
        existing = client.hkeys(key)
        name = data.draw(
            st.one_of(_fields(writer.writer_id), st.sampled_from(existing or ["x"]), st.text(max_size=6))
        )
        client.hset(key, name, data.draw(_value))
    if data.draw(st.booleans()):
        client.zadd(keys.engines, {data.draw(st.sampled_from(["+1", " 1", "01", "x", "-1", "2"])): 1e15})
    # garbage inside a writer's chunk: one line's value, or one line's series field (schema 2)
    for _ in range(data.draw(st.integers(0, 4))):
        key = data.draw(st.sampled_from([keys.counters(0), keys.counters(1)]))
        chunks = sorted(f for f in client.hkeys(key) if f.startswith("@|"))
        chunk = data.draw(st.sampled_from(chunks or ["-"]))
        text = client.hget(key, chunk)
        if not text:
            continue
        lines = text.split("\n")
        at = data.draw(st.integers(0, len(lines) - 1))
        lines[at] = data.draw(st.one_of(_value, _fields(writer.writer_id))).replace("\n", "")
        client.hset(key, chunk, "\n".join(lines))

    fast = RedisCollector(StatsReader(cfg, catalog, client=fake_client())).render_text()
    reg = CollectorRegistry()
    reg.register(RedisCollector(StatsReader(cfg, catalog, client=fake_client())))
    slow = generate_latest(reg).decode()
    fast_samples, slow_samples = samples(fast), samples(slow)
    assert fast_samples == slow_samples
    assert skipped_of(fast_samples) == skipped_of(slow_samples)
    lines = [line.rpartition(" ")[0] for line in fast.splitlines() if line and not line.startswith("#")]
    assert len(lines) == len(set(lines))  # no series twice (the parser would accept it)
    writer._closed = True


def test_inspect_names_the_first_skipped_fields_and_counts_the_rest(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, stale_after=120)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    writer.counter("tokens").labels(engine=0).inc(1)
    assert writer.flush()
    make_client(cfg).hset(Keys(namespace).counters(0), mapping={f"nosuch{i}": "1" for i in range(200)})
    lines = list(inspect_namespace(cfg))
    named = [line for line in lines if line.strip().startswith("unknown_metric: key")]
    assert len(named) == 50  # bounded: a namespace full of garbage does not flood the output
    assert lines[-1].strip() == "... and 150 more"
    assert "'unknown_metric': 200" in "\n".join(lines)
    writer._closed = True


def test_on_a_cluster_a_wrong_typed_key_costs_that_key_only(namespace):
    """On a Cluster the read is read.lua on the namespace's node: it reads each key with pcall."""
    from tests.servers import Cluster

    cluster = Cluster().start()
    try:
        cfg = StatsConfig(url=cluster.url, namespace=namespace, stale_after=120)
        writer = StatsWriter(cfg, sample_catalog(), engines=[0, 1], start=False)
        for e in (0, 1):
            writer.counter("tokens").labels(engine=e).inc(10 + e)
        assert writer.flush()
        client = make_client(cfg)
        keys = Keys(namespace)
        client.delete(keys.counters(1))
        client.set(keys.counters(1), "garbage")
        client.set(keys.conflicts, "garbage")
        reg = CollectorRegistry()
        reg.register(RedisCollector(StatsReader(cfg, sample_catalog())))
        found = samples(generate_latest(reg).decode())
        assert found[("redis_stats_up", ())] == 1.0
        assert found[TOKENS_0] == 10.0 and TOKENS_1 not in found
        assert skipped_of(found) == {"wrong_type": 2}
        writer._closed = True
    finally:
        cluster.close()


def test_the_asyncio_reader_skips_a_wrong_typed_key_too(redis_server, namespace):
    import asyncio

    from redis_stats.aio import AsyncStatsReader

    cfg = StatsConfig(url=redis_server.url, namespace=namespace, stale_after=120)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0, 1], start=False)
    for e in (0, 1):
        writer.counter("tokens").labels(engine=e).inc(10 + e)
    assert writer.flush()
    client = make_client(cfg)
    client.delete(Keys(namespace).counters(1))
    client.set(Keys(namespace).counters(1), "garbage")

    async def read() -> Any:
        reader = AsyncStatsReader(cfg, sample_catalog())
        try:
            return await reader.snapshot()
        finally:
            await reader.close()

    snap = asyncio.run(read())
    assert {e: s.counter("tokens") for e, s in snap.engines.items()} == {0: 10.0, 1: 0.0}
    assert dict(snap.skipped) == {"wrong_type": 1}
    assert snap.skipped.where == [("wrong_type", Keys(namespace).counters(1), "")]
    writer._closed = True
