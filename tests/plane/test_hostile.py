"""Hostile values through the load plane: garbage bookings, keys of the wrong type, bad ids and
ranks. Each is refused with a clear error or skipped and counted; nothing else is lost."""

from __future__ import annotations

import pytest
import redis

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.bookings import Bookings
from redis_stats.codec import decode_booking
from redis_stats.keys import Keys
from redis_stats.writer import Arrivals
from tests.probes import until
from tests.server.test_load_feed import LOAD, catalog, record

pytestmark = pytest.mark.redis_server


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "x",
        "1",
        "1|2",
        "1|2|",
        "-1|2|r",
        "\u0661|2|r",
        "1|nan|r",
        "1|1e400|r",
        "1|inf|r",
        "12345678901|2|r",
        5,
    ],
)
def test_a_stored_booking_that_is_not_one_is_not_read(stored):
    assert decode_booking(stored) is None


def test_a_stored_booking_reads_back():
    assert decode_booking("3|1700000000123|host:1:ab") == (3, 1700000000123.0, "host:1:ab")
    assert decode_booking("3|1.5|a|b") == (3, 1.5, "a|b")  # the router is the rest


@pytest.fixture
def fleet(redis_server, namespace):  # type: ignore[no-untyped-def]
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.2, stale_after=5.0)
    writer = StatsWriter(cfg, catalog(), engines=[0, 1], role="fe", load=LOAD)
    record(writer, 0, 1, 0, 0.1)
    record(writer, 1, 1, 0, 0.1)
    reader = StatsReader(cfg)
    assert until(lambda: len(reader.load().engines) == 2)
    yield cfg, writer, reader, redis.Redis.from_url(redis_server.url, decode_responses=True)
    writer.close()


def test_garbage_in_the_bookings_hash_is_skipped_and_counted(fleet):  # type: ignore[no-untyped-def]
    cfg, _, reader, admin = fleet
    keys = Keys(cfg.namespace)
    router = Bookings(cfg, router="ok", bound=30.0)
    try:
        router.book(1, "real")
        far = 10**13
        admin.hset(
            keys.bookings, mapping={"a": "garbage", "b": "1|nan|ok", "c": "7|1|ok", "d": f"0|{far}|ghost"}
        )
        view = reader.load()
        # the real booking counts; a past bound ("c"), an unknown router ("d") do not; two unreadable
        assert (view.engines[0].booked, view.engines[1].booked) == (0, 1)
        assert view.skipped["bad_booking"] == 2
        assert view.to_dict()["fleet"]["booked"]["sum"] == 1
        router.renew()  # the renewal drops what no longer counts, garbage included
        assert set(admin.hkeys(keys.bookings)) == {"real"}
    finally:
        router.close()


@pytest.mark.parametrize("which", ["bookings", "routers"])
def test_a_key_of_the_wrong_type_costs_the_bookings_only(fleet, which):  # type: ignore[no-untyped-def]
    cfg, _, reader, admin = fleet
    key = getattr(Keys(cfg.namespace), which)
    admin.set(key, "not a hash")
    view = reader.load()
    assert view.skipped["wrong_type"] == 1
    assert (view.engines[0].requests_running, view.engines[0].booked) == (1, 0)  # the rest is read
    router = Bookings(cfg, router="r", start=False)
    router.book(0, "x")  # refused by the store: counted, never raised into the router
    assert router.errors == 1
    admin.delete(key)


def test_bad_ids_engines_and_settings_are_refused_naming_them(fleet):  # type: ignore[no-untyped-def]
    cfg, _, _, _ = fleet
    with pytest.raises(ValueError, match="router="):
        Bookings(cfg, router="a|b", start=False)
    with pytest.raises(ValueError, match="lease="):
        Bookings(cfg, lease=float("nan"), start=False)
    with pytest.raises(ValueError, match="bound="):
        Bookings(cfg, bound=0, start=False)
    router = Bookings(cfg, start=False)
    for engine in (True, -1, 1.0, "1", 10**10):
        with pytest.raises(ValueError, match="engine="):
            router.book(engine)  # type: ignore[arg-type]
    for request_id in ("", "x" * 257, 5):
        with pytest.raises(ValueError, match="request_id"):
            router.book(0, request_id)  # type: ignore[arg-type]


def test_a_rank_not_served_here_counts_on_the_default_engine(fleet):  # type: ignore[no-untyped-def]
    _, writer, reader, _ = fleet
    arrivals = Arrivals(writer)
    assert [arrivals.engine_of(r) for r in ("1", " 1 ", 1, True, "x", "\u0661", None, 7, -1, 1.0)] == [
        1,
        1,
        1,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]
    with pytest.raises(ValueError, match="default=5"):
        Arrivals(writer, default=5)
    held = arrivals.begin(rank="1")
    assert until(lambda: reader.load().engines[1].in_flight == 1)
    held.end()


def test_no_expected_count_from_a_count_no_engine_can_have(fleet):  # type: ignore[no-untyped-def]
    cfg, writer, reader, _ = fleet
    writer.metric("waiting").labels(0, model="m").set(-5)  # a bad gauge
    router = Bookings(cfg, router="r", bound=30.0)
    try:
        router.book(0, "x")
        assert until(lambda: reader.load().engines[0].requests_waiting == -5)
        view = reader.load()
        # never a negative (or NaN) expectation for a least-loaded policy to send everything to
        assert view.engines[0].expected_in_flight is None
        assert view.to_dict()["engines"]["0"]["expected_in_flight"] is None
        assert view.engines[1].expected_in_flight == 1  # the other engine's is what it reports
    finally:
        router.close()


def test_ids_waiting_for_an_unreachable_store_are_bounded():
    from redis_stats.writer.loadtracker import MAX_CONFIRMING, LoadTracker

    tracker = LoadTracker(LOAD)
    tracker.count_arrivals([0])
    for i in range(MAX_CONFIRMING + 500):  # Redis down: the lane never takes them
        tracker.arrive(0, f"id-{i}")
        tracker.depart(0)
    tracker.entries([0], carry=True)
    carried = tracker.carried()
    assert len(carried[0]) == MAX_CONFIRMING and carried[0][-1] == f"id-{MAX_CONFIRMING + 499}"
    tracker.uncarry({0: [f"old-{i}" for i in range(10)]})  # a failed call gives them back: still bounded
    tracker.entries([0], carry=True)
    assert len(tracker.carried()[0]) == 10 and tracker.in_flight() == 0


def test_a_router_does_not_wait_on_an_unreachable_store_for_every_dispatch(namespace):
    from redis_stats.tools.embedded import free_port

    cfg = StatsConfig(url=f"redis://127.0.0.1:{free_port()}/0", namespace=namespace)
    router = Bookings(cfg, router="r", lease=3.0, start=False)
    for _ in range(100):
        router.book(0)  # never raises: the request is routed all the same
    assert (router.errors, router.skipped) == (1, 99)  # one attempt, then none for a third of a lease
    assert len(router.open()) == 100  # kept: booked again once a renewal finds the store back


def test_bookings_not_sent_while_the_store_was_away_are_sent_when_it_answers(own_redis_server, namespace):
    cfg = StatsConfig(url=own_redis_server.url, namespace=namespace, flush_interval=0.2, stale_after=5.0)
    writer = StatsWriter(cfg, catalog(), engines=[0], role="fe", load=LOAD)
    record(writer, 0, 0, 0, 0.1)
    reader = StatsReader(cfg)
    router = Bookings(cfg, router="r", lease=30.0, bound=60.0, start=False)
    try:
        assert until(lambda: 0 in reader.load().engines)
        router.book(0, "before")
        own_redis_server.stop(keep_data=True)
        router.book(0, "during")  # fails: counted
        router.book(0, "during-2")  # not tried (a third of the lease)
        assert (router.errors, router.skipped) == (1, 1)
        own_redis_server.start()  # with its data: the lease was not lost
        router.renew()
        assert until(lambda: reader.load().engines[0].booked == 3)
    finally:
        router.close()
        writer.close()
