"""Retention: engines and writers gone for good are removed; a late write cannot bring gauges back."""

import itertools
import math
import subprocess
import time

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.keys import Keys
from redis_stats.ops.namespaces import describe_namespaces
from redis_stats.ops.retention import collect_garbage
from tests.chunked import writer_fields
from tests.conftest import PYTHON, sample_catalog

_examples = itertools.count()


def age(client, keys, engine=None, writer=None, seconds=0.0):
    old = (time.time() - seconds) * 1000
    if engine is not None:
        client.zadd(keys.engines, {str(engine): old})
    if writer is not None:
        client.zadd(keys.writers, {writer: old})


def test_gc_removes_what_is_past_retention_and_dry_run_only_lists(config, catalog, fake_client):
    cfg = config.replace(retention=60)
    keys = Keys(cfg.namespace)
    old = StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False)
    new = StatsWriter(cfg, catalog, engines=[1], client=fake_client(), start=False)
    for w, e in ((old, 0), (new, 1)):
        w.gauge("inflight").labels(engine=e).set(3)
        w.gauge("inflight").labels(engine=1).set(1)
        w.counter("tokens").labels(engine=e).inc(5)
        assert w.flush()
    client = fake_client()
    age(client, keys, engine=0, writer=old.writer_id, seconds=120)

    dry = collect_garbage(cfg, dry_run=True, client=client)
    assert (dry.engines, dry.writers) == ([0], [old.writer_id])
    assert client.exists(keys.counters(0))

    done = collect_garbage(cfg, client=client)
    assert (done.engines, done.writers) == ([0], [old.writer_id])
    assert not client.exists(keys.counters(0))
    snap = StatsReader(cfg, catalog, client=fake_client()).snapshot()
    assert sorted(snap.engines) == [1]
    assert old.writer_id not in snap.writers
    # The removed writer's chunks on engine 1 are gone (its counters folded into the base, its
    # gauge dropped), the live writer's stay.
    assert writer_fields(client, keys.counters(1), old.writer_id) == []
    assert writer_fields(client, keys.counters(1), new.writer_id) != []
    assert snap.engines[1].gauge("inflight") == 1
    assert client.hget(keys.seq, old.writer_id).startswith("x")


def test_late_write_from_removed_writer_counts_but_does_not_resurrect_gauges(config, catalog, fake_client):
    cfg = config.replace(retention=60)
    keys = Keys(cfg.namespace)
    w = StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False)
    w.gauge("running").labels(engine=0).set(99)
    w.counter("tokens").labels(engine=0).inc(1)
    assert w.flush()
    other = StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False)
    assert other.flush()
    client = fake_client()
    old_id = w.writer_id
    age(client, keys, writer=old_id, seconds=120)
    collect_garbage(cfg, client=client)

    # The paused process wakes up: its pending flush carries counters and its stale gauge.
    w.counter("tokens").labels(engine=0).inc(2)
    w.gauge("running").labels(engine=0).set(98)
    assert w.flush()
    snap = StatsReader(cfg, catalog, client=fake_client()).snapshot()
    # schema 2: gc folded what Redis held of the old id (1) into the base; the late batch is not
    # applied under it (its totals would count the folded part twice): it is sent again below.
    assert snap.engines[0].counter("tokens") == 1
    assert snap.engines[0].gauge("running") is None  # not resurrected
    assert old_id not in snap.writers
    # It carries on as a new incarnation: its next flush re-sends the rest and its current gauges.
    assert w.writer_id != old_id
    assert w.flush()
    snap = StatsReader(cfg, catalog, client=fake_client()).snapshot()
    assert snap.engines[0].counter("tokens") == 3  # counted, exactly once
    assert snap.engines[0].gauge("running") == 98


def test_only_one_process_collects_at_a_time(config, fake_client):
    keys = Keys(config.namespace)
    client = fake_client()
    client.set(keys.gc_lock, "someone-else", px=60_000)
    assert collect_garbage(config, client=client).skipped


def test_exporter_runs_retention_on_a_timer(redis_server, namespace, catalog):
    from redis_stats import StatsConfig
    from redis_stats.connection import make_client
    from redis_stats.server import Exporter

    cfg = StatsConfig(url=redis_server.url, namespace=namespace, retention=60)
    w = StatsWriter(cfg, catalog, engines=[5], start=False)
    assert w.flush()
    client = make_client(cfg)
    age(client, Keys(namespace), engine=5, seconds=120)
    exporter = Exporter(StatsReader(cfg, catalog), port=0, gc_interval=0.2).start()
    try:
        deadline = time.monotonic() + 5
        while client.zscore(Keys(namespace).engines, "5") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        exporter.close()
    assert client.zscore(Keys(namespace).engines, "5") is None
    w._closed = True


def test_gc_folds_a_writer_whose_id_has_characters_that_fields_escape(config, catalog, fake_client):
    # gc.lua finds a writer's chunks by the escaped id ("@|<id>|"): it must escape as codec.py
    # does, newline included, or the chunks stay (counted twice once folded by hand) unfolded.
    cfg = config.replace(retention=60)
    keys = Keys(cfg.namespace)
    odd = "host:1:role\nwith|odd\\chars:ab12"
    w = StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False, writer_id=odd)
    w.counter("tokens").labels(engine=0).inc(7)
    assert w.flush()
    other = StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False)
    assert other.flush()
    client = fake_client()
    age(client, keys, writer=odd, seconds=120)

    done = collect_garbage(cfg, client=client)
    assert done.writers == [odd] and done.folded >= 1
    assert writer_fields(client, keys.counters(0), odd) == []
    assert StatsReader(cfg, catalog, client=fake_client()).snapshot().engines[0].counter("tokens") == 7


def test_gc_deletes_a_namespace_it_emptied_so_it_is_no_longer_listed(config, catalog, fake_client):
    """Every engine and writer gone: nothing of the namespace is left after that one collection,
    its fresh tombstones included (before: a closed writer's tombstone kept it listed, with 0
    engines and 0 writers, until a gc one more retention later)."""
    from redis_stats.ops.namespaces import find_namespaces

    cfg = config.replace(retention=60)
    keys = Keys(cfg.namespace)
    w = StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False)
    w.counter("tokens").labels(engine=0).inc(5)
    assert w.flush() and w.close()
    client = fake_client()
    age(client, keys, engine=0, writer=w.writer_id, seconds=120)
    client.zadd(keys.writers, {w.writer_id: -(time.time() - 120) * 1000})  # closed, long ago
    done = collect_garbage(cfg, client=client)
    assert (done.engines, done.writers) == ([0], [w.writer_id])
    assert not list(client.scan_iter(f"rs:{{{cfg.namespace}}}*"))
    assert cfg.namespace not in find_namespaces(client)
    # A writer of the namespace starts it afresh.
    again = StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False)
    again.counter("tokens").labels(engine=0).inc(2)
    assert again.flush()
    assert StatsReader(cfg, catalog, client=fake_client()).snapshot().engines[0].counter("tokens") == 2
    again.close()


@pytest.mark.redis_server
def test_gc_of_a_namespace_nobody_writes_to_leaves_it_unlisted(redis_server, namespace, python_env):
    """Real processes: one writer closes, one dies without closing (``os._exit``); one
    ``redis-stats gc`` past the retention, and ``redis-stats namespaces`` lists nothing (before:
    ``NS: 0 engines (0 up), 0 writers (0 live), no heartbeat``, the closed writer's tombstone)."""
    env = {
        **python_env,
        "REDIS_STATS_URL": redis_server.url,
        "REDIS_STATS_NAMESPACE": namespace,
        "REDIS_STATS_STALE_AFTER": "0.5",
        "REDIS_STATS_FLUSH_INTERVAL": "0.1",
    }
    child = (
        "import os, sys\n"
        "from redis_stats import StatsConfig, StatsWriter\n"
        "from redis_stats.integrations.vllm import vllm_catalog\n"
        "w = StatsWriter(StatsConfig.from_env(), vllm_catalog(), engines=[int(sys.argv[1])], role='api')\n"
        "w.counter('vllm:generation_tokens').labels(model_name='m', engine=int(sys.argv[1])).inc(5)\n"
        "assert w.flush()\n"
        "os._exit(0) if sys.argv[2] == 'dies' else w.close()\n"
    )
    for engine, how in ((0, "closes"), (1, "dies")):
        subprocess.run([PYTHON, "-c", child, str(engine), how], env=env, check=True, timeout=60)

    def cli(*args: str) -> str:
        out = subprocess.run([PYTHON, "-m", "redis_stats", *args], env=env, capture_output=True, text=True)
        return out.stdout + out.stderr

    def listed() -> list[str]:  # (the session's Redis holds other tests' namespaces too)
        return [line for line in cli("namespaces").splitlines() if line.startswith(f"{namespace}:")]

    assert listed()[0].startswith(f"{namespace}: 2 engines ("), listed()
    time.sleep(2.5)  # past the retention (1 s) and 2 x the writers' stale_after
    assert "removed 2 engines [0, 1] and 2 writers" in cli("gc", "--retention", "1")
    assert listed() == []
    client = redis.Redis.from_url(redis_server.url)
    assert not list(client.scan_iter(f"rs:{{{namespace}}}*"))


@pytest.mark.redis_server
def test_a_paused_writer_alone_in_a_namespace_gc_deleted_is_counted_once(redis_server, namespace):
    """The tombstone guarantee when gc deletes the namespace whole: the only writer is paused with
    a flush in flight (applied, its reply lost), gc removes its engine, the writer and, with the
    namespace empty, every key, its tombstone too. The writer then retries the same batch: it
    finds no sequence entry and no catalogue, stores its whole state again, and every count is
    there once (a tombstone guards folded base fields, and none is left)."""
    from redis_stats import StatsConfig
    from redis_stats.ops.namespaces import find_namespaces
    from tests.conftest import sample_catalog
    from tests.proxy import CuttingProxy

    url = redis_server.url
    fleet = {"retention": 0.3, "stale_after": 0.15, "flush_interval": 0.05}
    warm = StatsWriter(StatsConfig(url=url, namespace=namespace), sample_catalog(), engines=[9], start=False)
    assert warm.flush() and warm.close()  # the script is loaded: the cut below is the flush's own reply
    proxy = CuttingProxy(redis_server.port)
    w = StatsWriter(
        StatsConfig(url=proxy.url, namespace=namespace, **fleet), sample_catalog(), engines=[0], start=False
    )
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        w.counter("tokens").labels(engine=0).inc(100)
        assert w.flush()
        w.counter("tokens").labels(engine=0).inc(10)
        assert w._client is not None
        w._client.ping()
        proxy.cut_probability = 1.0
        assert not w.flush()  # applied, its reply lost
        proxy.cut_probability = 0.0
        deadline = time.monotonic() + 10
        while namespace in find_namespaces(client):
            assert time.monotonic() < deadline, "gc did not empty the namespace"
            time.sleep(0.1)
            collect_garbage(StatsConfig(url=url, namespace=namespace, **fleet))
        assert w.flush() and w.flush()  # the retry, then everything again
        snap = StatsReader(StatsConfig(url=url, namespace=namespace), sample_catalog()).snapshot()
        assert snap.engines[0].counter("tokens") == 110
    finally:
        w.close(timeout=2)
        proxy.close()


def test_gc_with_a_retention_too_short_for_a_writer_keeps_it_while_readers_may_call_it_live(
    config, catalog, fake_client
):
    # The writer declares stale_after 100 s (readers call it live that long); gc runs with its
    # own config, retention 60 s. Silent 120 s: still within 2 x its stale_after, kept whole.
    patient = StatsWriter(
        config.replace(stale_after=100, retention=200),
        catalog,
        engines=[0],
        client=fake_client(),
        start=False,
    )
    patient.counter("tokens").labels(engine=0).inc(7)
    assert patient.flush()
    client = fake_client()
    keys = Keys(config.namespace)
    gc_config = config.replace(retention=60)
    age(client, keys, engine=0, writer=patient.writer_id, seconds=120)
    kept = collect_garbage(gc_config, client=client)
    assert (kept.engines, kept.writers) == ([], [])
    assert StatsReader(config, catalog, client=fake_client()).snapshot().engines[0].counter("tokens") == 7
    # Silent past 2 x 100 s: removed as any writer past the retention (its totals folded).
    age(client, keys, engine=0, writer=patient.writer_id, seconds=201)
    assert collect_garbage(gc_config, client=client).writers == [patient.writer_id]
    # Garbage for a declared stale_after (inf, nan, a word) protects no writer.
    other = StatsWriter(config, catalog, engines=[1], client=fake_client(), start=False)
    assert other.flush()
    for bad in ("inf", "nan", "-5", "soon"):
        client.hset(keys.writer_stats(other.writer_id), "stale_ms", bad)
        age(client, keys, writer=other.writer_id, seconds=120)
        assert collect_garbage(gc_config, client=client, dry_run=True).writers == [other.writer_id], bad
    patient._closed = other._closed = True


def test_in_a_sharded_namespace_gc_judges_a_writer_by_its_stale_after_in_every_shard(
    config, catalog, fake_client
):
    # The writer stores its stale_after with its self-metrics in its home shard only; gc must
    # keep it in the other shard too (there it would fold it and delete engine 1 whole).
    sharded = config.replace(shards=2, stale_after=100, retention=200)
    w = StatsWriter(sharded, catalog, engines=[0, 1], client=fake_client(), start=False)
    w.counter("tokens").labels(engine=0).inc(5)
    w.counter("tokens").labels(engine=1).inc(7)
    assert w.flush()
    client = fake_client()
    for s in range(2):
        shard = Keys(config.namespace).shard(s, 2)
        for e in client.zrange(shard.engines, 0, -1):
            age(client, shard, engine=e, seconds=90)
        for writer in client.zrange(shard.writers, 0, -1):
            age(client, shard, writer=writer, seconds=90)
    kept = collect_garbage(config.replace(shards=2, retention=60), client=client)
    assert (kept.engines, kept.writers) == ([], [])
    snap = StatsReader(sharded, catalog, client=fake_client()).snapshot()
    assert [snap.engines[e].counter("tokens") for e in (0, 1)] == [5, 7]
    w._closed = True


@pytest.mark.redis_server
def test_namespaces_says_how_to_remove_a_namespace_an_older_gc_left_empty(redis_server, namespace):
    """A namespace with no engine and no writer (an older gc kept it for a closed writer's
    tombstone): `namespaces` says it is empty and which command removes it, and that command does."""
    from redis_stats import StatsConfig
    from redis_stats.ops.namespaces import describe_namespaces, summary
    from tests.conftest import sample_catalog

    cfg = StatsConfig(url=redis_server.url, namespace=namespace, retention=60)
    w = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    w.counter("tokens").labels(engine=0).inc(1)
    assert w.flush() and w.close()
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = Keys(namespace)
    # What main's gc left: the catalogue and a closed writer's tombstone, nothing else.
    client.delete(
        keys.engines, keys.writers, keys.counters(0), keys.gauges(0), keys.writer_stats(w.writer_id)
    )
    client.hset(keys.seq, w.writer_id, f"x1:{int(time.time() * 1000)}")
    (info,) = describe_namespaces(client, 30.0, [namespace])
    line = summary(info)
    assert (
        line
        == f"{namespace}: empty (no engine, no writer): `redis-stats gc --namespace {namespace}` removes it"
    )
    collect_garbage(cfg)
    assert not list(client.scan_iter(f"rs:{{{namespace}}}*"))


# -- gc and every reader judge each writer by one rule, whatever it stored (issue 32) -----------

# What a writer's stale_ms may hold in Redis: its own value, garbage, huge, tiny, or nothing.
_STORED = st.one_of(
    st.none(),
    st.sampled_from(
        ["30000", "100", "99", "3600000", "3600001", "1e12", "inf", "-inf", "nan", "", "soon", "0"]
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**15), 10**15).map(str),
    st.text(max_size=6),
)
_AGES = st.sampled_from([1, 20, 45, 100, 170, 500, 3000, 9000])  # seconds since the heartbeat
_RETENTION = 60


def _judged_s(text: str | None) -> float:
    """docs/configuration.md: a stored value within 100..3,600,000 ms, else the default 30 s."""
    try:
        ms = float(text) if text is not None else math.nan
    except ValueError:
        ms = math.nan
    return ms / 1000 if 100 <= ms <= 3_600_000 else 30.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_STORED, _AGES), min_size=1, max_size=4))
def test_gc_and_every_reader_judge_each_writer_alike_whatever_it_stored(writers):
    # One writer's 1e12 was borrowed by every writer whose value was garbage or missing (readers
    # called them live for ever), while gc judged those by 0 and removed them.
    server = fakeredis.FakeServer()

    def client() -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=server, decode_responses=True)

    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace=f"gc-{next(_examples)}", flush_interval=0.05)
    keys, raw = Keys(cfg.namespace), client()
    ids = []
    for engine, (text, seconds) in enumerate(writers):
        assume(all(abs(seconds - b) > 1 for b in (_judged_s(text), 2 * _judged_s(text), _RETENTION)))
        w = StatsWriter(cfg, sample_catalog(), engines=[engine], client=client(), start=False)
        w.gauge("running").labels(engine=engine).set(1)
        assert w.flush()
        w._closed = True
        if text is None:
            raw.hdel(keys.writer_stats(w.writer_id), "stale_ms")
        else:
            raw.hset(keys.writer_stats(w.writer_id), "stale_ms", text)
        age(raw, keys, engine=engine, writer=w.writer_id, seconds=seconds)
        ids.append(w.writer_id)
    reader = StatsReader(cfg.replace(stale_after=5.0), sample_catalog(), client=client())
    snap, load = reader.snapshot(), reader.load()
    gone = set(collect_garbage(cfg.replace(retention=_RETENTION), dry_run=True, client=client()).writers)
    [info] = describe_namespaces(client(), 5.0, [cfg.namespace])
    for engine, ((text, seconds), wid) in enumerate(zip(writers, ids)):
        live = seconds < _judged_s(text)
        removed = seconds > _RETENTION and seconds > 2 * _judged_s(text)
        seen = (snap.writers[wid].live, snap.engines[engine].up, load.engines[engine].up, wid in gone)
        assert seen == (live, live, live, removed), (text, seconds, seen)
    assert info.writers_live == sum(s < _judged_s(t) for t, s in writers)
