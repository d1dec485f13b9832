"""gc run by a user made with the documented stats-admin ACL rules (docs/acl.md): what it
needs to fold a departed writer of a live engine and to share heartbeats between shards. Each test
failed before its fix."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from redis_stats import StatsReader, StatsWriter
from redis_stats.keys import Keys
from tests.conftest import sample_catalog
from tests.store.test_shards import K, _cfg


@pytest.fixture
def admin_config(redis_server: Any, namespace: str) -> Iterator[Callable[..., Any]]:
    """Makes the config of a user made with the documented stats-admin rules (docs/acl.md);
    the user is deleted after the test."""
    import redis

    from tests import acl

    root = redis.Redis.from_url(redis_server.url, decode_responses=True)
    user = f"a-{namespace}"

    def make(**kw: Any) -> Any:
        root.execute_command("ACL", "SETUSER", user, *acl.rules(namespace, "ap", acl.ADMIN))
        host = redis_server.url.split("//", 1)[1].split("/", 1)[0]
        return _cfg(namespace, f"redis://{user}:ap@{host}/0", **kw)

    yield make
    root.execute_command("ACL", "DELUSER", user)


@pytest.mark.parametrize("shards", [1, K])
def test_gc_as_the_documented_admin_folds_a_departed_writer_of_a_live_engine(
    redis_server, namespace, shards, admin_config
):
    """The documented stats-admin rules lacked what gc runs once a departed writer shares an
    engine with a live one (TYPE, and HINCRBY/HINCRBYFLOAT to fold its totals), and, with
    shards, the ZADD that keeps an engine live in its old shard after K changed: gc failed
    with NOPERM (and with TYPE granted alone, gc.lua's failed HINCRBYs would drop the departed
    writer's totals)."""
    from redis_stats.ops.retention import collect_garbage

    url = redis_server.url
    old = StatsWriter(_cfg(namespace, url), sample_catalog(), engines=[4], start=False)
    old.counter("tokens").labels(engine=4).inc(5)
    assert old.close()
    new = StatsWriter(_cfg(namespace, url, shards=shards), sample_catalog(), engines=[4], start=False)
    new.counter("tokens").labels(engine=4).inc(7)
    assert new.flush()
    admin = admin_config(retention=0.5, stale_after=0.25, flush_interval=0.05, shards=shards)
    time.sleep(0.6)
    assert new.flush()  # engine 4 heartbeated within the retention
    result = collect_garbage(admin)
    assert (result.failed, result.writers, result.engines, result.unfolded) == ({}, [old.writer_id], [], 0)
    snap = StatsReader(_cfg(namespace, url, shards=shards), sample_catalog()).snapshot()
    assert snap.engines[4].counter("tokens") == 12
    assert new.close()


def test_gc_that_cannot_share_heartbeats_leaves_that_shard_alone(redis_server, namespace, admin_config):
    """An admin user without ZADD (made with an earlier version's rules): gc cannot give an
    engine's old shard its newest heartbeat. That failure was swallowed and gc went on to
    delete the live engine's K=1-era hash there (12 -> 7); it must skip that shard and say so."""
    import redis

    from redis_stats.ops.retention import collect_garbage
    from tests import acl

    url = redis_server.url
    old = StatsWriter(_cfg(namespace, url), sample_catalog(), engines=[4], start=False)
    old.counter("tokens").labels(engine=4).inc(5)
    assert old.close()
    new = StatsWriter(_cfg(namespace, url, shards=K), sample_catalog(), engines=[4], start=False)
    new.counter("tokens").labels(engine=4).inc(7)
    assert new.flush()
    admin = admin_config(retention=0.5, stale_after=0.25, flush_interval=0.05, shards=K)
    root = redis.Redis.from_url(url, decode_responses=True)
    root.execute_command("ACL", "SETUSER", f"a-{namespace}", "-zadd")
    assert "+zadd" in acl.ADMIN  # the documented rules have it; this user does not
    time.sleep(0.6)
    assert new.flush()
    result = collect_garbage(admin)
    assert Keys(namespace).prefix in result.failed and "zadd" in result.failed[Keys(namespace).prefix].lower()
    snap = StatsReader(_cfg(namespace, url, shards=K), sample_catalog()).snapshot()
    assert snap.engines[4].counter("tokens") == 12
    assert new.close()
