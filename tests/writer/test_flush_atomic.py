"""A flush is all or nothing (issue 12.1), on real servers (Redis and Valkey).

Redis does not roll a script back: flush.lua checks every key it will write and every argument
before its first write, and refuses the batch with an error naming the key. Each test below plants
what used to make a flush fail half-way, then checks that the refused flush left the namespace
exactly as it was, and that once the cause is removed the retry stores the exact totals.
"""

from __future__ import annotations

import logging

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats._scripts import load_script
from redis_stats.catalog import MetricSpec
from redis_stats.config import ConfigError
from redis_stats.keys import Keys
from tests.conftest import sample_catalog

pytestmark = pytest.mark.redis_server

WRITER_LOG = "redis_stats.writer"


def dump(client: redis.Redis, namespace: str) -> dict[str, object]:
    """Every key of the namespace with its type and whole content (what a failed flush must not change)."""
    out: dict[str, object] = {}
    for key in sorted(client.scan_iter(match=f"rs:{{{namespace}}}:*")):
        kind = client.type(key)
        if kind == "hash":
            value: object = client.hgetall(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "string":
            value = client.get(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(client.smembers(key))
        else:
            value = None
        out[key] = (kind, value)
    return out


@pytest.fixture
def cfg(core_server, namespace) -> StatsConfig:
    return StatsConfig(url=core_server.url, namespace=namespace, flush_interval=0.05)


@pytest.fixture
def client(core_server):
    c = redis.Redis.from_url(core_server.url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def writers():
    made: list[StatsWriter] = []
    yield made
    for w in made:
        w._closed = True
        w._client.close()


def _writer(cfg: StatsConfig, made: list[StatsWriter], **kw) -> StatsWriter:
    w = StatsWriter(cfg, sample_catalog(), engines=[0], start=False, **kw)
    made.append(w)
    return w


# Where garbage is planted: the key, and what the failing batch must carry to touch it.
TARGETS = {
    "writer stats hash": lambda k, w: k.writer_stats(w.writer_id),
    # schema 2: the engine's one hash holds its counters, histograms and gauges (the writer's chunks)
    "engine counters hash": lambda k, w: k.counters(0),
    "engines zset": lambda k, w: k.engines,
    "writers zset": lambda k, w: k.writers,
    "sequence hash": lambda k, w: k.seq,
    "catalogue hash": lambda k, w: k.meta,
    "claims hash": lambda k, w: k.claims,
    "conflicts hash": lambda k, w: k.conflicts,
}


def _record(w: StatsWriter, n: int, gauge: float) -> None:
    tokens = w.counter("tokens").labels(engine=0)
    hist = w.histogram("latency_seconds").labels(engine=0)
    for _ in range(n):
        tokens.inc()
        hist.observe(0.3)
    w.gauge("running").labels(engine=0).set(gauge)


def _check_totals(cfg: StatsConfig, tokens: float, late: float) -> None:
    reader = StatsReader(cfg, sample_catalog())
    try:
        snap = reader.snapshot()
    finally:
        reader.close()
    engine = snap.engines[0]
    assert engine.counter("tokens") == tokens
    assert engine.histogram("latency_seconds").count == tokens
    assert engine.counter("late") == late
    assert engine.gauge("running") == 7.0


@pytest.mark.parametrize("target", list(TARGETS))
def test_wrong_type_key_refuses_whole_flush_then_retry_is_exact(cfg, client, writers, target, caplog):
    w = _writer(cfg, writers, owner="inst-a")
    w.stats_interval = w.claim_interval = 0  # every flush stores self-metrics and claims
    _record(w, 100, 1.0)
    assert w.flush()
    key = TARGETS[target](Keys(cfg.namespace), w)
    # The failing batch carries every part: counters, a histogram, a gauge, a new spec, claims,
    # self-metrics.
    _record(w, 50, 7.0)
    if target == "conflicts hash":
        # The conflicts hash is written (and so checked) when a flush finds another live owner.
        assert _writer(cfg, writers, owner="inst-b").flush()
    w.define(MetricSpec("late", "counter", "Defined after start.")).labels(engine=0).inc(3)
    saved = client.dump(key)
    client.delete(key)
    client.set(key, "garbage")
    before = dump(client, cfg.namespace)
    with caplog.at_level(logging.WARNING, logger=WRITER_LOG):
        assert not w.flush()
    assert dump(client, cfg.namespace) == before  # nothing of the batch was written
    assert w.stats.errors == {"response": 1}
    message = " ".join(r.getMessage() for r in caplog.records)
    assert f"key {key}" in message and "delete or rename it" in message and "nothing written" in message
    client.delete(key)
    if saved is not None:
        client.restore(key, 0, saved)
    assert w.flush()
    assert w.stats.duplicates == 0
    _check_totals(cfg, tokens=150, late=3)


def test_non_numeric_catalogue_version_refuses_flush_then_retry_is_exact(cfg, client, writers, caplog):
    w = _writer(cfg, writers)
    _record(w, 100, 1.0)
    assert w.flush()
    meta = Keys(cfg.namespace).meta
    _record(w, 50, 7.0)
    w.define(MetricSpec("late", "counter", "Defined after start.")).labels(engine=0).inc(3)
    client.hset(meta, "_v", "abc")
    before = dump(client, cfg.namespace)
    with caplog.at_level(logging.WARNING, logger=WRITER_LOG):
        assert not w.flush()
    assert dump(client, cfg.namespace) == before
    assert "_v" in caplog.text and "HDEL" in caplog.text
    client.hdel(meta, "_v")
    assert w.flush()
    assert w.stats.duplicates == 0
    _check_totals(cfg, tokens=150, late=3)


def test_owner_with_separator_is_refused_at_construction(cfg, writers):
    with pytest.raises(ConfigError, match=r"owner='inst\|1' contains '\|'"):
        _writer(cfg, writers, owner="inst|1")
    with pytest.raises(ConfigError, match="cannot be encoded as UTF-8"):
        _writer(cfg, writers, owner="inst\ud800")
    with pytest.raises(ConfigError, match="role"):
        _writer(cfg, writers, role="api\udfff")


def test_claims_left_by_older_writers_with_separator_in_owner_do_not_break_flushes(cfg, client, writers):
    # A version before this one accepted owner="inst|1" and stored "inst|1|<ms>".
    keys = Keys(cfg.namespace)
    now_ms = int(client.time()[0]) * 1000
    client.hset(keys.claims, "0", f"inst|1|{now_ms}")
    client.hset(keys.claims, "1", "no separator at all")
    w = StatsWriter(cfg, sample_catalog(), engines=[0, 1], owner="inst-2", start=False)
    writers.append(w)
    tokens = w.counter("tokens").labels(engine=0)
    for _ in range(10):
        for _ in range(100):
            tokens.inc()
        assert w.flush()
    assert w.stats.duplicates == 0 and not w.stats.errors
    assert client.hget(keys.conflicts, "0").startswith("inst|1|inst-2|")  # the live older owner
    reader = StatsReader(cfg, sample_catalog())
    try:
        assert reader.snapshot().total("tokens") == 1000
    finally:
        reader.close()


def _script(client: redis.Redis):
    return client.register_script(load_script("flush"))


def test_malformed_arguments_are_refused_before_any_write(cfg, client, writers):
    w = _writer(cfg, writers)
    _record(w, 5, 1.0)
    [(_shard, keys, args)] = w.prepare_flushes()
    script = _script(client)
    for bad in (args[:-1], [*args[:8], "x", *args[9:]], [*args, "extra"], [*args[:2], "-1", *args[3:]]):
        with pytest.raises(redis.ResponseError, match="redis_stats flush refused, nothing written"):
            script(keys=keys, args=bad)
        assert dump(client, cfg.namespace) == {}
    assert w.flush()


# Garbage an operator (or another program) can leave in the namespace: a wrong-typed key, or a
# hash holding text where a number is expected.
_GARBAGE = st.sampled_from(["string", "list", "set", "zset", "hash"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(planted=st.dictionaries(st.sampled_from(sorted(TARGETS)), _GARBAGE, min_size=1, max_size=4))
def test_any_garbage_either_flush_applies_or_nothing_is_written(cfg, client, planted):
    ns_keys = Keys(cfg.namespace)
    for key in client.scan_iter(match=f"rs:{{{cfg.namespace}}}:*"):
        client.delete(key)
    w = StatsWriter(cfg, sample_catalog(), engines=[0], owner="inst-a", start=False)
    try:
        for target, kind in planted.items():
            key = TARGETS[target](ns_keys, w)
            client.delete(key)
            if kind == "string":
                client.set(key, "x")
            elif kind == "list":
                client.rpush(key, "x")
            elif kind == "set":
                client.sadd(key, "x")
            elif kind == "zset":
                client.zadd(key, {"0": 1, w.writer_id: 2})
            else:  # a hash, with text where the script expects numbers
                client.hset(
                    key,
                    mapping={
                        "0": "garbage",
                        w.writer_id: "x|y",
                        "_v": "abc",
                        "tokens": "abc",
                        "m:tokens": "{not json",
                        "latency_seconds|h:" + "0" * 8: "1 2",
                    },
                )
        _record(w, 3, 7.0)
        w.define(MetricSpec("late", "counter", "Defined after start.")).labels(engine=0).inc(3)
        before = dump(client, cfg.namespace)
        try:
            [(_shard, keys, args)] = w.prepare_flushes()
            _script(client)(keys=keys, args=args)
        except redis.ResponseError as exc:
            # Refused by the checks, never failed half-way.
            assert "redis_stats flush refused, nothing written" in str(exc)
            assert dump(client, cfg.namespace) == before
    finally:
        w._closed = True
        w._client.close()


def test_out_of_memory_refuses_the_whole_flush_then_retry_is_exact(own_redis_server, namespace):
    cfg = StatsConfig(url=own_redis_server.url, namespace=namespace, flush_interval=0.05)
    client = redis.Redis.from_url(own_redis_server.url, decode_responses=True)
    w = StatsWriter(cfg, sample_catalog(), engines=[0], owner="inst-a", start=False)
    try:
        _record(w, 100, 1.0)
        assert w.flush()
        _record(w, 50, 7.0)
        w.define(MetricSpec("late", "counter", "Defined after start.")).labels(engine=0).inc(3)
        before = dump(client, namespace)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")  # every write is now over the limit
        assert not w.flush()
        client.config_set("maxmemory", "0")
        assert dump(client, namespace) == before
        assert w.flush()
        _check_totals(cfg, tokens=150, late=3)
    finally:
        w._closed = True
        w._client.close()
        client.close()
