"""The usage ledger when Redis goes back in time, as docs/usage.md ("Exactly once, and what a kill
loses") says: a Redis restarted from an older snapshot (or a lagging replica promoted) has lost
the batches it lacks; the next batch of each writer is still applied, counted ``behind`` in the
recorder's stats, and the lost ones are not sent again (the writer keeps sums only until they are
confirmed). The stats, by contrast, are stored whole again by their writers
(tests/store/test_time_travel.py).

The nemesis run (issue 48) measures that loss in every run with a time travel, a failover or an
``allkeys`` eviction, and checks it is the only one: the ledger is checked as a store of
increments that Redis going back may take from, never more (docs/reliability.md).
"""

from __future__ import annotations

import pytest
import redis

from redis_stats import StatsConfig, StatsWriter
from redis_stats.usage import Usage, UsageReader, UsageRecorder
from tests.store.test_time_travel import _restore, _save

pytestmark = pytest.mark.redis_server


def test_after_redis_went_back_the_next_batch_is_applied_and_only_the_lost_one_is_missing(
    redis_server, namespace
):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.05)
    writer = StatsWriter(cfg, start=False)
    recorder = UsageRecorder(writer)
    raw = redis.Redis.from_url(redis_server.url)

    def use(tokens: int) -> None:
        usage = Usage(tenant="acme", adapter=None, model="m", prompt_tokens=tokens, generation_tokens=1)
        recorder.record(usage)
        for _ in range(5):  # the ledger's batch goes after the writer's own (its first flush)
            if writer.flush() and not writer.pending():
                return  # confirmed by Redis
        raise AssertionError("Redis never confirmed the usage")

    use(100)
    older = _save(raw, namespace)  # an RDB taken now
    use(10)
    _restore(raw, namespace, older)  # Redis restarted from it: the second batch is gone
    use(1)  # the writer, alive all along, flushes again
    total = UsageReader(cfg).tenant("acme").total
    writer.close()
    # the third request counted, the second lost for good (not sent again, never doubled)
    assert (total.get("requests"), total.get("prompt_tokens")) == (2, 101)
    assert recorder.stats["behind"] == 1
