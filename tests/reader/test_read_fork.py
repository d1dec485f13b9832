"""A reader made before os.fork() reads in the child (found in review of the shards, #15)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import fakeredis
import pytest

from redis_stats import RedisCollector, StatsReader, StatsWriter
from redis_stats.prometheus.exposition import TextRenderer
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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_a_child_forked_in_the_middle_of_a_read_renders_what_a_fresh_reader_renders(
    config, catalog, fake_client
):
    """A read runs in a thread of the parent when it forks (an exporter thread of a gunicorn
    --preload master): the child has no such read, and nothing of it (a read keeps no state
    that another must end). The child's scrapes equal a fresh reader's."""
    engines = [0, 1, 2, 3]
    writers = []
    for role in ("api0", "api1"):
        w = StatsWriter(config, catalog, engines=engines, client=fake_client(), start=False, role=role)
        for e in engines:
            w.counter("tokens").labels(engine=e).inc(e + 1)
            w.histogram("latency_seconds").labels(engine=e).observe(0.1)
        assert w.flush()
        writers.append(w)
    inside, release = threading.Event(), threading.Event()

    class Paused(TextRenderer):
        """The scrape's renderer, held in the thread named mid-read: its read is made and decoded,
        its text not yet (the collector's own way in: ``renderer=``)."""

        def render(self, decoded: Any) -> str:
            if threading.current_thread().name == "mid-read":
                inside.set()
                release.wait(10)
            return super().render(decoded)

    reader = StatsReader(config, catalog, client=fake_client())
    collector = RedisCollector(reader, renderer=Paused)
    collector.render_text()
    for w in writers:
        w.counter("tokens").labels(engine=0).inc(1)
        assert w.flush()
    t = threading.Thread(target=collector.render_text, name="mid-read")
    t.start()
    assert inside.wait(10)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            want = RedisCollector(StatsReader(config, catalog, client=fake_client()))
            same = all(_stable(collector.render_text()) == _stable(want.render_text()) for _ in range(2))
            code = 0 if same else 2
        finally:
            os._exit(code)
    release.set()
    t.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for w in writers:
        w._closed = True


def _stable(text: str) -> list[str]:
    return [x for x in text.splitlines() if "duration" not in x and "age_seconds" not in x]
