"""A flush interrupted by something other than a Redis problem (KeyboardInterrupt in a thread's
flush, CancelledError in a task's): the interruption reaches the caller, is not counted as a
flush error, and the same batch goes once more at the next flush (the step drivers throw only
``Exception`` into the flush round)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import fakeredis
import pytest

from redis_stats import StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsReader, AsyncStatsWriter


def test_a_keyboard_interrupt_in_a_flush_propagates_and_the_batch_goes_again(config, catalog, fake_client):
    w = StatsWriter(config, catalog, engines=[0], client=fake_client(), start=False)
    real = w._script
    sent: list[list[str]] = []

    class Interrupted:
        sha, source = real.sha, real.source

        def __call__(self, keys: list[str], args: list[str]) -> Any:
            sent.append(list(args))
            if len(sent) == 1:
                raise KeyboardInterrupt
            return real(keys=keys, args=args)

    w._script = Interrupted()
    w.counter("tokens").labels(engine=0).inc(5)
    with pytest.raises(KeyboardInterrupt):
        w.flush()
    gc.collect()  # the abandoned round is closed: it must not count or confirm anything
    assert sum(w.stats.errors.values()) == 0
    w.counter("tokens").labels(engine=0).inc(1)
    assert w.flush() and w.flush()
    assert sent[1][-4:] == sent[0][-4:]  # the same batch (its data: the self-metrics may differ)
    assert len(sent) == 3 and sent[2][-4:] != sent[0][-4:]
    assert StatsReader(config, catalog, client=fake_client()).snapshot().engines[0].counter("tokens") == 6
    w.close()


async def test_a_cancelled_flush_propagates_and_the_batch_goes_again_once(config, catalog, fake_server):
    def client() -> fakeredis.FakeAsyncRedis:
        return fakeredis.FakeAsyncRedis(server=fake_server, decode_responses=True)

    w = AsyncStatsWriter(config, catalog, engines=[0], client=client())
    real = w._script
    sent: list[list[str]] = []

    class Hangs:
        sha, source = real.sha, real.source

        async def __call__(self, keys: list[str], args: list[str]) -> Any:
            sent.append(list(args))
            reply = await real(keys, args)  # applied; its answer never arrives (cancelled)
            if len(sent) == 1:
                await asyncio.sleep(30)
            return reply

    w._script = Hangs()
    w.counter("tokens").labels(engine=0).inc(5)
    task = asyncio.ensure_future(w.flush())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gc.collect()
    assert sum(w.stats.errors.values()) == 0
    w.counter("tokens").labels(engine=0).inc(1)
    assert await w.flush() and await w.flush()
    assert sent[1][-4:] == sent[0][-4:]
    assert w.stats.duplicates == 1  # sent again once: Redis had applied it, says so, not added twice
    snap = await AsyncStatsReader(config, catalog, client=client()).snapshot()
    assert snap.engines[0].counter("tokens") == 6
    await w.close()
