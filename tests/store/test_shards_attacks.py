"""Attacks on the shards (#15 goal 2) as a production user would make them: garbage in Redis,
catalogue changes between reads, faults in one shard. Each test failed before its fix."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import redis

from redis_stats import Catalog, StatsReader, StatsWriter
from redis_stats._scripts import load_script
from redis_stats.catalog import MetricSpec
from redis_stats.keys import MAX_LISTED_SHARDS, Keys, parse_shard_counts, shard_tag
from tests.conftest import sample_catalog
from tests.store.test_shards import K, _cfg, _engine_4_after_k_changed, _Flaky


def test_a_metric_new_in_shard_1_after_several_transaction_reads_is_known(fake_client, namespace):
    """The transaction read fetches a shard's catalogue only when its version changed: a read at
    an unchanged version must not replace the catalogue it holds with "not read" (it did, so a
    later change in shard 1 merged without shard 0's specs and the new metric went unknown)."""
    b = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[1], client=fake_client(), start=False
    )
    a = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[0], client=fake_client(), start=False
    )
    b.counter("tokens").labels(engine=1).inc(1)
    a.counter("tokens").labels(engine=0).inc(1)
    assert a.flush() and b.flush()
    reader = StatsReader(_cfg(namespace), Catalog(), client=fake_client())  # knows no metric itself
    for _ in range(3):  # the second and third read the catalogues at the versions held
        snap = reader.snapshot()
        assert snap.engines[0].counter("tokens") == 1 and not snap.skipped
    extra = b.define(MetricSpec("only_in_shard_1", "counter", "Only in shard 1."))
    extra.labels(engine=1).inc(4)
    assert b.flush()  # b writes shard 1 only: the spec is stored there only
    for _ in range(2):
        snap = reader.snapshot()
        assert snap.engines[1].counter("only_in_shard_1") == 4
        assert snap.engines[0].counter("tokens") == 1 and snap.engines[1].counter("tokens") == 1
        assert not snap.skipped, snap.skipped
    a.close()
    b.close()


def test_garbage_in_the_shards_field_is_ignored_and_bounded():
    assert parse_shard_counts("3,abc") == {3}
    assert parse_shard_counts("999") == parse_shard_counts("1,1,1") == parse_shard_counts("") == set()
    assert parse_shard_counts("3,\u00b2") == {3}  # "²".isdigit() is True, int("²") raises
    assert parse_shard_counts("3,\u0663") == {3}  # Arabic-Indic 3: not what shards.lua writes
    assert parse_shard_counts("2,3,3,2") == {2, 3}
    every = parse_shard_counts(",".join(map(str, range(2, 65))))  # 2,016 shards listed
    assert sum(k - 1 for k in every) <= MAX_LISTED_SHARDS
    assert {64, 63} <= every  # the newest listed (shards.lua appends) are kept
    assert parse_shard_counts("3," + "64," * 5000 + "5") == {3, 5, 64}


def test_a_reader_survives_a_garbled_shards_field(fake_client, namespace):
    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[0, 1, 2], client=fake_client(), start=False
    )
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    assert w.flush()
    raw = fake_client()
    meta = Keys(namespace).meta
    for garbage, readable in (("3,\u00b2", [0, 1, 2]), (",".join(map(str, range(2, 65))) + ",3", [0, 1, 2])):
        raw.hset(meta, "shards", garbage)
        raw.hincrby(meta, "_v", 1)
        reader = StatsReader(_cfg(namespace), sample_catalog(), client=fake_client())
        snap = reader.snapshot()  # raised ValueError for "²"; read 2,017 shards for the long list
        assert sorted(snap.engines) == readable
        assert [snap.engines[e].counter("tokens") for e in readable] == [e + 1 for e in readable]
        assert len(reader.shard_keys) <= 1 + MAX_LISTED_SHARDS
        reader.close()
    w.close()


def test_a_reader_noting_garbage_over_time_stays_bounded(fake_client, namespace):
    """K noted by earlier reads stay read; a field rewritten with other garbage at every read
    must not add up past the bound."""
    raw = fake_client()
    meta = Keys(namespace).meta
    raw.hset(meta, mapping={"schema": "2", "_v": "1"})
    reader = StatsReader(_cfg(namespace), sample_catalog(), client=fake_client())
    for first in range(2, 64, 4):
        raw.hset(meta, "shards", ",".join(map(str, range(first, first + 4))))
        raw.hincrby(meta, "_v", 1)
        reader.snapshot()
        assert len(reader.shard_keys) <= 1 + MAX_LISTED_SHARDS


def test_gc_goes_on_past_a_shard_holding_garbage(fake_client, namespace):
    """A key of the wrong type in shard 1 costs shard 1's collection only (gc raised, and
    shard 2 was never collected)."""
    from redis_stats.ops.retention import collect_garbage

    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[0, 1, 2], client=fake_client(), start=False
    )
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    assert w.close()
    raw = fake_client()
    one = Keys(namespace).shard(1, K)
    raw.delete(one.writers)
    raw.set(one.writers, "garbage")
    time.sleep(0.25)
    result = collect_garbage(
        _cfg(namespace, retention=0.2, stale_after=0.1, flush_interval=0.1), client=fake_client()
    )
    assert result.engines == [0, 2] and result.writers == [w.writer_id]
    assert list(result.failed) == [one.prefix] and "WRONGTYPE" in result.failed[one.prefix]
    assert not raw.exists(Keys(namespace).shard(2, K).counters(2))
    assert raw.exists(one.counters(1))  # shard 1 untouched
    assert not raw.exists(Keys(namespace).gc_lock)  # the lease is given back


class _Hung(_Flaky):
    """Script calls to one shard hang for *hang* s, then fail (a socket timeout)."""

    hang = 3.0

    def execute_command(self, *args: Any, **kw: Any) -> Any:
        if args[0] == "EVALSHA" and str(args[3]).startswith(self.root) and self.fail:
            time.sleep(self.hang)
            raise redis.TimeoutError("Timeout reading from socket")
        return super().execute_command(*args, **kw)


def test_close_with_one_shard_down_says_what_is_lost_and_where(fake_client, namespace, caplog):
    """Changes recorded for a shard whose batch is in flight wait in its totals, not in the dirty
    list: the close that gives up counted only the batch in flight ("0 more changed since")."""
    one = Keys(namespace).shard(1, K)
    flaky = _Flaky(fake_client(), one.root)
    flaky.script_load(load_script("flush"))
    w = StatsWriter(_cfg(namespace, shards=K), sample_catalog(), engines=[0, 1], client=flaky, start=False)
    w.counter("tokens").labels(engine=1).inc(5)
    flaky.fail = ["before"] * 10_000
    assert not w.flush()  # shard 1's batch (tokens) stays in flight
    w.counter("requests").labels(engine=1, reason="stop").inc(1)
    w.histogram("latency_seconds").labels(engine=1).observe(1)
    w.counter("tokens").labels(engine=0).inc(1)  # shard 0 confirms its own
    assert not w.flush()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="redis_stats.writer"):
        assert not w.close(timeout=0.3)
    assert time.monotonic() - started < 0.3 + 2.0  # a margin no machine misses
    lost = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert len(lost) == 1
    assert "1 series in the unconfirmed batches and 2 more changed since" in lost[0]
    assert f"shards not confirmed: 1 ({one.root})" in lost[0]
    snap = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client()).snapshot()
    assert snap.engines[0].counter("tokens") == 1  # shard 0 is whole


def test_close_with_a_hung_shard_returns_by_its_deadline(fake_client, namespace):
    """The flusher thread makes the last flush; a shard whose call hangs (up to the socket
    timeout) does not hold close() past close_timeout, and the other shards are confirmed."""
    hung = _Hung(fake_client(), Keys(namespace).shard(2, K).root)
    hung.script_load(load_script("flush"))
    w = StatsWriter(_cfg(namespace, shards=K), sample_catalog(), engines=[0, 1, 2], client=hung)
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    hung.fail = ["hang"]
    started = time.monotonic()
    assert not w.close(timeout=0.5)
    assert time.monotonic() - started < _Hung.hang - 0.5  # not held by the 3 s hang
    time.sleep(_Hung.hang)  # the flusher's attempt ends
    snap = StatsReader(_cfg(namespace), sample_catalog(), client=fake_client()).snapshot()
    assert snap.engines[0].counter("tokens") == 1 and snap.engines[1].counter("tokens") == 2


def test_gc_keeps_an_engine_live_in_another_shard_after_k_changed(fake_client, namespace):
    """Engine 4's data written with K=1 is in shard 0; its writers moved to K=3 (shard 1), so
    nothing heartbeats engine 4 in shard 0 any more. The engine is live: gc must not delete its
    K=1-era hash there (the counter dropped from 12 to 7, a reset for Prometheus), only fold its
    departed writer."""
    from redis_stats.ops.retention import collect_garbage

    old, new = _engine_4_after_k_changed(fake_client, namespace)
    time.sleep(0.35)
    assert new.flush()  # engine 4 heartbeated (in shard 1) within the retention
    for dry in (True, False):
        result = collect_garbage(
            _cfg(namespace, retention=0.3, stale_after=0.15, flush_interval=0.02),
            dry_run=dry,
            client=fake_client(),
        )
        assert result.engines == [] and result.writers == [old.writer_id], (dry, result)
    for shards in (1, K):
        snap = StatsReader(_cfg(namespace, shards=shards), sample_catalog(), client=fake_client()).snapshot()
        assert snap.engines[4].counter("tokens") == 12
    assert fake_client().exists(Keys(namespace).base(4))  # the K=1 part, folded into base fields
    # Once engine 4 is silent everywhere, gc removes it in every shard.
    new.close()
    time.sleep(0.35)
    result = collect_garbage(
        _cfg(namespace, retention=0.3, stale_after=0.15, flush_interval=0.02), client=fake_client()
    )
    assert result.engines == [4]
    assert not StatsReader(_cfg(namespace), sample_catalog(), client=fake_client()).snapshot().engines


def _three_shards_written(fake_client: Any, namespace: str) -> StatsWriter:
    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=list(range(6)), client=fake_client(), start=False
    )
    for e in range(6):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    assert w.flush()
    return w


def test_the_first_read_of_a_reader_with_another_k_covers_every_shard(fake_client, namespace):
    """A reader configured with K=2 or K=5 (writers use K=3) learns K=3 from shard 0's catalogue
    in its first read: that read must not return without shards 1 and 2 of K=3 (an exporter
    restarted showed engines 1, 2, 4, 5 missing in its first scrape, back in the next)."""
    w = _three_shards_written(fake_client, namespace)
    for k in (2, 5):
        reader = StatsReader(_cfg(namespace, shards=k), sample_catalog(), client=fake_client())
        snap = reader.snapshot()
        assert {e: s.counter("tokens") for e, s in snap.engines.items()} == {e: e + 1 for e in range(6)}, k
        assert sorted(reader.snapshot(engines=[1, 4]).engines) == [1, 4]
    w.close()


def test_the_first_read_of_an_async_reader_with_another_k_covers_every_shard(fake_client, namespace):
    import asyncio

    import fakeredis

    from redis_stats.aio import AsyncStatsReader

    w = _three_shards_written(fake_client, namespace)
    server = fake_client().connection_pool.connection_kwargs["server"]

    async def first_read() -> dict[int, float]:
        client = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
        reader = AsyncStatsReader(_cfg(namespace, shards=5), sample_catalog(), client=client)
        snap = await reader.snapshot()
        await reader.aclose()
        return {e: s.counter("tokens") for e, s in snap.engines.items()}

    assert asyncio.run(first_read()) == {e: e + 1 for e in range(6)}
    w.close()


def test_a_writer_with_k_64_computes_only_the_tags_it_uses(fake_client, namespace):
    """A shard tag costs ~5 ms of CPU (4,096 salts): a writer of one engine with K=64 computed
    all 63 at construction (~0.3 s at every process start), though it writes one shard."""
    from redis_stats.keys import shard_tag

    shard_tag.cache_clear()
    w = StatsWriter(
        _cfg(namespace, shards=64), sample_catalog(), engines=[70], client=fake_client(), start=False
    )
    w.counter("tokens").labels(engine=70).inc(1)
    assert w.flush()
    assert shard_tag.cache_info().misses == 1  # shard 6's tag (shard 0's needs none)
    snap = StatsReader(_cfg(namespace), sample_catalog(), client=fake_client()).snapshot()
    assert snap.engines[70].counter("tokens") == 1
    w.close()


@pytest.mark.parametrize("shard", [0, 2])
@pytest.mark.parametrize("part", ["engines", "writers", "meta", "conflicts"])
def test_a_wrong_typed_list_in_one_shard_is_counted_every_read(fake_client, namespace, shard, part):
    """A shard's engines, writers, catalogue or conflicts of the wrong type costs that key only,
    and is counted (``wrong_type``) as an unsharded namespace's is: the merge left it out of the
    reply while another shard's list was readable, so it went uncounted (engine 2 vanished with
    nothing in redis_stats_skipped_fields)."""
    from redis_stats import RedisCollector

    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[0, 1, 2], client=fake_client(), start=False
    )
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    assert w.flush()
    key = getattr(Keys(namespace).shard(shard, K), part)
    raw = fake_client()
    raw.delete(key)
    raw.set(key, "garbage")
    # (A reader left at K=1 learns K from shard 0's catalogue: not when that one is garbage.)
    reader = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client())
    collector = RedisCollector(reader)
    for _ in range(2):  # the catalogue's failure too, at a version the decoder holds
        snap = reader.snapshot()
        assert dict(snap.skipped) == {"wrong_type": 1}, snap.skipped
        assert snap.skipped.where == [("wrong_type", key, "")]
        text = collector.render_text()
        assert 'redis_stats_skipped_fields{reason="wrong_type"} 1.0\n' in text
        if part != "engines":
            assert sorted(snap.engines) == [0, 1, 2]
    w.close()


def test_a_lost_reply_then_shard_1_losing_its_data_counts_once(fake_client, namespace):
    """Shard 1's reply is lost, then shard 1 alone loses its data (its Cluster master restarted
    without persistence) before the retry: the retry is applied afresh, the writer sends its
    whole state there again, shards 0 and 2 are untouched; every total exact (held)."""
    one = Keys(namespace).shard(1, K)
    flaky = _Flaky(fake_client(), one.root)
    flaky.script_load(load_script("flush"))
    w = StatsWriter(_cfg(namespace, shards=K), sample_catalog(), engines=[0, 1, 2], client=flaky, start=False)
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(e + 1)
        w.histogram("latency_seconds").labels(engine=e).observe(0.3)
    assert w.flush()
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(10)
    flaky.fail = ["after"]
    assert not w.flush()
    raw = fake_client()
    raw.delete(*raw.keys(one.root + "*"))
    w.counter("requests").labels(engine=1, reason="stop").inc(2)
    assert w.flush() and w.flush()
    snap = StatsReader(_cfg(namespace), sample_catalog(), client=fake_client()).snapshot()
    assert [snap.engines[e].counter("tokens") for e in range(3)] == [11, 12, 13]
    assert [snap.engines[e].histogram("latency_seconds").count for e in range(3)] == [1, 1, 1]
    assert snap.engines[1].counter("requests", "stop") == 2
    assert raw.hget(Keys(namespace).meta, "shards") == str(K)
    w.close()


@pytest.mark.redis_server
def test_a_rolling_k_change_with_threads_and_gc_keeps_every_total_exact(redis_server, namespace):
    """Writers with K=1, K=3 and K=2 in one namespace at once (a rolling reconfiguration), four
    threads each recording into every engine while their flusher threads run, readers of each K
    reading meanwhile; then gc folds the departed K=3 writer: every reader (K=1, 2, 3, 5) sums
    exactly, and the exposition holds each series once (held; the K=5 reader's first read was
    short before the readers read the shards they learn at once)."""
    import threading
    from collections import Counter

    from prometheus_client.parser import text_string_to_metric_families

    from redis_stats import RedisCollector, StatsConfig
    from redis_stats.ops.retention import collect_garbage

    cat = sample_catalog()

    def cfg(k: int, **kw: Any) -> StatsConfig:
        return StatsConfig(
            url=redis_server.url,
            namespace=namespace,
            shards=k,
            **{"flush_interval": 0.02, "stale_after": 120, **kw},
        )

    writers = [
        StatsWriter(cfg(1), cat, engines=list(range(6)), role="k1"),
        StatsWriter(cfg(3), cat, engines=list(range(6)), role="k3"),
        StatsWriter(cfg(2), cat, engines=[1, 3], role="k2"),
    ]
    n = 1500

    def record(w: StatsWriter, start: int) -> None:
        for i in range(n):
            e = (i + start) % 6
            w.counter("tokens").labels(engine=e).inc(1)
            w.histogram("latency_seconds").labels(engine=e).observe(0.2)
            w.counter("requests").labels(engine=e, reason=f"r{i % 3}").inc(1)

    threads = [threading.Thread(target=record, args=(w, t)) for w in writers for t in range(4)]
    for t in threads:
        t.start()
    readers = [StatsReader(cfg(k), cat) for k in (1, 3, 2)]
    while any(t.is_alive() for t in threads):
        for r in readers:
            r.snapshot()
    for t in threads:
        t.join()
    assert writers[1].close()
    time.sleep(0.25)
    keep = StatsWriter(cfg(3), cat, engines=list(range(6)), start=False)  # the engines stay live
    for w in (writers[0], writers[2], keep):
        assert w.flush()
    result = collect_garbage(cfg(1, retention=0.2, stale_after=0.1, flush_interval=0.1))
    assert result.engines == [] and writers[1].writer_id in result.writers and result.folded
    for w in (writers[0], writers[2], keep):
        assert w.close()
    for r in [*readers, StatsReader(cfg(5), cat)]:
        snap = r.snapshot()
        assert sum(s.counter("tokens") for s in snap.engines.values()) == 3 * 4 * n
        assert sum(s.histogram("latency_seconds").count for s in snap.engines.values()) == 3 * 4 * n
        assert not snap.skipped
        text = RedisCollector(r).render_text()
        lines = [x.rpartition(" ")[0] for x in text.splitlines() if x and not x.startswith("#")]
        assert not [s for s, c in Counter(lines).items() if c > 1]
        families = list(text_string_to_metric_families(text))
        assert len({f.name for f in families}) == len(families)
        assert sum(len(f.samples) for f in families) == len(lines)
        r.close()


def test_two_k_whose_shards_share_a_tag_are_read_once(fake_client):
    """Shard 1 of K=47 and shard 1 of K=48 of namespace "ns-0" get the same tag (the salts
    nearest two targets 7 slots apart): a namespace listing both K read those keys twice, and
    the merge added the engine's hash to itself (its base fields doubled: 205, not 105)."""
    ns = "ns-0"  # a private fake server: no other test's namespace
    assert shard_tag(ns, 1, 47) == shard_tag(ns, 1, 48)
    assert len(Keys(ns).all_shards({47, 48})) == 1 + 46 + 47 - 1
    w = StatsWriter(_cfg(ns, shards=47), sample_catalog(), engines=[1], client=fake_client(), start=False)
    w.counter("tokens").labels(engine=1).inc(5)
    assert w.flush()
    v = StatsWriter(_cfg(ns, shards=48), sample_catalog(), engines=[49], client=fake_client(), start=False)
    v.counter("tokens").labels(engine=49).inc(7)
    assert v.flush()  # shard 0 now lists "47,48"
    raw = fake_client()
    assert raw.hget(Keys(ns).meta, "shards") == "47,48"
    raw.hset(Keys(ns).shard(1, 47).counters(1), "tokens", "100")  # a base field (gc folded a writer)
    snap = StatsReader(_cfg(ns), sample_catalog(), client=fake_client()).snapshot()
    assert snap.engines[1].counter("tokens") == 105 and snap.engines[49].counter("tokens") == 7
    w.close()
    v.close()


@pytest.mark.redis_server
def test_a_writer_cut_off_from_one_shard_has_its_gauges_there_go_stale(redis_server, namespace):
    """Writer W (engines 0 and 1, K=3) loses shard 1 only (a partition between its host and
    that shard's master; shard 0 still answers it), while writer V keeps engine 1 live there.
    W's last gauge values in shard 1 are frozen: after stale_after they must be hidden, as an
    unsharded W cut off from Redis has them hidden. The merge took W's freshest heartbeat of any
    shard (shard 0's), so W's frozen gauge of engine 1 was summed in for ever (101, not 1), on
    both render paths and by the asyncio reader."""
    import asyncio

    from redis_stats import RedisCollector, StatsConfig
    from redis_stats.aio import AsyncStatsReader

    cfg = StatsConfig(
        url=redis_server.url, namespace=namespace, shards=K, stale_after=0.5, flush_interval=0.05
    )
    one = Keys(namespace).shard(1, K)
    cut = _Flaky(redis.Redis.from_url(redis_server.url, decode_responses=True), one.root)
    w = StatsWriter(cfg, sample_catalog(), engines=[0, 1], client=cut, start=False, role="W")
    v = StatsWriter(cfg, sample_catalog(), engines=[1], start=False, role="V")
    w.gauge("inflight").labels(engine=1).set(100)  # mode "sum": every live writer's value counts
    w.gauge("inflight").labels(engine=0).set(5)
    v.gauge("inflight").labels(engine=1).set(1)
    assert w.flush() and v.flush()
    reader = StatsReader(cfg, sample_catalog())
    collector = RedisCollector(StatsReader(cfg, sample_catalog()))
    assert reader.snapshot().engines[1].gauge("inflight") == 101

    async def read_async() -> Any:
        r = AsyncStatsReader(cfg, sample_catalog())
        try:
            return await r.snapshot()
        finally:
            await r.aclose()

    cut.fail = ["before"] * 10_000
    ended = time.monotonic() + 1.0  # twice stale_after
    while time.monotonic() < ended:
        assert not w.flush()  # shard 0 confirms; shard 1 unreachable for W
        assert v.flush()
        time.sleep(0.05)
    for snap in (reader.snapshot(), asyncio.run(read_async())):
        assert snap.writers[w.writer_id].live  # live: it heartbeats in shard 0
        assert snap.engines[0].gauge("inflight") == 5  # its gauges in shard 0 are current
        assert snap.engines[1].up and snap.engines[1].gauge("inflight") == 1  # V's only
    text = collector.render_text()
    assert 'inflight{engine="1"} 1.0\n' in text and 'inflight{engine="0"} 5.0\n' in text, text
    cut.fail = []
    assert w.flush()  # back: its gauges in shard 1 are current again
    assert reader.snapshot().engines[1].gauge("inflight") == 101
    for x in (w, v):
        assert x.close()
    reader.close()


class _ShardDown(redis.Redis):
    """A client to which one shard is unreachable: every command naming one of its keys times
    out (a partition between gc's host and that shard's master); the others go through."""

    root = ""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.root and any(str(a).startswith(self.root) for a in args[1:]):
            raise redis.TimeoutError("Timeout reading from socket")
        return super().execute_command(*args, **options)


@pytest.mark.redis_server
def test_gc_goes_on_past_an_unreachable_shard(redis_server, namespace):
    """Shard 1 unreachable from the host running gc: shards 0 and 2 are still collected and
    shard 1 is named in GcResult.failed, as for a shard holding garbage (the timeout was raised
    out of collect_garbage: shard 2 was never collected while shard 1 stayed down, and the
    exporter's gc timer logged that at DEBUG only). Once shard 1 answers, it is collected."""
    from redis_stats import StatsConfig
    from redis_stats.ops.retention import collect_garbage

    cfg = StatsConfig(url=redis_server.url, namespace=namespace, shards=K, flush_interval=0.05)
    w = StatsWriter(cfg, sample_catalog(), engines=[0, 1, 2], start=False)
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    assert w.close()
    shards = [Keys(namespace).shard(s, K) for s in range(K)]
    client = _ShardDown.from_url(redis_server.url, decode_responses=True)
    client.root = shards[1].root
    time.sleep(0.25)
    gc_cfg = StatsConfig(
        url=redis_server.url,
        namespace=namespace,
        shards=K,
        retention=0.2,
        stale_after=0.1,
        flush_interval=0.1,
    )
    result = collect_garbage(gc_cfg, client=client)
    assert list(result.failed) == [shards[1].prefix] and "Timeout" in result.failed[shards[1].prefix]
    assert result.engines == [0, 2] and result.writers == [w.writer_id]
    raw = redis.Redis.from_url(redis_server.url, decode_responses=True)
    assert [raw.exists(k.counters(e)) for e, k in enumerate(shards)] == [0, 1, 0]
    assert not raw.exists(shards[0].gc_lock)  # the lease is given back
    client.root = ""  # shard 1 answers again
    result = collect_garbage(gc_cfg, client=client)
    assert result.engines == [1] and not result.failed and not raw.exists(shards[1].counters(1))


@pytest.mark.parametrize("shards", [1, K])
def test_every_writer_stores_its_state_again_after_its_shard_lost_its_data(fake_client, namespace, shards):
    """Two writers of the same engines; Redis loses the data of the shard holding engine 1
    (its master restarted without persistence). Writer A flushes first and stores the catalogue
    again; writer B's flush then found a catalogue, so B never learnt that its own chunks' names
    were gone: its values stayed unreadable for good (``bad_chunk`` at every read, engine 1
    short of B's part, B's gauges gone). The script now says "no catalogue" to a writer past its
    first batch that the shard's sequence hash does not know, and B stores its state again."""
    cfg = _cfg(namespace, shards=shards)
    a, b = (
        StatsWriter(cfg, sample_catalog(), engines=[0, 1], role=r, client=fake_client(), start=False)
        for r in "ab"
    )
    for n, w in enumerate((a, b), 1):
        for e in (0, 1):
            w.counter("tokens").labels(engine=e).inc(n)
            w.gauge("inflight").labels(engine=e).set(n)
    assert a.flush() and b.flush()
    raw = fake_client()
    lost = Keys(namespace).shard(1 % shards, shards)
    raw.delete(*raw.keys(lost.root + "*"))
    for w in (a, b):
        w.counter("tokens").labels(engine=1).inc(10)
    assert a.flush() and a.flush()  # A finds the catalogue missing, then stores everything again
    assert b.flush() and b.flush()
    snap = StatsReader(cfg, sample_catalog(), client=fake_client()).snapshot()
    assert not snap.skipped, snap.skipped.where
    assert snap.engines[1].counter("tokens") == 1 + 2 + 20
    assert snap.engines[1].gauge("inflight") == 3  # both writers' gauges (mode sum)
    assert snap.engines[0].counter("tokens") == 3
    for w in (a, b):
        assert w.close()
