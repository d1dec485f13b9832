"""A sharded writer lists its K in shard 0's catalogue (``shards.lua``) until that succeeds once.
Its failure was counted in flush_errors_total like a flush attempt: each round added one more
error though every flush went through. It is logged and counted in a self-metric of its own
(redis_stats_writer_shards_listing_errors_total) instead, and tried again next round."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import fakeredis.aioredis

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsWriter
from tests.conftest import sample_catalog


def _refused(*args: Any) -> Any:
    raise ConnectionError("shard 0 unreachable for this call")


async def _refused_async(*args: Any) -> Any:
    raise ConnectionError("shard 0 unreachable for this call")


def test_a_failing_shards_listing_is_not_a_flush_error(namespace, fake_client, caplog):
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace, shards=3)
    w = StatsWriter(cfg, sample_catalog(), engines=[0, 1, 2], client=fake_client(), start=False)
    real = w._shards_script
    w._shards_script = _refused  # type: ignore[assignment]
    with caplog.at_level(logging.DEBUG, logger="redis_stats"):
        for n in range(3):
            w.counter("tokens").labels(engine=n).inc(1)
            assert w.flush()  # every shard's flush went through
    assert dict(w.stats.errors) == {} and w.stats.flushes > 0
    assert dict(w.stats.shards_errors) == {"connection": 3} and not w.shards_noted
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "K=3" in r.getMessage()]
    assert len(warnings) == 1  # once per kind
    w._shards_script = real
    assert w.flush() and w.shards_noted
    # ... and it shows in Prometheus, as the writer's self-metric (it was only logged, in the
    # writer's process: a listing that kept failing went unseen where metrics are watched).
    reader = StatsReader(cfg, sample_catalog(), client=fake_client())
    assert reader.snapshot().writers[w.writer_id].stats["shards_err:connection"] == "3"
    text = RedisCollector(reader).render_text()
    line = f'redis_stats_writer_shards_listing_errors_total{{writer="{w.writer_id}",kind="connection"}} 3.0'
    assert line in text, [x for x in text.splitlines() if "listing" in x]
    w._closed = True


def test_a_failing_shards_listing_is_not_a_flush_error_asyncio(namespace):
    async def main() -> AsyncStatsWriter:
        cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace, shards=3)
        client = fakeredis.aioredis.FakeRedis(decode_responses=True)
        w = AsyncStatsWriter(cfg, sample_catalog(), engines=[0, 1, 2], client=client)
        w._shards_script = _refused_async  # type: ignore[assignment]
        for n in range(3):
            w.counter("tokens").labels(engine=n).inc(1)
            assert await w.flush()
        w._closed = True
        return w

    w = asyncio.run(main())
    assert dict(w.stats.errors) == {} and dict(w.stats.shards_errors) == {"connection": 3}
