"""One load plane for every router replica (issue 47): arrivals counted where they land
(``in_flight``) and routers' bookings (``booked``), exact across kills, a Redis restart, an abort
mid-stream and two replicas booking the same engine at once. Real redis-server, real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.bookings import Bookings
from redis_stats.integrations.vllm.arrivals import ArrivalsMiddleware
from redis_stats.load import LoadMap, LoadSource
from redis_stats.writer import Arrivals
from tests.conftest import ROOT
from tests.probes import until
from tests.server.test_load_feed import LOAD, catalog, record

pytestmark = pytest.mark.redis_server


def cfg_of(url: str, namespace: str, **kw: float) -> StatsConfig:
    opts = {"flush_interval": 0.2, "stale_after": 2.0, **kw}
    return StatsConfig(url=url, namespace=namespace, **opts)  # type: ignore[arg-type]


def engine(reader: StatsReader, e: int = 0):  # type: ignore[no-untyped-def]
    return reader.load().engines.get(e)


def front_end(cfg: StatsConfig, role: str, engines: list[int] | None = None) -> tuple[StatsWriter, Arrivals]:
    writer = StatsWriter(cfg, catalog(), engines=engines or [0], role=role, load=LOAD)
    for e in engines or [0]:
        record(writer, e, 0, 0, 0.1)
    return writer, Arrivals(writer)


def test_arrivals_are_counted_once_summed_over_processes_and_leave_when_they_end(redis_server, namespace):
    cfg = cfg_of(redis_server.url, namespace)
    a, arrivals_a = front_end(cfg, "a")
    b, arrivals_b = front_end(cfg, "b")
    reader = StatsReader(cfg)
    try:
        assert until(lambda: (got := engine(reader)) is not None and got.in_flight == 0)
        first = arrivals_a.begin(request_id="r1")
        second = arrivals_a.begin(rank="0")
        third = arrivals_b.begin(rank=7)  # a rank this process does not serve: its engine's
        started = time.monotonic()
        assert until(lambda: engine(reader).in_flight == 3, timeout=2.0)
        assert time.monotonic() - started < 0.5  # the lane: at once after a quiet spell
        first.end()
        first.end()  # ended once, however often it is called
        with third:
            pass
        assert until(lambda: engine(reader).in_flight == 1)
        assert engine(reader).expected_in_flight == 1
        second.end()
        assert until(lambda: engine(reader).in_flight == 0)
    finally:
        a.close()
        b.close()


def test_a_peer_sees_a_booking_and_it_ends_with_the_arrival_that_counts_it(redis_server, namespace):
    cfg = cfg_of(redis_server.url, namespace)
    writer, arrivals = front_end(cfg, "fe")
    reader = StatsReader(cfg)
    router = Bookings(cfg, router="r1", bound=30.0)
    try:
        assert until(lambda: (got := engine(reader)) is not None and got.in_flight == 0)
        booking = router.book(0, "req-7")
        seen = engine(reader)  # a peer's next read: no wait
        assert (seen.booked, seen.in_flight, seen.expected_in_flight) == (1, 0, 1)
        arrival = arrivals.begin(request_id="req-7")
        totals = []
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            now = engine(reader)
            totals.append(now.expected_in_flight)
            if now.booked == 0 and now.in_flight == 1:
                break
        else:
            pytest.fail(f"the booking never ended with the arrival: {now}")
        assert min(totals) >= 1  # booked, then counted: never neither
        booking.end()  # the router's end of a booking already ended: nothing more
        arrival.end()
        assert until(lambda: engine(reader).expected_in_flight == 0)
    finally:
        router.close()
        writer.close()


def test_two_replicas_booking_the_same_engine_at_once_are_both_counted(redis_server, namespace):
    cfg = cfg_of(redis_server.url, namespace)
    writer, _ = front_end(cfg, "fe")
    reader = StatsReader(cfg)
    replicas = [Bookings(cfg, router=f"r{i}", bound=30.0) for i in range(2)]
    go = threading.Barrier(2)
    made: list[list[object]] = [[], []]

    def book(i: int) -> None:
        go.wait()
        made[i] = [replicas[i].book(0) for _ in range(50)]

    try:
        assert until(lambda: engine(reader) is not None and engine(reader).up)
        threads = [threading.Thread(target=book, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert engine(reader).booked == 100
        for booking in made[0]:
            booking.end()  # type: ignore[attr-defined]
        assert engine(reader).booked == 50
        replicas[1].close()  # a router that stops ends its bookings at once
        assert engine(reader).booked == 0
    finally:
        replicas[0].close()
        writer.close()


ROUTER = """
import sys, time
from redis_stats import StatsConfig
from redis_stats.bookings import Bookings
cfg = StatsConfig(url=sys.argv[1], namespace=sys.argv[2])
router = Bookings(cfg, router="doomed", lease=0.6, bound=60.0)
for i in range(3):
    router.book(0, f"doomed-{i}")
print("booked", flush=True)
time.sleep(600)
"""


def test_a_killed_routers_bookings_end_with_its_lease_and_no_live_ones_do(redis_server, namespace):
    cfg = cfg_of(redis_server.url, namespace)
    writer, _ = front_end(cfg, "fe")
    reader = StatsReader(cfg)
    live = Bookings(cfg, router="live", lease=0.6, bound=60.0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", ROUTER, redis_server.url, namespace], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"booked"
        live.book(0, "kept")
        time.sleep(1.5)  # past two leases: the live router renewed, the doomed one too
        assert engine(reader).booked == 4
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        assert until(lambda: engine(reader).booked == 1, timeout=3.0)
        assert time.monotonic() - killed < 1.2  # within its lease (0.6 s) and a read
        time.sleep(1.5)  # the live router's booking stays: its bound is a minute
        assert engine(reader).booked == 1
    finally:
        proc.kill()
        live.close()
        writer.close()


FRONT_END = """
import sys, time
from redis_stats import StatsConfig, StatsWriter
from redis_stats.writer import Arrivals
from tests.server.test_load_feed import LOAD, catalog, record
cfg = StatsConfig(url=sys.argv[1], namespace=sys.argv[2], flush_interval=0.2, stale_after=1.0)
writer = StatsWriter(cfg, catalog(), engines=[0], role="doomed", load=LOAD)
record(writer, 0, 0, 0, 0.1)
arrivals = Arrivals(writer)
held = [arrivals.begin() for _ in range(2)]
time.sleep(0.6)
print("counting", flush=True)
time.sleep(600)
"""


def test_a_killed_front_ends_requests_leave_the_count_with_its_lease(redis_server, namespace):
    cfg = cfg_of(redis_server.url, namespace)
    writer, arrivals = front_end(cfg, "survivor")
    reader = StatsReader(cfg)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", FRONT_END, redis_server.url, namespace], stdout=subprocess.PIPE, env=env
    )
    try:
        kept = arrivals.begin()
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"counting"
        assert until(lambda: engine(reader).in_flight == 3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert until(lambda: engine(reader).in_flight == 1, timeout=4.0)  # its stale_after, 1 s
        kept.end()
        assert until(lambda: engine(reader).in_flight == 0)
    finally:
        proc.kill()
        writer.close()


def test_arrivals_and_bookings_come_back_after_redis_restarts_empty(own_redis_server, namespace):
    cfg = cfg_of(own_redis_server.url, namespace)
    writer, arrivals = front_end(cfg, "fe")
    reader = StatsReader(cfg)
    router = Bookings(cfg, router="r", lease=0.6, bound=60.0)
    try:
        held = [arrivals.begin(), arrivals.begin()]
        router.book(0, "open")
        assert until(lambda: (got := engine(reader)) is not None and (got.in_flight, got.booked) == (2, 1))
        own_redis_server.stop()
        own_redis_server.start()  # empty: no persistence
        assert until(
            lambda: _quiet(reader) and (engine(reader).in_flight, engine(reader).booked) == (2, 1), 6.0
        )
        held[0].end()
        assert until(lambda: engine(reader).in_flight == 1)
    finally:
        router.close()
        writer.close()


def _quiet(reader: StatsReader) -> bool:
    try:
        return engine(reader) is not None
    except Exception:
        return False


def test_a_request_aborted_mid_stream_leaves_the_count(redis_server, namespace):
    cfg = cfg_of(redis_server.url, namespace)
    writer, arrivals = front_end(cfg, "fe")

    async def streaming(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.Event().wait()  # streams until the client goes away

    async def gone(message):  # type: ignore[no-untyped-def]
        return None

    app = ArrivalsMiddleware(streaming, arrivals)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"x-request-id", b"abc"), (b"x-data-parallel-rank", b"0")],
    }

    async def run() -> tuple[int, int]:
        task = asyncio.ensure_future(app(scope, gone, gone))
        await asyncio.sleep(0.05)
        during = arrivals.in_flight()
        task.cancel()  # the server cancels the app when the client disconnects
        with pytest.raises(asyncio.CancelledError):
            await task
        return during, arrivals.in_flight()

    try:
        assert asyncio.run(run()) == (1, 0)
        get = {"type": "http", "method": "GET", "path": "/v1/models", "headers": []}

        async def passthrough(scope, receive, send):  # type: ignore[no-untyped-def]
            assert arrivals.in_flight() == 0  # a GET is not a request to an engine

        asyncio.run(ArrivalsMiddleware(passthrough, arrivals)(get, gone, gone))
    finally:
        writer.close()


def test_arrivals_need_a_writer_with_a_load_map(redis_server, namespace):
    writer = StatsWriter(cfg_of(redis_server.url, namespace), catalog(), engines=[0], start=False)
    with pytest.raises(ValueError, match="load map"):
        Arrivals(writer)
    with pytest.raises(ValueError, match="not an engine index"):
        Bookings(cfg_of(redis_server.url, namespace), start=False).book(-1)


def test_an_engine_without_a_front_end_counting_reports_no_in_flight(redis_server, namespace):
    cfg = cfg_of(redis_server.url, namespace)
    writer = StatsWriter(
        cfg,
        catalog(),
        engines=[0],
        role="plain",
        load=LoadMap(requests_running=LoadSource("running"), requests_waiting=LoadSource("waiting")),
    )
    record(writer, 0, 3, 1, 0.1)
    reader = StatsReader(cfg)
    try:
        assert until(lambda: (got := engine(reader)) is not None and got.requests_running == 3)
        load = engine(reader)
        assert load.in_flight is None  # nothing counts: not "0 requests"
        assert load.expected_in_flight == 4  # running + waiting, without bookings
        doc = reader.load().to_dict()["engines"]["0"]
        assert (doc["in_flight"], doc["booked"], doc["expected_in_flight"]) == (None, 0, 4)
    finally:
        writer.close()


def test_a_forked_router_is_a_router_of_its_own(redis_server, namespace):
    cfg = cfg_of(redis_server.url, namespace)
    writer, _ = front_end(cfg, "fe")
    reader = StatsReader(cfg)
    router = Bookings(cfg, lease=0.6, bound=60.0)  # made before the fork (gunicorn --preload)
    try:
        router.book(0, "parent")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: books under its own lease, renewed by its own thread
            try:
                router.book(0, "child")
                os.write(write, router.router.encode())
                time.sleep(3.0)
            finally:
                os._exit(0)
        child_id = os.read(read, 200).decode()
        assert child_id != router.router
        time.sleep(1.5)  # past two leases: both renewed
        assert engine(reader).booked == 2
        router.close()  # the parent's lease ends: the child's booking stays
        assert engine(reader).booked == 1
        os.waitpid(pid, 0)
    finally:
        router.close()
        writer.close()


@pytest.mark.asyncio
async def test_the_asyncio_writer_counts_arrivals_and_ends_bookings_too(redis_server, namespace):
    from redis_stats.aio import AsyncStatsReader, AsyncStatsWriter

    cfg = cfg_of(redis_server.url, namespace)
    writer = AsyncStatsWriter(cfg, catalog(), engines=[0], load=LOAD)
    record(writer, 0, 0, 0, 0.1)  # type: ignore[arg-type]
    arrivals = Arrivals(writer)
    router = Bookings(cfg, router="r", bound=30.0)
    reader = AsyncStatsReader(cfg)
    try:
        assert await writer.flush()
        router.book(0, "aio-1")
        held = arrivals.begin(request_id="aio-1")
        assert await writer.flush_load()  # the lane's call: the count, then the booking ended
        load = (await reader.load()).engines[0]
        assert (load.in_flight, load.booked) == (1, 0)
        held.end()
    finally:
        router.close()
        await reader.close()
        await writer.close()


def test_the_middleware_counts_in_the_writer_the_vllm_plugin_registered(redis_server, namespace):
    from redis_stats.integrations.vllm import arrivals as vllm_arrivals

    cfg = cfg_of(redis_server.url, namespace)
    writer = StatsWriter(cfg, catalog(), engines=[0, 1], role="api0", load=LOAD)
    seen: list[int] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        seen.append(writer.load.in_flight([1]))  # type: ignore[union-attr]

    async def nothing(message=None):  # type: ignore[no-untyped-def]
        return None

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"x-data-parallel-rank", b"1")],
    }
    try:
        asyncio.run(ArrivalsMiddleware(app)(scope, nothing, nothing))  # nothing registered: passed through
        vllm_arrivals.register_writer(writer)  # what RedisStatLogger does
        asyncio.run(ArrivalsMiddleware(app)(scope, nothing, nothing))
        assert seen == [0, 1] and writer.load.in_flight() == 0  # type: ignore[union-attr]
    finally:
        vllm_arrivals.register_writer(None)
        writer.close()
