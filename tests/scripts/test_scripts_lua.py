"""The Lua scripts against a real server: flush.lua touches only the keys it is given (Redis
Cluster requires every key declared), and the helpers of common.lua agree with Python."""

from __future__ import annotations

import re

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.exceptions import ResponseError

from redis_stats import StatsConfig, StatsWriter
from redis_stats._scripts import Script, load_script
from redis_stats.keys import Keys
from tests import chunked
from tests.acl import WRITER


def _exactly(key: str) -> str:
    """An ACL key pattern that matches *key* and nothing else."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", key)


def _writer(redis_server, namespace, catalog, client) -> StatsWriter:
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    w = StatsWriter(config, catalog, engines=[0, 3], client=client, start=False, owner="node:1")
    w.counter("tokens").labels(engine=0).inc(5)
    w.counter("tokens").labels(engine=3).inc(2)
    w.gauge("inflight").labels(engine=3).set(1)
    return w


def test_flush_lua_touches_only_the_keys_it_declares(redis_server, namespace, catalog):
    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    w = _writer(redis_server, namespace, catalog, admin)
    [(_shard, keys, args)] = w.prepare_flushes()
    ns = Keys(namespace)
    assert ns.writer_stats(w.writer_id) in keys and {ns.counters(0), ns.counters(3)} <= set(keys)
    # A user that may touch these keys and no other: Redis checks every command a script runs
    # against the caller's ACL, so a key the script built itself (undeclared) is refused.
    user = f"declared-{namespace}"
    patterns = [_exactly(k) for k in keys]
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=patterns, commands=WRITER.split())
    limited = redis.Redis.from_url(redis_server.url, username=user, password="pw", decode_responses=True)
    try:
        try:
            reply = Script(limited, load_script("flush"))(keys, args)
        except ResponseError as exc:  # NOPERM, or "can't access at least one of the keys"
            pytest.fail(f"flush.lua touched a key it was not given: {exc}")
        assert reply[0] == 1
        assert admin.exists(ns.writer_stats(w.writer_id), ns.counters(0), ns.counters(3)) == 3
    finally:
        limited.close()
        admin.acl_deluser(user)
        admin.close()


def test_flush_lua_refuses_keys_that_do_not_match_its_engine_blocks(redis_server, namespace, catalog):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    w = _writer(redis_server, namespace, catalog, client)
    [(_shard, keys, args)] = w.prepare_flushes()
    with pytest.raises(ResponseError, match="nothing written: 9 keys for 2 engine blocks"):
        Script(client, load_script("flush"))(keys[:-1], args)
    assert not client.exists(Keys(namespace).seq)
    client.close()


# Components as label values and writer ids come: mostly plain, or with what the encoding escapes.
_SPECIAL = st.sampled_from(["a", "é", "|", "\\", "\n", "/", "n", " ", "@", "😀"])
_TEXT = st.text(_SPECIAL, max_size=12) | st.text(max_size=12)
_ESCAPE_ALL = "\nlocal out = {}\nfor k, a in ipairs(ARGV) do out[k] = escape(a) end\nreturn out"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(components=st.lists(_TEXT, min_size=1, max_size=8))
def test_common_lua_escapes_a_field_component_as_the_key_schema_says(redis_server, components):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    escaped = client.eval(load_script("common") + _ESCAPE_ALL, 0, *components)
    assert "|".join(escaped) == chunked.encode(components)
    assert chunked.decode("|".join(escaped)) == components
    client.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    items=st.lists(
        st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=6),
        max_size=6,
    )
)
def test_common_lua_splits_a_chunk_into_lines_as_python_writes_them(redis_server, items):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    text = "\n".join(items)
    got = client.eval(load_script("common") + "\nreturn lines(ARGV[1])", 0, text)
    assert got == ([] if text == "" else text.split("\n"))
    client.close()
