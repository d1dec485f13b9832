"""Several writers' load lanes in one round trip (issue 47, item 4): a process holding one writer
per engine (``redis-stats simulate``, a host of several engines' writers on one client) sends
their changed entries as one ``HSET`` per load hash a turn, not one call per writer, exactly as
each writer's own lane would have stored them. Against a private real server (its ``INFO
commandstats`` counts the calls)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.keys import Keys
from redis_stats.writer import LaneGroup

pytestmark = pytest.mark.redis_server

ENGINES = 8


def hset_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_hset", {}).get("calls", 0))


def fleet(server, namespace, client, **config) -> tuple[list[StatsWriter], StatsConfig]:
    """One writer per engine on one shared client, each flushed once (the lane waits for that)."""
    cfg = StatsConfig(url=server.url, namespace=namespace, flush_interval=5.0, **config)
    writers = []
    for e in range(ENGINES):
        w = StatsWriter(cfg, vllm_catalog(), engines=[e], client=client, start=False, load=VLLM_LOAD)
        w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(0)
        assert w.flush()
        writers.append(w)
    return writers, cfg


def waiting(w: StatsWriter, engine: int):
    return w.metric("vllm:num_requests_waiting").labels(engine, model_name="m")


def stored(reader: StatsReader) -> dict[int, float | None]:
    return {e: load.requests_waiting for e, load in reader.load().engines.items()}


@pytest.fixture
def client(redis_server):
    c = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield c
    c.close()


def test_a_turn_sends_every_writers_changes_in_one_call(redis_server, namespace, client):
    """(Before: each writer's lane made its own call: 8 calls for 8 engines' changes.)"""
    writers, cfg = fleet(redis_server, namespace, client)
    group = LaneGroup(client)
    for w in writers:
        group.add(w)
    reader = StatsReader(cfg)
    try:
        for e, w in enumerate(writers):
            waiting(w, e).set(10 + e)
        before = hset_calls(client)
        assert group.turn()
        assert hset_calls(client) - before == 1
        assert stored(reader) == {e: 10 + e for e in range(ENGINES)}
        assert [w.stats.lane_calls for w in writers] == [1] * ENGINES  # each counts its attempt
        waiting(writers[3], 3).set(99)  # one writer changed: it alone rides the next call
        before = hset_calls(client)
        assert group.turn()
        assert hset_calls(client) - before == 1
        assert stored(reader)[3] == 99
        assert [w.stats.lane_calls for w in writers] == [1, 1, 1, 2, 1, 1, 1, 1]
        before = hset_calls(client)
        assert not group.turn()  # nothing changed: no call
        assert hset_calls(client) == before
        assert not writers[0].flush_load()  # a grouped writer's own lane makes no call
    finally:
        for w in writers:
            w.close()


def test_the_last_write_of_each_engine_wins_and_a_running_flush_is_never_overtaken(
    redis_server, namespace, client
):
    writers, cfg = fleet(redis_server, namespace, client)
    group = LaneGroup(client)
    for w in writers:
        group.add(w)
    reader = StatsReader(cfg)
    try:
        for n in range(1, 6):  # changes between two turns: the last one is stored
            for e, w in enumerate(writers):
                waiting(w, e).set(n * 100 + e)
        assert group.turn()
        assert stored(reader) == {e: 500 + e for e in range(ENGINES)}
        # A writer whose flush runs (its lock held) is passed over: the group never writes its
        # entries between the flush's taking them and Redis applying them.
        busy = writers[2]
        with busy.lane_lock:
            waiting(busy, 2).set(7)
            waiting(writers[5], 5).set(8)
            assert group.turn()
            assert stored(reader)[2] == 502 and stored(reader)[5] == 8
        assert group.turn()  # its change goes at the next turn
        assert stored(reader)[2] == 7
    finally:
        for w in writers:
            w.close()


def test_a_failed_call_is_every_writers_failure_and_nothing_is_lost(redis_server, namespace, client):
    writers, cfg = fleet(redis_server, namespace, client)
    group = LaneGroup(client)
    for w in writers:
        group.add(w)
    reader = StatsReader(cfg)
    load_key = Keys(namespace).load
    saved = client.hgetall(load_key)
    try:
        client.delete(load_key)
        client.set(load_key, "not a hash")  # every HSET of the turn is refused
        for e, w in enumerate(writers):
            waiting(w, e).set(20 + e)
        assert group.turn()
        assert [w.stats.errors.get("load_response") for w in writers] == [1] * ENGINES
        client.delete(load_key)
        client.hset(load_key, mapping=saved)  # the hash back, with the entries of the flushes
        assert group.turn()  # every entry again, changed or not: none was stored
        assert stored(reader) == {e: 20 + e for e in range(ENGINES)}
        # A connection lost mid-turn: the same (the call may or may not have landed).
        real = client.pipeline

        def broken(*args, **kwargs):
            pipe = real(*args, **kwargs)
            pipe.execute = lambda **_: (_ for _ in ()).throw(redis.ConnectionError("gone"))
            return pipe

        client.pipeline = broken
        waiting(writers[0], 0).set(31)
        assert group.turn()
        assert [w.stats.errors.get("load_connection", 0) for w in writers] == [1] + [0] * (ENGINES - 1)
        client.pipeline = real
        assert group.turn()
        assert stored(reader)[0] == 31
    finally:
        for w in writers:
            w.close()


def test_the_groups_thread_keeps_the_lanes_pace(redis_server, namespace, client):
    """Started, the group sends a change within the lane (not the flush: 5 s apart), at most
    one call per load_interval for all its writers."""
    writers, cfg = fleet(redis_server, namespace, client, load_interval=0.1)
    reader = StatsReader(cfg)
    stop = threading.Event()
    with LaneGroup(client) as group:
        for w in writers:
            group.add(w)
        assert group.interval == 0.1
        try:
            before, start = hset_calls(client), time.monotonic()
            for i in range(100):  # every engine changes every 10 ms for a second
                for e, w in enumerate(writers):
                    waiting(w, e).set(1000 + i)
                time.sleep(0.01)
            spent = time.monotonic() - start
            deadline = time.monotonic() + 2.0
            while set(stored(reader).values()) != {1099}:
                assert time.monotonic() < deadline, stored(reader)
                time.sleep(0.01)
            calls = hset_calls(client) - before
            assert spent / 0.1 / 3 <= calls <= spent / 0.1 + 3  # one per interval for 8 writers
        finally:
            stop.set()
            for w in writers:
                w.close()
    assert group.calls >= 1


def test_a_closed_writer_leaves_the_group(redis_server, namespace, client):
    writers, _ = fleet(redis_server, namespace, client)
    group = LaneGroup(client)
    for w in writers:
        group.add(w)
    writers[0].close()
    waiting(writers[0], 0).set(5)  # recorded after close: never sent
    assert not group.turn()
    for w in writers[1:]:
        w.close()


def test_a_booking_ends_with_the_arrival_the_groups_call_stored(redis_server, namespace, client):
    """The routers' bookings of a request end once the entry counting it is stored, as each
    writer's own lane ends them (issue 47, items 1-2): by the group's turn, never before."""
    from redis_stats.bookings import Bookings
    from redis_stats.writer import Arrivals

    writers, cfg = fleet(redis_server, namespace, client)
    group = LaneGroup(client)
    for w in writers:
        group.add(w)
    reader = StatsReader(cfg)
    router = Bookings(cfg, router="r1", bound=30.0)
    arrivals = Arrivals(writers[4])
    try:
        router.book(4, "req-9")
        arrival = arrivals.begin(request_id="req-9")
        assert reader.load().engines[4].booked == 1  # the arrival not stored yet: the booking stands
        assert group.turn()
        load = reader.load().engines[4]
        assert (load.booked, load.in_flight, load.expected_in_flight) == (0, 1, 1)
        arrival.end()
        assert group.turn()
        assert reader.load().engines[4].in_flight == 0
    finally:
        router.close()
        for w in writers:
            w.close()
