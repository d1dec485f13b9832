"""The periodic log: vLLM's format, throughput from Redis totals, idle and stale engines, the lease."""

import logging
import time

import pytest

from redis_stats import StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.logline import (
    EngineInterval,
    VllmLogLines,
    format_engine_line,
    format_spec_line,
)
from redis_stats.keys import Keys
from redis_stats.leader import LeaseLeader, Rank0Leader
from redis_stats.reporting import StatsReporter
from tests.vllm_shapes import iteration, scheduler

# vLLM's own format strings (vllm/v1/metrics/loggers.py, LoggingStatLogger.log).
VLLM_LINE = (
    "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
    "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%"
)


def test_engine_line_matches_vllms_format_exactly():
    iv = EngineInterval(
        prompt_throughput=812.44,
        generation_throughput=95.06,
        running=12,
        waiting=3,
        kv_usage=0.4134,
        prefix_queries=800,
        prefix_hits=300,
    )
    fmt, args = format_engine_line("Engine 002: ", iv)
    assert fmt % tuple(args) == VLLM_LINE % (2, 812.44, 95.06, 12, 3, 41.34, 37.5)


def test_optional_parts_appear_as_in_vllm():
    iv = EngineInterval(preemptions=2, external_queries=10, external_hits=5, mm_queries=4, mm_hits=1)
    fmt, args = format_engine_line("Engine 000: ", iv)
    text = fmt % tuple(args)
    assert "Waiting: 0 reqs, Preemptions: 2, GPU KV cache usage: 0.0%" in text
    assert text.endswith("External prefix cache hit rate: 50.0%, MM cache hit rate: 25.0%")


def test_spec_line_only_with_drafts():
    assert format_spec_line(EngineInterval()) is None
    iv = EngineInterval(drafts=10, draft_tokens=30, accepted_tokens=15, accepted_per_pos=(8, 5, 2), seconds=5)
    fmt, args = format_spec_line(iv)
    assert fmt % tuple(args) == (
        "SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 3.00 tokens/s, "
        "Drafted throughput: 6.00 tokens/s, Accepted: 15 tokens, Drafted: 30 tokens, "
        "Per-position acceptance rate: 0.800, 0.500, 0.200, Avg Draft acceptance rate: 50.0%"
    )


@pytest.fixture
def fleet(config, fake_client):
    cat = vllm_catalog()
    writers = [StatsWriter(config, cat, engines=[e], client=fake_client(), start=False) for e in (0, 1)]
    recorders = [VllmRecorder(w, "m", [e]) for e, w in enumerate(writers)]
    reader = StatsReader(config, cat, client=fake_client())
    yield writers, recorders, reader
    for w in writers:
        w._closed = True


def flush(writers):
    for w in writers:
        assert w.flush()


def test_throughput_is_the_change_of_redis_totals_over_server_time(fleet, caplog):
    writers, recorders, reader = fleet
    reporter = StatsReporter(reader, Rank0Leader([0]), lines=VllmLogLines(), interval=1)
    recorders[0].record(scheduler(running=4, waiting=1, kv=0.5, queries=100, hits=25), iteration(prompt=10))
    flush(writers)
    assert reporter.tick() == []  # the first tick only takes the starting snapshot
    time.sleep(0.5)
    recorders[0].record(
        scheduler(running=4, waiting=1, kv=0.5, queries=100, hits=25),
        iteration(prompt=500, generation=50),
        engine_idx=0,
    )
    recorders[1].record(scheduler(running=2, kv=0.25), iteration(generation=100), engine_idx=1)
    flush(writers)
    with caplog.at_level(logging.INFO, logger="redis_stats.reporter"):
        lines = reporter.tick()
    seconds = 0.5
    e0 = next(line for line in lines if line.startswith("Engine 000"))
    prompt = float(e0.split("Avg prompt throughput: ")[1].split(" ")[0])
    assert prompt == pytest.approx(500 / seconds, rel=0.15)
    assert "Running: 4 reqs, Waiting: 1 reqs, GPU KV cache usage: 50.0%, Prefix cache hit rate: 25.0%" in e0
    agg = next(line for line in lines if "2 Engines Aggregated" in line)
    assert "Running: 6 reqs" in agg and "GPU KV cache usage: 37.5%" in agg
    assert [r.getMessage() for r in caplog.records] == lines


def test_idle_engine_drops_to_debug_after_two_idle_intervals(fleet, caplog):
    writers, _, reader = fleet
    reporter = StatsReporter(reader, Rank0Leader([0]), lines=VllmLogLines(), interval=1)
    flush(writers)
    reporter.tick()
    levels = []
    for _ in range(3):
        flush(writers)
        with caplog.at_level(logging.DEBUG, logger="redis_stats.reporter"):
            caplog.clear()
            reporter.tick()
        levels.append({r.levelno for r in caplog.records if r.getMessage().startswith("Engine 000")})
    assert levels == [{logging.INFO}, {logging.DEBUG}, {logging.DEBUG}]


def test_stale_engine_is_marked_down_not_printed_with_old_numbers(fleet, config, fake_client):
    writers, recorders, reader = fleet
    recorders[1].record(scheduler(running=9, kv=0.99), iteration(generation=5), engine_idx=1)
    flush(writers)
    reporter = StatsReporter(reader, Rank0Leader([0]), lines=VllmLogLines(), interval=1)
    reporter.tick()
    old = (time.time() - config.stale_after - 1) * 1000
    fake_client().zadd(Keys(config.namespace).engines, {"1": old})
    writers[0].flush()
    lines = reporter.tick()
    assert not any(line.startswith("Engine 001: Avg") for line in lines)
    assert any(line.startswith("Engine 001: DOWN, last heartbeat ") for line in lines)
    # The aggregate goes on, over the live engines only.
    assert any(line.startswith("1 Engines Aggregated: ") for line in lines), lines


def test_only_the_leader_logs(fleet):
    writers, _, reader = fleet
    follower = StatsReporter(reader, Rank0Leader([1]), lines=VllmLogLines(), interval=1)
    flush(writers)
    follower.tick()
    flush(writers)
    assert follower.tick() == []


def test_lease_has_one_holder_and_fails_over_after_expiry(fake_client, namespace):
    keys = Keys(namespace)
    a = LeaseLeader(fake_client(), keys, "a", ttl=0.5, start=False)
    b = LeaseLeader(fake_client(), keys, "b", ttl=0.5, start=False)
    assert a.renew() and not b.renew()
    assert a.is_leader() and not b.is_leader()
    first = a.token
    time.sleep(0.6)  # a stops renewing (as if killed): its local validity ended before the key expired
    assert not a.is_leader()
    assert b.renew() and b.is_leader()
    assert b.token > first  # fencing token grows with every new holder
    assert not a.renew()


def test_a_new_holder_gets_a_larger_token_after_redis_went_back_to_an_older_snapshot(fake_client, namespace):
    # Found by the nemesis run (issue 48, SEED=2): Redis restarted from an RDB taken before the
    # last holders took the lease (its counter of tokens older) handed the next holder a token
    # already handed out, smaller than the last holder's.
    keys = Keys(namespace)
    admin = fake_client()
    a = LeaseLeader(fake_client(), keys, "a", ttl=30, start=False)
    b = LeaseLeader(fake_client(), keys, "b", ttl=30, start=False)
    assert a.renew()
    older = admin.get(keys.leader_epoch)  # what the snapshot holds
    a.close()
    assert b.renew()
    last = b.token
    admin.flushdb()  # Redis comes back from the snapshot: the lease as it was before
    admin.set(keys.leader_epoch, older)
    assert a.renew()  # b's lease is gone with the rest
    assert a.token > last


def test_lease_release_hands_over_at_once(fake_client, namespace):
    keys = Keys(namespace)
    a = LeaseLeader(fake_client(), keys, "a", ttl=30, start=False)
    b = LeaseLeader(fake_client(), keys, "b", ttl=30, start=False)
    assert a.renew()
    a.close()
    assert b.renew()


def test_a_count_that_is_not_finite_is_written_inf_and_every_line_still_logs(fleet, caplog):
    """Issue 32: vLLM's line has %d parts; a gauge set to inf (set() takes it) raised
    OverflowError in the reporter's tick, and logging dropped the line with a traceback."""
    writers, recorders, reader = fleet
    reporter = StatsReporter(reader, Rank0Leader([0]), lines=VllmLogLines(), interval=1)
    recorders[0].record(scheduler(running=float("inf"), waiting=float("-inf"), kv=0.5), iteration(prompt=10))
    recorders[1].record(scheduler(running=2, waiting=1, kv=0.25), iteration(generation=10), engine_idx=1)
    flush(writers)
    reporter.tick()
    time.sleep(0.05)
    flush(writers)
    with caplog.at_level(logging.INFO, logger="redis_stats.reporter"):
        lines = reporter.tick()
    assert "Running: inf reqs, Waiting: -inf reqs, GPU KV cache usage: 50.0%" in lines[0]
    assert "Running: 2 reqs, Waiting: 1 reqs, GPU KV cache usage: 25.0%" in lines[1]  # untouched
    assert "2 Engines Aggregated: " in lines[2] and "Running: inf reqs, Waiting: -inf reqs" in lines[2]
    assert [r.getMessage() for r in caplog.records] == lines
