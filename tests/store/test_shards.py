"""A namespace split over K shards (issue 15, goal 2; docs/key-schema.md, "Shards"): engine e in
shard e % K, each shard its own hash tag and its own exactly-once state; readers merge them."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import redis

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats._scripts import load_script
from redis_stats.config import ConfigError
from redis_stats.keys import Keys, shard_of, shard_slot, shard_tag
from tests.conftest import sample_catalog

K = 3


def _cfg(namespace: str, url: str = "redis://127.0.0.1:1/0", **kw: Any) -> StatsConfig:
    return StatsConfig(url=url, namespace=namespace, **{"flush_interval": 0.05, **kw})


def _engine_4_after_k_changed(fake_client: Any, namespace: str) -> tuple[StatsWriter, StatsWriter]:
    """Engine 4 written with K=1 (shard 0) by a writer now closed (5 tokens), then with K=3
    (shard 1) by a live one (7 tokens): (old writer, new writer)."""
    old = StatsWriter(_cfg(namespace), sample_catalog(), engines=[4], client=fake_client(), start=False)
    old.counter("tokens").labels(engine=4).inc(5)
    assert old.close()
    new = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[4], client=fake_client(), start=False
    )
    new.counter("tokens").labels(engine=4).inc(7)
    assert new.flush()
    return old, new


def _record(w: StatsWriter, engines: range, n: int) -> None:
    for e in engines:
        w.counter("tokens").labels(engine=e).inc(n * (e + 1))
        w.counter("requests").labels(engine=e, reason="stop").inc(n)
        w.histogram("latency_seconds").labels(engine=e).observe(0.3)
        w.gauge("inflight").labels(engine=e).set(e)


def test_k1_keys_are_the_unsharded_layout(namespace):
    """K=1 is byte for byte the layout of before: no migration, and shard 0 of any K is it."""
    ns = namespace
    assert Keys(ns).shard(0, 3) == Keys(ns)
    assert Keys(ns).seq == f"rs:{{{ns}}}:v2:seq" and Keys(ns).leader == f"rs:{{{ns}}}:leader"
    w = StatsWriter(_cfg(ns), sample_catalog(), engines=[0, 1, 2], start=False)
    [(_shard, keys, _args)] = w.prepare_flushes()
    prefix = f"rs:{{{ns}}}:v2:"
    fixed = [prefix + x for x in ("seq", "engines", "writers", "meta", "claims", "conflicts")]
    assert keys == [
        *fixed,
        f"{prefix}w:{w.writer_id}",
        f"{prefix}load",
        *[f"{prefix}e:{e}:c" for e in range(3)],
    ]
    assert _args[0] == prefix


def test_the_option_is_checked():
    assert StatsConfig.from_env({"REDIS_STATS_SHARDS": "3"}).shards == 3
    for bad in (0, 65, "3", True):
        with pytest.raises(ConfigError, match="shards="):
            StatsConfig(shards=bad)


def test_engine_to_shard_and_tags_deterministic_and_spread():
    assert [shard_of(e, 3) for e in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    for ns in ("default", "llama-3-8b", "a", "fleet/prod:1"):
        tags = [shard_tag(ns, s, K) for s in range(K)]
        assert tags[0] == ns and all(t.startswith(f"{ns}#{s}.") for s, t in enumerate(tags) if s)
        base = shard_slot(ns, 0, K)
        for s in range(1, K):
            offset = (shard_slot(ns, s, K) - base) % 16384
            assert abs(offset - s * 16384 // K) <= 8, (ns, s, offset)
    # The same in another process (no per-process hash seed in the choice).
    code = (
        "from redis_stats.keys import shard_tag; print(shard_tag('llama-3-8b', 2, 3), shard_tag('x', 5, 8))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == [shard_tag("llama-3-8b", 2, 3), shard_tag("x", 5, 8)]


def _round_trip(client_of: Any, ns: str, url: str) -> None:
    cat = sample_catalog()
    cfg = _cfg(ns, url, shards=K)
    writers = [
        StatsWriter(cfg, cat, engines=list(range(6)), role=f"api{i}", client=client_of(), start=False)
        for i in range(2)
    ]
    for n, w in enumerate(writers, 1):
        w.stats_interval = 0  # the routine self-metrics with every flush (else every 5 s)
        _record(w, range(6), n)
        assert w.flush() and w.flush()  # the second stores what the first counted
    raw = client_of()
    for e in range(6):  # each engine's hash is in its shard, and only there
        for s in range(K):
            held = raw.exists(Keys(ns).shard(s, K).counters(e))
            assert held == (s == e % K), (e, s)
    for reader_cfg in (cfg, _cfg(ns, url)):  # K from the config, or found in shard 0's catalogue
        reader = StatsReader(reader_cfg, sample_catalog(), client=client_of())
        snap = reader.snapshot()
        assert sorted(snap.engines) == list(range(6))
        for e in range(6):
            eng = snap.engines[e]
            assert eng.counter("tokens") == 3 * (e + 1)  # 1*(e+1) + 2*(e+1)
            assert eng.counter("requests", "stop") == 3
            assert eng.histogram("latency_seconds").count == 2
            assert eng.gauge("inflight") == 2 * e  # summed over the two live writers
        assert set(snap.writers) == {w.writer_id for w in writers}
        for w in writers:  # self-metrics from the home shard, once: one flush per shard call
            assert snap.writers[w.writer_id].stats["flushes"] == str(K)
        assert not snap.skipped
        text = RedisCollector(reader).render_text()  # the exposition renders the merged reply
        assert 'tokens_total{engine="5"} 18\n' in text and 'tokens_total{engine="0"} 3\n' in text
        # A filtered read too.
        assert sorted(reader.snapshot(engines=[1, 5]).engines) == [1, 5]
        reader.close()
    for w in writers:
        assert w.close()


def test_round_trip_over_three_shards_fakeredis(fake_client, namespace):
    _round_trip(fake_client, namespace, "redis://127.0.0.1:1/0")


@pytest.mark.redis_server
def test_round_trip_over_three_shards_one_transaction(redis_server, namespace):
    """On one server the reader reads every shard in one MULTI (one round trip)."""
    _round_trip(
        lambda: redis.Redis.from_url(redis_server.url, decode_responses=True), namespace, redis_server.url
    )
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    reader = StatsReader(_cfg(namespace, redis_server.url, shards=K), sample_catalog(), client=client)
    reader.snapshot()
    client.config_resetstat()
    reader.snapshot()
    stats = client.info("commandstats")
    assert stats["cmdstat_multi"]["calls"] == 1 and stats["cmdstat_exec"]["calls"] == 1
    assert "cmdstat_evalsha" not in stats and "cmdstat_evalsha_ro" not in stats


class _Flaky:
    """A client whose script calls to one shard fail: before Redis runs them, or after (the
    reply lost); everything else goes through. Records every flush call (shard root, seq)."""

    def __init__(self, inner: Any, root: str) -> None:
        self.inner, self.root = inner, root
        self.fail: list[str] = []  # "before" / "after", one per call to the shard
        self.calls: list[tuple[str, str]] = []

    def execute_command(self, *args: Any, **kw: Any) -> Any:
        if args[0] == "EVALSHA" and str(args[3]).endswith(":v2:seq"):
            root = str(args[3])[: -len("v2:seq")]
            self.calls.append((root, str(args[3 + int(args[2]) + 2])))
            if root == self.root and self.fail:
                how = self.fail.pop(0)
                if how == "before":
                    raise redis.ConnectionError("down")
                self.inner.execute_command(*args, **kw)
                raise redis.ConnectionError("reply lost")
        return self.inner.execute_command(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_failing_shard_retries_its_own_batch_and_nothing_doubles(fake_client, namespace):
    cfg = _cfg(namespace, shards=K)
    one = Keys(namespace).shard(1, K).root
    flaky = _Flaky(fake_client(), one)
    flaky.script_load(load_script("flush"))  # no NOSCRIPT retry among the calls counted
    w = StatsWriter(cfg, sample_catalog(), engines=[0, 1], client=flaky, start=False)
    w.counter("tokens").labels(engine=0).inc(5)
    w.counter("tokens").labels(engine=1).inc(7)
    flaky.fail = ["after", "before"]
    assert not w.flush()  # shard 0 applied; shard 1 applied but its reply was lost
    w.counter("tokens").labels(engine=0).inc(1)
    w.counter("tokens").labels(engine=1).inc(1)
    assert not w.flush()  # shard 1 down
    assert w.flush()
    assert w.flush()
    zero = Keys(namespace).root
    assert [seq for root, seq in flaky.calls if root == zero] == ["1", "2", "3", "4"]  # never resent
    assert [seq for root, seq in flaky.calls if root == one] == ["1", "1", "1", "2"]  # its own, again
    snap = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client()).snapshot()
    assert snap.engines[0].counter("tokens") == 6 and snap.engines[1].counter("tokens") == 8
    assert w.stats.errors["connection"] == 2 and not w.pending()


def test_an_engine_in_two_shards_after_k_changed_is_summed(fake_client, namespace):
    """Engine 4 written with K=1 (shard 0), then with K=3 (shard 1): both writers' chunks and
    gc's base fields add up, whatever K the reader is configured with."""
    old = StatsWriter(_cfg(namespace), sample_catalog(), engines=[4], client=fake_client(), start=False)
    old.counter("tokens").labels(engine=4).inc(5)
    old.histogram("latency_seconds").labels(engine=4).observe(0.3)
    assert old.close()
    new = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[4], client=fake_client(), start=False
    )
    new.counter("tokens").labels(engine=4).inc(7)
    new.histogram("latency_seconds").labels(engine=4).observe(2.0)
    assert new.flush()
    raw = fake_client()
    assert raw.exists(Keys(namespace).counters(4)) and raw.exists(Keys(namespace).shard(1, K).counters(4))
    raw.hset(Keys(namespace).counters(4), "tokens", "100")  # a base field (gc folded a writer)
    raw.hset(Keys(namespace).shard(1, K).counters(4), "tokens", "1000")
    for shards in (1, K):
        snap = StatsReader(_cfg(namespace, shards=shards), sample_catalog(), client=fake_client()).snapshot()
        assert snap.engines[4].counter("tokens") == 1112
        hist = snap.engines[4].histogram("latency_seconds")
        assert hist is not None and hist.count == 2 and hist.sum == pytest.approx(2.3)
    new.close()


def test_a_writer_only_in_shard_1_keeps_its_self_metrics_there(fake_client, namespace):
    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[1, 4], client=fake_client(), start=False
    )
    w.stats_interval = 0  # the routine self-metrics with every flush (else every 5 s)
    w.counter("tokens").labels(engine=4).inc(1)
    assert w.flush() and w.flush()
    raw = fake_client()
    assert w.home == 1
    assert raw.exists(Keys(namespace).shard(1, K).writer_stats(w.writer_id))
    assert not raw.exists(Keys(namespace).writer_stats(w.writer_id))
    assert not raw.exists(Keys(namespace).writers)  # nothing of it in shard 0 ...
    assert raw.hget(Keys(namespace).meta, "shards") == str(K)  # ... but K, for readers
    snap = StatsReader(_cfg(namespace), sample_catalog(), client=fake_client()).snapshot()
    assert snap.engines[4].counter("tokens") == 1 and snap.writers[w.writer_id].stats["flushes"] == "1"
    w.close()


def test_gc_namespaces_and_inspect_cover_every_shard(fake_client, namespace, monkeypatch):
    import time

    from redis_stats.ops import inspection
    from redis_stats.ops.namespaces import describe_namespaces
    from redis_stats.ops.retention import collect_garbage

    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=list(range(6)), client=fake_client(), start=False
    )
    _record(w, range(6), 1)
    assert w.close()
    infos = [i for i in describe_namespaces(fake_client(), 30.0) if i.namespace == namespace]
    assert len(infos) == 1 and infos[0].engines == 6 and infos[0].writers == 1
    monkeypatch.setattr(inspection, "make_client", lambda config: fake_client())
    lines = "\n".join(inspection.inspect_namespace(_cfg(namespace), sample_catalog()))
    assert "shards: 3" in lines and "engines: 6" in lines
    assert "slot" in lines and lines.count("stored by 1 writer in 1 chunk") == 6
    time.sleep(0.25)
    # A gc configured with K=1 finds the shards in shard 0's catalogue, and collects each one.
    result = collect_garbage(
        _cfg(namespace, retention=0.2, stale_after=0.1, flush_interval=0.1), client=fake_client()
    )
    assert result.engines == list(range(6)) and result.writers == [w.writer_id]
    snap = StatsReader(_cfg(namespace), sample_catalog(), client=fake_client()).snapshot()
    assert not snap.engines and not snap.writers


@pytest.mark.redis_server
def test_acl_users_of_the_documented_rules_reach_every_shard_and_nothing_else(redis_server, namespace):
    from tests import acl

    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    host = redis_server.url.split("//", 1)[1].split("/", 1)[0]
    admin.execute_command("ACL", "SETUSER", f"w-{namespace}", *acl.rules(namespace, "wp", acl.WRITER))
    admin.execute_command(
        "ACL", "SETUSER", f"r-{namespace}", *acl.rules(namespace, "rp", acl.READER, read_only=True)
    )
    try:
        w_url, r_url = f"redis://w-{namespace}:wp@{host}/0", f"redis://r-{namespace}:rp@{host}/0"
        w = StatsWriter(
            _cfg(namespace, w_url, shards=K), sample_catalog(), engines=list(range(6)), start=False
        )
        _record(w, range(6), 1)
        assert w.flush() and not w.stats.errors
        snap = StatsReader(_cfg(namespace, r_url), sample_catalog()).snapshot()
        assert [snap.engines[e].counter("tokens") for e in range(6)] == [e + 1 for e in range(6)]
        assert w.close()
        # Another namespace's shards stay out of reach.
        other = StatsWriter(
            _cfg(namespace + "x", w_url, shards=K), sample_catalog(), engines=[1], start=False
        )
        assert not other.flush() and other.stats.errors["noperm"] >= 1
        other._closed = True
    finally:
        admin.execute_command("ACL", "DELUSER", f"w-{namespace}", f"r-{namespace}")


def test_gc_removing_the_writer_in_one_shard_only_renames_it_there_and_nothing_doubles(
    fake_client, namespace
):
    import time

    from redis_stats.ops.retention import collect_garbage

    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[0, 1], client=fake_client(), start=False
    )
    w.counter("tokens").labels(engine=0).inc(5)
    w.counter("tokens").labels(engine=1).inc(7)
    assert w.flush()
    first = w.writer_id
    one = Keys(namespace).shard(1, K)  # as if it had missed heartbeats in shard 1 alone, for a day
    old = (time.time() - 2 * 86_400) * 1000
    fake_client().zadd(one.writers, {first: old})  # the writer goes there; the engine stays
    removed = collect_garbage(_cfg(namespace, shards=K), client=fake_client())
    assert removed.writers == [first] and removed.folded >= 1  # folded into shard 1's base fields
    w.counter("tokens").labels(engine=0).inc(1)
    w.counter("tokens").labels(engine=1).inc(1)
    assert w.flush()  # shard 1 answers "removed": nothing applied there
    assert w.flush() and w.flush()
    assert w.writer_id == first and w.shard_ids[1] != first  # renamed in shard 1 only
    snap = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=fake_client()).snapshot()
    assert snap.engines[0].counter("tokens") == 6 and snap.engines[1].counter("tokens") == 8
    w.close()


@pytest.mark.redis_server
def test_a_forked_child_is_a_new_writer_in_every_shard(redis_server, namespace):
    cfg = _cfg(namespace, redis_server.url, shards=K)
    w = StatsWriter(cfg, sample_catalog(), engines=[0, 1, 2], start=False)
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(1)
    assert w.flush()  # the parent's batches are confirmed: the child must not send them again
    for e in range(3):
        w.counter("tokens").labels(engine=e).inc(2)  # pending in the parent only
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = False
        try:
            for e in range(3):
                w.counter("tokens").labels(engine=e).inc(10)
            ok = w.close(timeout=10) and w.writer_id not in (None, "")
        finally:
            os._exit(0 if ok else 1)
    assert w.close(timeout=10)
    assert os.waitpid(pid, 0)[1] == 0
    snap = StatsReader(cfg, sample_catalog()).snapshot()
    assert [snap.engines[e].counter("tokens") for e in range(3)] == [13, 13, 13]
    assert len(snap.writers) == 2


def test_k_is_noted_again_when_redis_lost_its_data(fake_client, namespace):
    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=[1], client=fake_client(), start=False
    )
    w.counter("tokens").labels(engine=1).inc(1)
    assert w.flush()
    raw = fake_client()
    assert raw.hget(Keys(namespace).meta, "shards") == "3"
    raw.flushall()  # a Redis restarted without persistence
    assert w.flush() and w.flush()
    assert raw.hget(Keys(namespace).meta, "shards") == "3"
    snap = StatsReader(_cfg(namespace), sample_catalog(), client=fake_client()).snapshot()
    assert snap.engines[1].counter("tokens") == 1
    w.close()


def test_the_reader_merges_the_shards_catalogues_shard_0_first(fake_client, namespace):
    """A metric stored only in shard 1's catalogue is read from there; one stored differently in
    shards 0 and 1 is read with shard 0's definition (the first stored wins, shard 0 first)."""
    from redis_stats import Catalog
    from redis_stats.catalog import MetricSpec

    def cat(buckets: list[float]) -> Catalog:
        c = Catalog()
        c.counter("tokens", "Generated tokens.")
        c.histogram("lat", "Latency.", buckets=buckets)
        return c

    a = StatsWriter(_cfg(namespace, shards=K), cat([1.0]), engines=[0], client=fake_client(), start=False)
    b = StatsWriter(
        _cfg(namespace, shards=K), cat([1.0, 2.0]), engines=[1], client=fake_client(), start=False
    )
    extra = b.define(MetricSpec("only_in_shard_1", "counter", "Only in shard 1."))
    a.histogram("lat").labels(engine=0).observe(0.5)
    b.histogram("lat").labels(engine=1).observe(1.5)
    extra.labels(engine=1).inc(4)
    assert a.flush() and b.flush()
    snap = StatsReader(_cfg(namespace), Catalog(), client=fake_client()).snapshot()
    assert snap.catalog["lat"].buckets == (1.0,)  # shard 0's definition
    assert snap.engines[1].counter("only_in_shard_1") == 4  # found in shard 1's catalogue
    assert snap.engines[0].histogram("lat").count == 1
    a.close()
    b.close()
