"""Every process that talks to Redis logs each outage's start and its end, at one level (issue 41):
a real redis-server stopped and started twice under every component at once — a writer's
flusher, sync and asyncio; the lease keeper; the reporter; the exporter's reads (a collector) and
its ``/load`` refresher — gives each of them two pairs of lines, start then end, each end at the
level of its start (before: the writer warned once per error kind in its lifetime and never said
it recovered; the second outage left no trace)."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsWriter
from redis_stats.connection import make_client
from redis_stats.keys import Keys
from redis_stats.leader import LeaseLeader, Rank0Leader
from redis_stats.prometheus.collector import RedisCollector
from redis_stats.reporting import StatsReporter
from redis_stats.server.states.load_feed import LoadFeed
from tests.conftest import sample_catalog

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

UP, DOWN = 1.5, 1.5  # seconds up and down: several attempts of every component in each


class Loop:
    """Something called every *every* s from a thread of its own until stopped."""

    def __init__(self, every: float, call) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(every, call), daemon=True)
        self.thread.start()

    def _run(self, every: float, call) -> None:
        while not self.stop.wait(every):
            call()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def pairs(records: list[logging.LogRecord], logger: str, what: str) -> list[tuple[str, int]]:
    """("start" | "end", level) of the outage lines of *logger* about *what*, in order."""
    out = []
    for r in records:
        text = r.getMessage()
        if r.name != logger or what not in text:
            continue
        if "outage started" in text:
            out.append(("start", r.levelno))
        elif "outage ended" in text:
            out.append(("end", r.levelno))
    return out


def test_two_outages_are_two_pairs_of_lines_in_every_component(own_redis_server, namespace, caplog):
    caplog.set_level(logging.DEBUG, logger="redis_stats")
    url = own_redis_server.url
    config = StatsConfig(url=url, namespace=namespace, flush_interval=0.1, stale_after=2.0, close_timeout=0.5)
    catalog = sample_catalog()
    writer = StatsWriter(config, catalog, engines=[0], role="sync")
    writer.counter("requests").labels(engine=0, reason="stop").inc()

    loop = asyncio.new_event_loop()
    aio_started = threading.Event()
    aio_done = threading.Event()
    holder: dict = {}

    async def run_async_writer() -> None:
        async with AsyncStatsWriter(config, catalog, engines=[1], role="aio") as aw:
            holder["id"] = aw.writer_id
            aw.counter("requests").labels(engine=1, reason="stop").inc()
            aio_started.set()
            while not aio_done.is_set():
                await asyncio.sleep(0.05)

    aio_thread = threading.Thread(target=loop.run_until_complete, args=(run_async_writer(),), daemon=True)
    aio_thread.start()
    assert aio_started.wait(10)

    lease = LeaseLeader(make_client(config), Keys(namespace), "holder-a", ttl=0.9, close_timeout=0.5)
    reporter = StatsReporter(
        StatsReader(config, catalog), Rank0Leader([0]), lines=lambda a, b: [], interval=0.2
    )
    reporter.start()
    reader = StatsReader(config, catalog)
    collector = RedisCollector(reader)
    scrapes = Loop(0.1, collector.render_text)
    feed = LoadFeed(reader, refresh=0.1)
    polls = Loop(0.1, feed.answer)
    try:
        time.sleep(UP)
        assert lease.is_leader()
        for _ in range(2):
            own_redis_server.stop()
            time.sleep(DOWN)
            own_redis_server.start()
            time.sleep(UP)
    finally:
        scrapes.close()
        polls.close()
        feed.close()
        reporter.close()
        lease.close()
        writer.close()
        aio_done.set()
        aio_thread.join(10)
        loop.close()

    records = caplog.records
    components = {
        "sync writer": ("redis_stats.writer", f"flushes of writer {writer.writer_id} "),
        "asyncio writer": ("redis_stats.writer", f"flushes of writer {holder['id']} "),
        "lease keeper": ("redis_stats.leader", "renewals of the log lease"),
        "reporter": ("redis_stats.reporter", "for the periodic log"),
        "exporter's reads": ("redis_stats.collector", f"reads of namespace '{namespace}' from"),
        "/load refresher": ("redis_stats.exporter", "/load refreshes of namespace"),
    }
    for name, (logger, what) in components.items():
        got = pairs(records, logger, what)
        assert [kind for kind, _ in got] == ["start", "end", "start", "end"], (name, got)
        assert all(level == logging.WARNING for _, level in got), (name, got)
    # Each end says how long it lasted and what failed; the writer's, what became of what it kept
    # (this Redis comes back empty: its whole state goes again, nothing lost).
    ends = [r.getMessage() for r in records if "outage ended" in r.getMessage()]
    assert all(
        re.search(r"outage ended after \d+\.\d s \(since \d\d:\d\d:\d\d\), \d+ attempts? failed \(", e)
        for e in ends
    )
    writer_ends = [e for e in ends if e.startswith(f"flushes of writer {writer.writer_id}")]
    assert len(writer_ends) == 2
    assert all(
        "had lost this writer's keys" in e and "nothing recorded during the outage is lost" in e
        for e in writer_ends
    )


def test_an_outage_where_redis_kept_its_data_ends_with_the_batch_confirmed(
    own_redis_server, namespace, caplog
):
    caplog.set_level(logging.WARNING, logger="redis_stats.writer")
    config = StatsConfig(url=own_redis_server.url, namespace=namespace, flush_interval=0.1, close_timeout=0.5)
    writer = StatsWriter(config, sample_catalog(), engines=[0])
    requests = writer.counter("requests").labels(engine=0, reason="stop")
    try:
        requests.inc()
        time.sleep(0.5)
        own_redis_server.stop(keep_data=True)
        requests.inc(41)  # recorded while Redis is away
        time.sleep(0.5)
        own_redis_server.start()
        time.sleep(0.6)
    finally:
        writer.close()
    (end,) = [r.getMessage() for r in caplog.records if "outage ended" in r.getMessage()]
    assert "what was kept meanwhile is confirmed, exactly once" in end
    snap = StatsReader(config, sample_catalog()).snapshot()
    assert snap.engines[0].counter("requests", "stop") == 42


def test_a_flapping_link_cannot_flood_the_log(redis_server, namespace, caplog):
    from redis_stats.outage import BURST
    from tests.proxy import CuttingProxy

    caplog.set_level(logging.WARNING, logger="redis_stats.writer")
    proxy = CuttingProxy(redis_server.port)
    config = StatsConfig(url=proxy.url, namespace=namespace, flush_interval=0.02, close_timeout=0.5)
    writer = StatsWriter(config, sample_catalog(), engines=[0])
    requests = writer.counter("requests").labels(engine=0, reason="stop")
    try:
        proxy.reset_probability = 0.5  # every other request dropped, connection closed: for 5 s
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            requests.inc()
            time.sleep(0.01)
        proxy.reset_probability = 0.0
        time.sleep(0.3)
        errors = sum(writer.stats.errors.values())
    finally:
        writer.close()
        proxy.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("flushes of writer")]
    assert errors > 20, errors  # the link did flap: many outages
    assert len(lines) <= 2 * BURST, lines  # ... and the log holds BURST pairs (one a minute more)
    starts = [t for t in lines if "outage started" in t]
    assert len(starts) == BURST and len(lines) == 2 * BURST  # each start logged has its end
