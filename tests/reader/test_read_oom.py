"""Over maxmemory with noeviction, Redis 7.0 refuses to queue any command inside MULTI: the view
must stay up (that is when operators need the writers' error counters), and each read must still
be one consistent snapshot."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsReader
from redis_stats.keys import Keys
from redis_stats.server import Exporter
from tests.conftest import sample_catalog
from tests.servers import refuses_multi_over_maxmemory


def test_reads_work_over_maxmemory_and_stay_one_snapshot(own_redis_server, namespace):
    cfg = StatsConfig(url=own_redis_server.url, namespace=namespace, stale_after=120)
    catalog = sample_catalog()
    writer = StatsWriter(cfg, catalog, engines=[0, 1], start=False)
    for e in (0, 1):
        writer.counter("tokens").labels(engine=e).inc(10 + e)
        writer.gauge("running").labels(engine=e).set(e)
        for v in (0.05, 0.3, 7):
            writer.histogram("latency_seconds").labels(engine=e).observe(v)
    assert writer.flush()
    admin = redis.Redis.from_url(own_redis_server.url, decode_responses=True)
    reader = StatsReader(cfg, catalog)
    reader.snapshot()  # planned and warm, as a running exporter is
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        # Redis 7.0 refuses MULTI over maxmemory, Valkey 9 queues it (docs/redis-servers.md).
        scripted = refuses_multi_over_maxmemory(own_redis_server.url, Keys(namespace).counters(0))
        writer.counter("tokens").labels(engine=0).inc(1)
        assert not writer.flush()  # the writers are refused: the server is out of memory
        stats = admin.info("commandstats")
        scripts_before = stats.get("cmdstat_evalsha_ro", {}).get("calls", 0)
        execs_before = stats.get("cmdstat_exec", {}).get("calls", 0)

        exporter = Exporter(reader, port=0).start()
        try:
            with urllib.request.urlopen(exporter.url + "/metrics", timeout=10) as resp:
                body = resp.read().decode()
            with urllib.request.urlopen(exporter.url + "/snapshot", timeout=10) as resp:
                assert resp.status == 200
        finally:
            exporter.close()
        found = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body)
            for s in f.samples
        }
        assert found[("redis_stats_up", ())] == 1.0
        for e in ("0", "1"):
            assert found[("tokens_total", (("engine", e),))] == 10 + int(e)
            assert found[("running", (("engine", e),))] == int(e)
            assert found[("latency_seconds_count", (("engine", e),))] == 3
            assert found[("latency_seconds_bucket", (("engine", e), ("le", "+Inf")))] == 3
        # each read was one atomic command, not separate reads: a read-only script where the
        # server refuses the transaction, else the transaction
        stats = admin.info("commandstats")
        if scripted:
            assert stats["cmdstat_evalsha_ro"]["calls"] - scripts_before >= 2
        else:
            assert stats["cmdstat_exec"]["calls"] - execs_before >= 2
        # and the refused transaction's replies were read: no new connection per scrape
        connections = admin.info("stats")["total_connections_received"]
        for _ in range(3):
            reader.snapshot()
        assert admin.info("stats")["total_connections_received"] == connections

        async def read_async() -> dict:
            reader = AsyncStatsReader(cfg, catalog)
            try:
                snap = await reader.snapshot()
            finally:
                await reader.close()
            return {e: s.counter("tokens") for e, s in snap.engines.items()}

        assert asyncio.run(read_async()) == {0: 10.0, 1: 11.0}
    finally:
        admin.config_set("maxmemory", 0)
    assert writer.flush()
    writer.close()
    reader.close()


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "asyncio"])
def test_a_sharded_namespace_is_read_over_maxmemory_too(own_redis_server, namespace, use_async):
    # With shards on one server the read is one MULTI over every shard: over maxmemory it was
    # refused and the whole read failed (redis_stats_up 0); now each shard's read-only script.
    cfg = StatsConfig(url=own_redis_server.url, namespace=namespace, stale_after=120, shards=3)
    catalog = sample_catalog()
    writer = StatsWriter(cfg, catalog, engines=[0, 1, 2], start=False)
    for e in (0, 1, 2):
        writer.counter("tokens").labels(engine=e).inc(10 + e)
        writer.histogram("latency_seconds").labels(engine=e).observe(0.3)
    assert writer.flush()
    admin = redis.Redis.from_url(own_redis_server.url, decode_responses=True)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        if use_async:

            async def read() -> dict:
                reader = AsyncStatsReader(cfg, catalog)
                try:
                    await reader.snapshot()  # planned, as a running exporter is
                    snap = await reader.snapshot()
                finally:
                    await reader.close()
                return {e: s.counter("tokens") for e, s in snap.engines.items()}

            totals = asyncio.run(read())
        else:
            reader = StatsReader(cfg, catalog)
            reader.snapshot()
            snap = reader.snapshot()
            reader.close()
            totals = {e: s.counter("tokens") for e, s in snap.engines.items()}
        assert totals == {0: 10, 1: 11, 2: 12}
    finally:
        admin.config_set("maxmemory", 0)
        writer.close()
        admin.close()
