"""Removing a namespace (`redis-stats drop-namespace`, redis_stats.ops.removal): every key of every
shard goes, a dry run removes nothing, and a live writer anywhere refuses it all — on a real
server, as the documented stats-admin ACL user (no SCAN), and on a real Cluster."""

from __future__ import annotations

import time

import pytest
import redis
from click.testing import CliRunner

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.ops.removal import remove_namespace
from redis_stats.tools.cli import main
from tests.conftest import sample_catalog
from tests.ops.test_gc_acl import admin_config  # noqa: F401 (a fixture)
from tests.servers import Cluster
from tests.store.test_shards import K, _cfg
from tests.vllm_shapes import iteration, scheduler


def keys_of(client: redis.Redis, namespace: str) -> set[str]:
    """Every key of the namespace, of every shard (tags "NS" and "NS#<s>.<salt>")."""
    found = set(client.scan_iter(match=f"rs:{{{namespace}}}:*"))
    return found | set(client.scan_iter(match=f"rs:{{{namespace}#*}}:*"))


def fill(url: str, namespace: str, shards: int = 1) -> list[StatsWriter]:
    """Two writers over four engines (with K shards), both closed: nothing live."""
    writers = []
    for engines in ([0, 1], [2, 3]):
        w = StatsWriter(_cfg(namespace, url, shards=shards), sample_catalog(), engines=engines, start=False)
        for e in engines:
            w.counter("tokens").labels(engine=e).inc(5)
            w.gauge("running").labels(engine=e).set(2)
        assert w.flush() and w.close()
        writers.append(w)
    return writers


@pytest.mark.parametrize("shards", [1, K])
def test_a_dry_run_counts_and_the_removal_removes_every_key_of_every_shard(redis_server, namespace, shards):
    root = redis.Redis.from_url(redis_server.url, decode_responses=True)
    fill(redis_server.url, namespace, shards)
    before = keys_of(root, namespace)
    assert len(before) > 8
    cfg = _cfg(namespace, redis_server.url)  # K is found in shard 0's catalogue, as gc finds it
    plan = remove_namespace(cfg, dry_run=True)
    assert (plan.keys, plan.shards, plan.live_writers, plan.failed) == (len(before), shards, [], {})
    assert keys_of(root, namespace) == before  # a dry run removes nothing
    done = remove_namespace(cfg)
    assert (done.keys, done.live_writers, done.partial, done.failed) == (len(before), [], False, {})
    assert keys_of(root, namespace) == set()
    assert namespace not in CliRunner().invoke(main, ["namespaces", "--redis-url", redis_server.url]).output


@pytest.mark.parametrize("shards", [1, K])
def test_a_live_writer_in_any_shard_refuses_the_removal_and_nothing_goes(redis_server, namespace, shards):
    root = redis.Redis.from_url(redis_server.url, decode_responses=True)
    fill(redis_server.url, namespace, shards)
    # Live, and writing only to the last shard's engine (engine 2 is in shard 2 of K=3).
    live = StatsWriter(
        _cfg(namespace, redis_server.url, shards=shards), sample_catalog(), engines=[2], start=False
    )
    live.counter("tokens").labels(engine=2).inc(1)
    assert live.flush()
    before = keys_of(root, namespace)
    for dry_run in (True, False):
        result = remove_namespace(_cfg(namespace, redis_server.url), dry_run=dry_run)
        assert result.live_writers == [live.writer_id] and not result.partial
        assert keys_of(root, namespace) == before
    assert live.close()  # closed: not live any more, at once
    assert remove_namespace(_cfg(namespace, redis_server.url)).live_writers == []
    assert keys_of(root, namespace) == set()


def test_a_writer_stale_for_stale_after_no_longer_holds_the_namespace(redis_server, namespace):
    root = redis.Redis.from_url(redis_server.url, decode_responses=True)
    w = StatsWriter(
        _cfg(namespace, redis_server.url, stale_after=0.3), sample_catalog(), engines=[0], start=False
    )
    assert w.flush()
    w._closed = True  # killed: never closes
    cfg = _cfg(namespace, redis_server.url, stale_after=0.1)  # the writer's own 0.3 s decides
    assert remove_namespace(cfg, dry_run=True).live_writers == [w.writer_id]
    time.sleep(0.4)
    assert remove_namespace(cfg).live_writers == []
    assert keys_of(root, namespace) == set()


def test_the_documented_admin_user_removes_a_namespace_without_scan(redis_server, namespace, admin_config):  # noqa: F811
    root = redis.Redis.from_url(redis_server.url, decode_responses=True)
    fill(redis_server.url, namespace, K)
    done = remove_namespace(admin_config())
    assert (done.failed, done.live_writers, done.scanned) == ({}, [], False)
    assert keys_of(root, namespace) == set()


def test_the_command_asks_first_and_a_no_removes_nothing(redis_server, namespace):
    root = redis.Redis.from_url(redis_server.url, decode_responses=True)
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0], start=False)
    VllmRecorder(w, "m", [0]).record(scheduler(running=1), iteration(prompt=5), engine_idx=0)
    assert w.flush()
    env = {"REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    live = CliRunner().invoke(main, ["drop-namespace", "--yes"], env=env)
    assert live.exit_code == 4, live.output
    assert f"1 live writer; nothing was removed: {w.writer_id}" in live.output
    assert w.close()
    before = keys_of(root, namespace)
    dry = CliRunner().invoke(main, ["drop-namespace", "--dry-run"], env=env)
    assert dry.exit_code == 0 and f"{len(before)} keys, no live writer" in dry.output, dry.output
    assert "nothing removed" in dry.output and keys_of(root, namespace) == before
    no = CliRunner().invoke(main, ["drop-namespace"], env=env, input="n\n")
    assert no.exit_code == 1 and "Aborted" in no.output and keys_of(root, namespace) == before
    yes = CliRunner().invoke(main, ["drop-namespace"], env=env, input="y\n")
    assert yes.exit_code == 0, yes.output
    assert f"removed {len(before)} keys of namespace {namespace!r}" in yes.output
    assert keys_of(root, namespace) == set()
    # Gone: the command then says the namespace holds nothing (exit 3), like top and inspect.
    assert CliRunner().invoke(main, ["drop-namespace", "--yes"], env=env).exit_code == 3
    # The namespace is never the default by accident.
    unnamed = CliRunner().invoke(main, ["drop-namespace", "--redis-url", redis_server.url, "--yes"])
    assert unnamed.exit_code == 2 and "--namespace" in unnamed.output


@pytest.mark.slow
def test_a_namespace_split_over_a_cluster_is_removed_from_every_master(namespace):
    cluster = Cluster().start()
    try:
        fill(cluster.url, namespace, K)
        from redis_stats.connection import make_client

        client = make_client(StatsConfig(url=cluster.url, namespace=namespace))
        pattern = [f"rs:{{{namespace}}}:*", f"rs:{{{namespace}#*}}:*"]
        from redis.cluster import RedisCluster

        def everywhere() -> set:
            return {
                k for p in pattern for k in client.scan_iter(match=p, target_nodes=RedisCluster.PRIMARIES)
            }

        before = everywhere()
        assert len({client.get_node_from_key(k).port for k in before}) == K  # one shard per master
        done = remove_namespace(_cfg(namespace, cluster.url))
        assert (done.keys, done.failed, done.live_writers) == (len(before), {}, [])
        assert everywhere() == set()
    finally:
        cluster.close()


def test_a_writer_is_live_for_the_stale_after_it_stored_not_the_removers(redis_server, namespace):
    """Readers judge a writer by the stale_after it stored (stale_ms, _core/read/liveness.py): a
    remover configured shorter must not take a writer every reader calls live for gone."""
    root = redis.Redis.from_url(redis_server.url, decode_responses=True)
    w = StatsWriter(
        _cfg(namespace, redis_server.url, stale_after=30), sample_catalog(), engines=[0], start=False
    )
    assert w.flush()
    w._closed = True
    time.sleep(0.3)
    hasty = _cfg(namespace, redis_server.url, stale_after=0.1)
    assert remove_namespace(hasty).live_writers == [w.writer_id]
    assert keys_of(root, namespace)


def test_the_admin_user_without_scan_removes_a_dead_writers_load_entries_too(
    redis_server,
    namespace,
    admin_config,  # noqa: F811
):
    from redis_stats.load import LoadMap, LoadSource

    root = redis.Redis.from_url(redis_server.url, decode_responses=True)
    w = StatsWriter(
        _cfg(namespace, redis_server.url, stale_after=0.3),
        sample_catalog(),
        engines=[0],
        start=False,
        load=LoadMap(requests_running=LoadSource("running")),
    )
    w.gauge("running").labels(engine=0).set(3)
    assert w.flush()
    w._closed = True  # killed: never closes, its load entry stays
    assert root.hlen(w.keys.load) == 1
    time.sleep(0.4)
    done = remove_namespace(admin_config(stale_after=0.1))
    assert (done.failed, done.live_writers, done.scanned) == ({}, [], False)
    assert keys_of(root, namespace) == set()


def test_a_refusal_for_many_live_writers_summarises_them(redis_server, namespace):
    """Before: every writer id on one line (50 KB at 2,048 writers). Now how many, on how many
    hosts, the first five, and where the rest are listed."""
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    writers = [StatsWriter(cfg, sample_catalog(), engines=[e], start=False) for e in range(40)]
    for w in writers:
        w.counter("requests").labels(engine=w.engines[0], reason="stop").inc()
        assert w.flush()
    env = {"REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    live = CliRunner().invoke(main, ["drop-namespace", "--yes"], env=env)
    assert live.exit_code == 4, live.output
    first = sorted(w.writer_id for w in writers)[:5]
    assert f"40 live writers; nothing was removed: {', '.join(first)} and 35 more" in live.output
    assert "(redis-stats inspect lists them) on 1 host" in live.output
    assert len(live.output) < 600, len(live.output)
    for w in writers:
        w._closed = True  # the namespace is left to its test
