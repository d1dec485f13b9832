"""A conflicting catalogue never relabels data (issue 13.6): the first stored definition wins.

Two writers and readers on real servers (Redis and Valkey): the writer whose spec conflicts is told
by the flush reply, warns once, and none of its data of that metric is stored (counted as
``catalog_conflict`` drops); a reader whose code defines the metric otherwise shows the stored data
with the stored definition and counts the conflict.
"""

from __future__ import annotations

import logging
import re

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest

from redis_stats import Catalog, RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats._scripts import load_script
from redis_stats.keys import Keys

pytestmark = pytest.mark.redis_server

# Each variant conflicts with writer A's "requests": (catalogue of B, how B records one update).
VARIANTS = {
    "label renamed": lambda c: c.counter("requests", "Finished requests.", labels=["code"]),
    "kind": lambda c: c.gauge("requests", "Finished requests.", labels=["reason"]),
    "labels added": lambda c: c.counter("requests", "Finished requests.", labels=["reason", "code"]),
}


def catalog_a() -> Catalog:
    cat = Catalog()
    cat.counter("requests", "Finished requests.", labels=["reason"])
    cat.counter("tokens", "Generated tokens.")
    cat.histogram("latency_seconds", "Latency.", buckets=[0.1, 1.0])
    cat.gauge("running", "Running.", mode="sum")
    return cat


def catalog_b(variant: str) -> Catalog:
    cat = Catalog()
    VARIANTS[variant](cat)
    cat.counter("tokens", "Generated tokens.")
    cat.histogram("latency_seconds", "Latency.", buckets=[0.1, 1.0])
    cat.gauge("running", "Running.", mode="sum")
    return cat


def record_b(w: StatsWriter, n: int) -> None:
    spec = w.catalog["requests"]
    labels = {name: "500" for name in spec.labels}
    child = w.metric("requests").labels(engine=0, **labels)
    for _ in range(n):
        child.inc()  # a counter's or a gauge's


@pytest.fixture
def cfg(core_server, namespace) -> StatsConfig:
    return StatsConfig(url=core_server.url, namespace=namespace, flush_interval=0.05)


@pytest.fixture
def made():
    writers: list[StatsWriter] = []
    readers: list[StatsReader] = []
    yield writers, readers
    for w in writers:
        w._closed = True
        w._client.close()
    for r in readers:
        r.close()


def _read(cfg, cat, made):
    reader = StatsReader(cfg, cat)
    made[1].append(reader)
    return reader


def _writer(cfg, cat, made):
    w = StatsWriter(cfg, cat, engines=[0], start=False)
    made[0].append(w)
    return w


def _dropped_metric(reader: StatsReader, writer_id: str) -> float:
    registry = CollectorRegistry()
    registry.register(RedisCollector(reader))
    text = generate_latest(registry).decode()
    for line in text.splitlines():
        if (
            line.startswith("redis_stats_writer_dropped_updates_total{")
            and 'reason="catalog_conflict"' in line
            and f'writer="{writer_id}"' in line
        ):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_first_definition_wins_and_the_conflicting_writer_stores_none_of_it(cfg, made, variant, caplog):
    a = _writer(cfg, catalog_a(), made)
    a.counter("requests").labels(engine=0, reason="stop").inc(5)
    assert a.flush()

    b = _writer(cfg, catalog_b(variant), made)
    record_b(b, 7)  # in the same flush as the conflicting spec: refused too
    b.counter("tokens").labels(engine=0).inc(3)
    with caplog.at_level(logging.WARNING, logger="redis_stats.writer"):
        assert b.flush()
        record_b(b, 4)  # known conflicting now: dropped on the hot path, each update counted
        assert b.flush()
    warnings = [r for r in caplog.records if "'requests'" in r.getMessage()]
    assert len(warnings) == 1 and "first stored definition wins" in warnings[0].getMessage()
    assert b.drops == {"catalog_conflict": 1 + 4}  # one refused series, then four updates
    assert not b.stats.errors

    # Redis still holds A's definition; B's other metrics are stored as usual.
    stored = redis.Redis.from_url(cfg.url, decode_responses=True).hget(Keys(cfg.namespace).meta, "m:requests")
    assert '"labels":["reason"]' in stored and '"kind":"counter"' in stored

    snap = _read(cfg, catalog_a(), made).snapshot()
    assert snap.engines[0].counters == {("requests", ("stop",)): 5.0, ("tokens", ()): 3.0}
    assert not snap.engines[0].gauges.get(("requests", ("500",)))
    assert "catalog_conflict" not in snap.skipped

    # A reader with B's code shows the stored data under the stored definition, and counts it.
    reader_b = _read(cfg, catalog_b(variant), made)
    for _ in range(2):  # on every read, not only when the catalogue changed
        snap_b = reader_b.snapshot()
        assert snap_b.catalog["requests"].labels == ("reason",)
        assert snap_b.catalog["requests"].kind == "counter"
        assert snap_b.engines[0].counter("requests", "stop") == 5.0
        assert snap_b.skipped["catalog_conflict"] == 1
    assert _dropped_metric(reader_b, b.writer_id) == 5


def test_other_buckets_or_gauge_mode_conflict_too(cfg, made):
    a = _writer(cfg, catalog_a(), made)
    a.histogram("latency_seconds").labels(engine=0).observe(0.5)
    a.gauge("running").labels(engine=0).set(2)
    assert a.flush()
    cat = Catalog()
    cat.histogram("latency_seconds", "Latency.", buckets=[0.2, 2.0])
    cat.gauge("running", "Running.", mode="max")
    b = _writer(cfg, cat, made)
    for _ in range(3):
        b.histogram("latency_seconds").labels(engine=0).observe(0.5)
    b.gauge("running").labels(engine=0).set(9)
    assert b.flush()
    assert b.drops == {"catalog_conflict": 2}  # one histogram series, one gauge series refused
    b.histogram("latency_seconds").labels(engine=0).observe(0.5)
    b.gauge("running").labels(engine=0).set(9)
    assert b.flush()
    assert b.drops == {"catalog_conflict": 4}
    snap = _read(cfg, catalog_a(), made).snapshot()
    assert snap.engines[0].histogram("latency_seconds").count == 1
    assert snap.engines[0].gauge("running") == 2.0  # B's 9 was not stored (sum mode would add it)


def test_help_text_alone_is_not_a_conflict_and_the_first_help_stays(cfg, made):
    a = _writer(cfg, catalog_a(), made)
    a.counter("tokens").labels(engine=0).inc(1)
    assert a.flush()
    cat = catalog_a()
    other = Catalog()
    for spec in cat:
        if spec.name == "tokens":
            other.counter("tokens", "Other words.")
        else:
            other.add(spec)
    b = _writer(cfg, other, made)
    b.counter("tokens").labels(engine=0).inc(2)
    assert b.flush()
    assert not b.drops
    snap = _read(cfg, other, made).snapshot()
    assert snap.total("tokens") == 3
    assert snap.catalog["tokens"].help == "Generated tokens."  # the first stored definition
    assert "catalog_conflict" not in snap.skipped


def test_conflict_found_by_a_flush_whose_reply_was_lost_is_still_reported(cfg, made, core_server):
    a = _writer(cfg, catalog_a(), made)
    a.counter("requests").labels(engine=0, reason="stop").inc(5)
    assert a.flush()
    b = _writer(cfg, catalog_b("label renamed"), made)
    record_b(b, 7)
    # The first attempt is applied, but its reply never reaches the writer.
    [(_shard, keys, args)] = b.prepare_flushes()
    client = redis.Redis.from_url(core_server.url, decode_responses=True)
    client.register_script(load_script("flush"))(keys=keys, args=args)
    assert b.flush()  # the retry: "already applied", so the writer sends its specs again
    assert b.stats.duplicates == 1
    record_b(b, 2)
    assert b.flush()
    assert b.drops == {"catalog_conflict": 1}  # the series refused by the flush that reported it
    snap = _read(cfg, catalog_a(), made).snapshot()
    assert snap.engines[0].counters.get(("requests", ("500",))) is None
    assert snap.engines[0].counter("requests", "stop") == 5


def test_reader_with_conflicting_code_shows_stored_definition_and_counts_it(cfg, made):
    # Only the reader's code differs (e.g. a newer exporter): its local spec must not relabel.
    a = _writer(cfg, catalog_a(), made)
    a.counter("requests").labels(engine=0, reason="stop").inc(5)
    assert a.flush()
    reader = _read(cfg, catalog_b("label renamed"), made)
    snap = reader.snapshot()
    assert snap.catalog["requests"].labels == ("reason",)
    assert snap.to_dict()["engines"]["0"]["counters"][0]["labels"] == {"reason": "stop"}
    assert snap.skipped["catalog_conflict"] == 1
    registry = CollectorRegistry()
    registry.register(RedisCollector(reader))
    for text in (generate_latest(registry).decode(), RedisCollector(reader).render_text()):
        assert re.search(r'\nrequests_total\{engine="0",reason="stop"\} 5(\.0)?\n', text)
        assert 'code="stop"' not in text
        assert 'redis_stats_skipped_fields{reason="catalog_conflict"} 1.0' in text
