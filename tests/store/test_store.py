"""Writer -> Redis -> reader, against fakeredis (with Lua): each kind, roll-up and protocol rule."""

import math
import time

import pytest
import redis

from redis_stats import Catalog, CatalogError, StatsReader, StatsWriter
from redis_stats.keys import Keys
from tests.chunked import set_series_value


@pytest.fixture
def make_writer(config, catalog, fake_client):
    made = []

    def make(engines=(0,), cfg=None, cat=None, **kw):
        w = StatsWriter(
            cfg or config, cat or catalog, engines=engines, client=fake_client(), start=False, **kw
        )
        made.append(w)
        return w

    yield make
    for w in made:
        w._closed = True


@pytest.fixture
def reader(config, catalog, fake_client):
    return StatsReader(config, catalog, client=fake_client())


def test_counters_from_several_writers_add_up_exactly(make_writer, reader):
    a, b = make_writer(), make_writer()
    for w, n in ((a, 3), (b, 4)):
        child = w.counter("requests").labels(engine=0, reason="stop")
        for _ in range(n):
            child.inc()
        w.counter("tokens").labels(engine=1).inc(0.5)
        assert w.flush()
    snap = reader.snapshot()
    assert snap.engines[0].counter("requests", "stop") == 7
    assert snap.engines[1].counter("tokens") == 1.0
    assert snap.total("requests", "stop") == 7


def test_int_then_float_increments_on_one_field_both_count(make_writer, reader):
    w = make_writer()
    c = w.counter("tokens").labels(engine=0)
    c.inc(1.25)
    w.flush()
    c.inc(2)  # HINCRBY on a field holding a float: the script falls back to HINCRBYFLOAT
    w.flush()
    assert reader.snapshot().engines[0].counter("tokens") == 3.25


def test_histogram_is_cumulative_with_inf_sum_and_count(make_writer, reader):
    w = make_writer()
    h = w.histogram("latency_seconds").labels(engine=0)
    for v in (0.05, 0.1, 0.3, 0.7, 3, 100):
        h.observe(v)
    w.flush()
    hist = reader.snapshot().engines[0].histogram("latency_seconds")
    assert hist.bounds == (0.1, 0.5, 1.0, 5.0, math.inf)
    assert hist.cumulative == (2, 3, 4, 5, 6)  # le is inclusive: 0.1 lands in le="0.1"
    assert hist.count == 6
    assert hist.sum == pytest.approx(104.15)


def test_gauge_mostrecent_takes_the_newest_write_across_writers(make_writer, reader):
    a, b = make_writer(), make_writer()
    a.gauge("running").labels(engine=0).set(5)
    time.sleep(0.002)
    b.gauge("running").labels(engine=0).set(9)
    b.flush()  # the newer value is flushed first; the older one must not win by arriving later
    a.flush()
    assert reader.snapshot().engines[0].gauge("running") == 9


@pytest.mark.parametrize("name, expected", [("inflight", 12), ("peak", 7), ("floor", 2)])
def test_gauge_rollups_over_live_writers(make_writer, reader, name, expected):
    for value in (3, 7, 2):
        w = make_writer()
        w.gauge(name).labels(engine=0).set(value)
        w.flush()
    assert reader.snapshot().engines[0].gauge(name) == expected


def test_gauge_inc_dec_is_this_writers_value(make_writer, reader):
    a, b = make_writer(), make_writer()
    g = a.gauge("inflight").labels(engine=0)
    g.inc(3)
    g.dec()
    b.gauge("inflight").labels(engine=0).inc(5)
    a.flush()
    b.flush()
    assert reader.snapshot().engines[0].gauge("inflight") == 7


def test_closed_writer_gauges_vanish_counters_stay(make_writer, reader):
    a, b = make_writer(), make_writer()
    a.gauge("inflight").labels(engine=0).set(4)
    a.counter("tokens").labels(engine=0).inc(10)
    b.gauge("inflight").labels(engine=0).set(1)
    a.flush()
    b.flush()
    assert reader.snapshot().engines[0].gauge("inflight") == 5
    a._closed = False
    assert a.close()
    snap = reader.snapshot()
    assert snap.engines[0].gauge("inflight") == 1
    assert snap.engines[0].counter("tokens") == 10
    assert snap.writers[a.writer_id].closed


def test_stale_engine_shows_no_gauges_and_is_down(make_writer, reader, config, fake_client):
    w = make_writer()
    w.gauge("running").labels(engine=0).set(3)
    w.counter("tokens").labels(engine=0).inc(2)
    w.flush()
    keys = Keys(config.namespace)
    # Age the heartbeats beyond stale_after, as if the process had died long ago.
    old = (time.time() - config.stale_after - 5) * 1000
    client = fake_client()
    client.zadd(keys.engines, {"0": old})
    client.zadd(keys.writers, {w.writer_id: old})
    e = reader.snapshot().engines[0]
    assert not e.up
    assert e.age > config.stale_after
    assert e.gauge("running") is None
    assert e.counter("tokens") == 2


def test_declared_engines_are_heartbeated_even_when_idle(make_writer, reader):
    w = make_writer(engines=(0, 1, 2))
    w.flush()
    snap = reader.snapshot()
    assert sorted(snap.engines) == [0, 1, 2]
    assert all(e.up for e in snap.engines.values())


def test_engine_offset_shifts_every_engine(config, catalog, fake_client):
    cfg = config.replace(engine_offset=2)
    w = StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False)
    w.counter("tokens").labels(engine=0).inc(1)
    w.flush()
    snap = StatsReader(cfg, catalog, client=fake_client()).snapshot()
    assert sorted(snap.engines) == [2]


class LostReply:
    """Runs the script, then loses the reply: the failure a naive retry counts twice."""

    def __init__(self, script):
        self.script = script
        self.lose = True

    def __call__(self, **kw):
        reply = self.script(**kw)
        if self.lose:
            self.lose = False
            raise redis.ConnectionError("reply lost")
        return reply


def test_retry_after_lost_reply_is_not_applied_twice(make_writer, reader):
    w = make_writer()
    w._script = LostReply(w._script)
    c = w.counter("tokens").labels(engine=0)
    c.inc(5)
    assert not w.flush()  # applied in Redis, but the writer does not know
    c.inc(1)  # a new delta arrives while the first batch is unconfirmed
    assert w.flush()  # resends the same batch: skipped as a duplicate
    assert w.stats.duplicates == 1
    assert reader.snapshot().engines[0].counter("tokens") == 5
    assert w.flush()  # the new delta, with the next sequence number
    assert reader.snapshot().engines[0].counter("tokens") == 6


def test_lost_data_restores_catalogue_and_gauges(make_writer, config, fake_client):
    w = make_writer()
    w.gauge("running").labels(engine=0).set(8)
    w.flush()
    fake_client().flushall()  # Redis restarted without its data
    w.flush()  # notices the missing catalogue
    w.flush()  # stores it again, with every current gauge
    snap = StatsReader(config, Catalog(), client=fake_client()).snapshot()  # a reader with no code
    assert snap.engines[0].gauge("running") == 8
    assert "running" in snap.catalog


def test_reader_without_code_renders_from_stored_catalogue(make_writer, config, fake_client):
    w = make_writer()
    w.histogram("latency_seconds").labels(engine=0).observe(0.2)
    w.counter("requests").labels(engine=0, reason="length").inc(2)
    w.flush()
    snap = StatsReader(config, Catalog(), client=fake_client()).snapshot()
    assert snap.engines[0].counter("requests", "length") == 2
    assert snap.engines[0].histogram("latency_seconds").cumulative == (0, 1, 1, 1, 1)


def test_definition_mistakes_raise_at_first_use(make_writer):
    w = make_writer()
    with pytest.raises(CatalogError, match="unknown metric"):
        w.counter("nope")
    with pytest.raises(CatalogError, match="is a gauge, not a counter"):
        w.counter("running")
    with pytest.raises(CatalogError, match="missing"):
        w.counter("requests").labels(engine=0)
    with pytest.raises(CatalogError, match="engine"):
        w.counter("tokens").labels(engine=-1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1, "7", None])
def test_bad_counter_values_are_dropped_and_counted_never_raised(make_writer, reader, bad):
    w = make_writer()
    c = w.counter("tokens").labels(engine=0)
    c.inc(bad)
    c.inc(2)
    w.flush()
    assert w.drops == {"invalid_value": 1}
    assert reader.snapshot().engines[0].counter("tokens") == 2


def test_nan_observation_and_gauge_are_dropped(make_writer):
    w = make_writer()
    w.histogram("latency_seconds").labels(engine=0).observe(math.nan)
    w.gauge("running").labels(engine=0).set(math.nan)
    assert w.drops == {"invalid_value": 2}


def test_label_length_and_cardinality_limits_drop_and_count(config, catalog, fake_client, reader):
    cfg = config.replace(max_label_length=8, max_series_per_metric=2)
    w = StatsWriter(cfg, catalog, client=fake_client(), start=False)
    h = w.counter("requests")
    h.labels(engine=0, reason="x" * 9).inc()
    for reason in ("a", "b", "c", "d"):
        h.labels(engine=0, reason=reason).inc()
    w.flush()
    assert w.drops == {"label_too_long": 1, "cardinality": 2}
    e = StatsReader(cfg, catalog, client=fake_client()).snapshot().engines[0]
    assert set(e.counters) == {("requests", ("a",)), ("requests", ("b",))}


def test_record_never_touches_the_network_and_never_raises(catalog, namespace):
    from redis_stats import StatsConfig

    # Nothing listens on port 1: every flush fails, and record calls must not care.
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace, connect_timeout_ms=50)
    w = StatsWriter(cfg, catalog, start=False)
    c = w.counter("tokens").labels(engine=0)
    t0 = time.perf_counter()
    for _ in range(10000):
        c.inc()
    assert not w.stats.errors  # no attempt was made: recording touched no socket
    assert time.perf_counter() - t0 < 10.0  # 10,000 calls of ~0.5 us: a margin no machine misses
    assert not w.flush()
    assert w.stats.errors["connection"] == 1
    assert w.pending()


def test_memory_during_an_outage_grows_with_series_not_updates(catalog, namespace):
    from redis_stats import StatsConfig

    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace, connect_timeout_ms=50)
    w = StatsWriter(cfg, catalog, engines=[0], start=False)
    children = [w.counter("requests").labels(engine=0, reason=r).inc for r in ("stop", "length")]
    hist = w.histogram("latency_seconds").labels(engine=0).observe
    for _ in range(5):  # five failed flushes, 20,000 updates each
        for i in range(10_000):
            children[i % 2]()
            hist(0.3)
        assert not w.flush()
        # One unconfirmed batch (kept whole for its retry) plus the series changed since: memory
        # per series, not per update (what a close that gives up would report lost).
        pending = w.lost_summary()
        assert pending.startswith("3 series in the unconfirmed batch and "), pending
        assert int(pending.split(" and ")[1].split()[0]) <= 3, pending
    assert w.pending()


def test_garbage_in_a_histogram_field_is_skipped_then_replaced_by_the_next_flush(
    make_writer, reader, config, fake_client
):
    w = make_writer()
    h = w.histogram("latency_seconds").labels(engine=0)
    h.observe(0.3)
    assert w.flush()
    client = fake_client()
    key = Keys(config.namespace).counters(0)
    set_series_value(client, key, "latency_seconds", "not a histogram")
    snap = reader.snapshot()
    assert snap.engines[0].histogram("latency_seconds") is None
    assert snap.skipped["bad_value"] == 1
    h.observe(3.0)
    assert w.flush()
    hist = reader.snapshot().engines[0].histogram("latency_seconds")
    # schema 2: the writer holds its totals and sends them whole: nothing of the series is lost
    # (schema 1 merged into the stored value: the garbage cost every observation before it)
    assert hist.count == 2 and hist.sum == 3.3
