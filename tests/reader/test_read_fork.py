"""A reader made before os.fork() reads in the child (found in review of the shards, #15)."""

from __future__ import annotations

import os
import time
from typing import Any

import fakeredis
import pytest

from redis_stats import StatsReader, StatsWriter
from tests.conftest import sample_catalog
from tests.store.test_shards import K, _cfg


class _FakeCluster(fakeredis.FakeRedis):
    """A fake client the reader takes for a Cluster's (one read.lua per shard, in its pool)."""

    def get_node_from_key(self, key: str, replica: bool = False) -> Any:
        return None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_a_cluster_reader_used_in_a_forked_child_reads(fake_server, namespace):
    """The Cluster read's thread pool does not survive fork(): its idle threads are gone in the
    child, and a pool that thinks it has idle workers starts none, so the child's first read
    waited for ever (an exporter or collector made before a gunicorn --preload fork)."""
    client = fakeredis.FakeRedis(server=fake_server, decode_responses=True)
    w = StatsWriter(
        _cfg(namespace, shards=K), sample_catalog(), engines=list(range(6)), client=client, start=False
    )
    for e in range(6):
        w.counter("tokens").labels(engine=e).inc(e + 1)
    assert w.flush()
    cluster = _FakeCluster(server=fake_server, decode_responses=True)
    reader = StatsReader(_cfg(namespace, shards=K), sample_catalog(), client=cluster)
    assert reader.snapshot().engines[4].counter("tokens") == 5  # the pool and its threads exist
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if reader.snapshot().engines[4].counter("tokens") == 5 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's read hung")
    reader.close()
    w.close()
