"""A lease takeover prints its first report once: the new holder reports at once, and its next
regular tick, due less than half an interval later, does not report the same interval again."""

import logging
import time

from redis_stats import StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.logline import VllmLogLines
from redis_stats.keys import Keys
from redis_stats.leader import LeaseLeader
from redis_stats.reporting import StatsReporter
from tests.vllm_shapes import iteration, scheduler


def test_a_takeover_prints_its_first_report_once(config, fake_client, caplog):
    cat = vllm_catalog()
    writer = StatsWriter(config, cat, engines=[0, 1], client=fake_client(), start=False)
    recorder = VllmRecorder(writer, "m", [0, 1])

    def load() -> None:  # traffic every interval, so every report is at INFO
        recorder.record(scheduler(running=2), iteration(prompt=10, generation=5), engine_idx=0)
        assert writer.flush()

    keys = Keys(config.namespace)
    old = LeaseLeader(fake_client(), keys, "old", ttl=30, start=False)
    new = LeaseLeader(fake_client(), keys, "new", ttl=30, start=False)
    assert old.renew() and not new.renew()
    reader = StatsReader(config, cat, client=fake_client())
    reporter = StatsReporter(reader, new, lines=VllmLogLines(), interval=1.0)

    def reports() -> int:
        return sum("Engines Aggregated" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="redis_stats.reporter"):
        load()
        assert reporter.tick() == []  # a regular tick, as a follower: nothing printed
        time.sleep(0.7)
        old.close()  # the old holder hands over; the new one takes the lease and reports at once
        load()
        assert new.renew()
        assert reports() == 1
        time.sleep(0.3)  # the regular tick, one interval after the last one
        load()
        reporter.tick()
        assert reports() == 1, [r.getMessage() for r in caplog.records]
        time.sleep(1.0)  # the next one reports again, over the interval since the takeover's
        load()
        lines = reporter.tick()
        assert reports() == 2 and any("Engines Aggregated" in line for line in lines)
    writer._closed = True


async def test_an_asyncio_takeover_prints_its_first_report_once(config, fake_server, caplog):
    import asyncio

    import fakeredis

    from redis_stats.aio import AsyncLeaseLeader, AsyncStatsReader, AsyncStatsReporter, AsyncStatsWriter

    def client():
        return fakeredis.FakeAsyncRedis(server=fake_server, decode_responses=True, encoding_errors="replace")

    cat = vllm_catalog()
    writer = AsyncStatsWriter(config, cat, engines=[0, 1], client=client())
    recorder = VllmRecorder(writer, "m", [0, 1])

    async def load() -> None:
        recorder.record(scheduler(running=2), iteration(prompt=10, generation=5), engine_idx=0)
        assert await writer.flush()

    keys = Keys(config.namespace)
    old = AsyncLeaseLeader(client(), keys, "old", ttl=30)
    new = AsyncLeaseLeader(client(), keys, "new", ttl=30)
    assert await old.renew() and not await new.renew()
    reporter = AsyncStatsReporter(
        AsyncStatsReader(config, cat, client=client()), new, lines=VllmLogLines(), interval=1.0
    )

    def reports() -> int:
        return sum("Engines Aggregated" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="redis_stats.reporter"):
        await load()
        assert await reporter.tick() == []
        await asyncio.sleep(0.7)
        await old.aclose()
        await load()
        assert await new.renew()
        await asyncio.sleep(0.2)  # the takeover's tick, scheduled on the loop
        assert reports() == 1
        await asyncio.sleep(0.1)
        await load()
        await reporter.tick()  # the regular tick, one interval after the last one
        assert reports() == 1, [r.getMessage() for r in caplog.records]
        await asyncio.sleep(1.0)
        await load()
        await reporter.tick()
        assert reports() == 2
    await new.aclose()
    await writer.close()
