"""Gauge order survives a failover to a server whose clock differs (issue 32, item 8).

A ``mostrecent`` gauge's value is stamped with the time it was set in the server's clock (each
writer's monotonic clock anchored at every flush reply). After a failover to a server whose clock
is behind, a value stored with the old server's stamp looked newer than every value set since:
the writer's anchor followed the new server, its stored stamps did not. Now a writer whose
server's clock moved re-sends its gauges stamped in the new clock within two flushes.

The servers are real (a replica promoted with ``REPLICAOF NO ONE``); the old server's clock is
emulated by the proxy in front of it (tests/proxy.py ``shift_ms``: its flush replies carry a time
30 s or 5 min ahead, so the writers stamp in that clock), since a server's own clock cannot be set
from a test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from redis_stats import StatsConfig, StatsReader
from redis_stats.tools.embedded import EmbeddedRedis
from tests.conftest import sample_catalog
from tests.proxy import CuttingProxy
from tests.servers import master_and_replica
from tests.store.test_key_loss import _Writer

pytestmark = pytest.mark.redis_server


@pytest.fixture
def pair() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    with master_and_replica() as both:
        yield both


def _running(port: int, namespace: str, shards: int) -> float:
    cfg = StatsConfig(url=f"redis://127.0.0.1:{port}/0", namespace=namespace, shards=shards)
    reader = StatsReader(cfg, sample_catalog())
    try:
        return float(reader.snapshot().engines[0].gauge("running"))
    finally:
        reader.close()


@pytest.mark.parametrize("behind", [30, 300])
@pytest.mark.parametrize(("kind", "shards"), [("sync", 1), ("sync", 3), ("asyncio", 1)])
def test_after_a_failover_to_a_server_whose_clock_is_behind_the_newest_gauge_value_wins(
    pair, namespace, behind, kind, shards
):
    master, replica = pair
    front = CuttingProxy(master.port)  # the writers' address: switched to the replica on failover
    front.shift_ms = behind * 1000  # the old server's clock: *behind* s ahead of the new one's
    cfg = StatsConfig(url=front.url, namespace=namespace, shards=shards, flush_interval=0.05, stale_after=5.0)
    a = _Writer(kind, cfg, [0], "", "a")
    b = _Writer(kind, cfg, [0], "", "b")
    try:
        assert a.flush() and b.flush()  # both anchored to the old server's clock
        a.w.gauge("running").labels(engine=0).set(10)
        assert a.flush()
        assert redis.Redis(port=master.port).execute_command("WAIT", 1, 5000) == 1
        assert _running(replica.port, namespace, shards) == 10
        # The failover: the replica is promoted, the address now leads to it.
        redis.Redis(port=replica.port).execute_command("REPLICAOF", "NO", "ONE")
        front.shift_ms = 0
        front.retarget(replica.port)
        for _ in range(2):  # a first flush on the new server anchors b to its clock (and fails
            b.flush()  # once: the proxy cut b's connection)
        time.sleep(0.05)
        b.w.gauge("running").labels(engine=0).set(3)  # set after a's 10, stamped in the new clock
        assert b.flush()
        for _ in range(3):  # a's first flush there fails (its connection cut), then two flushes
            a.flush()
        assert _running(replica.port, namespace, shards) == 3  # the newer value wins
        a.w.gauge("running").labels(engine=0).set(7)
        assert a.flush()
        assert _running(replica.port, namespace, shards) == 7
    finally:
        a.close()
        b.close()
        front.close()
