"""The writer's sans-I/O core (accumulator + flush protocol) with no Redis: what each batch
carries, and what an answer from Redis means for the next one."""

import math
import threading

from redis_stats import Catalog
from redis_stats._core.accumulator import Accumulator
from redis_stats._core.protocol import FlushProtocol, FlushResult


def _catalog() -> Catalog:
    cat = Catalog()
    cat.counter("tokens", "tokens", labels=["model"])
    cat.gauge("running", "requests running", labels=["model"])
    cat.histogram("latency", "seconds", labels=["model"], buckets=[0.1, 1.0])
    return cat


def _acc(cat: Catalog) -> Accumulator:
    return Accumulator(cat, max_label_length=64, max_series_per_metric=100)


def _sent(batches) -> dict[str, str]:
    """Series field -> the value text the batches send for it (the last batch's, when several)."""
    out: dict[str, str] = {}
    for b in batches:
        for chunks in b.chunks.values():
            for chunk in chunks:
                out.update(zip(chunk.sent_names.split("\n"), chunk.sent_values.split("\n")))
    return out


def _int_total(batches) -> int:
    """Sum of the integer counter totals the batches leave in Redis (absolute values: the last
    batch that sends a series holds its total)."""
    return sum(int(v) for v in _sent(batches).values())


APPLIED = FlushResult(status=1, server_time_ms=0)
SEEN_BEFORE = FlushResult(status=0, server_time_ms=0)


def test_an_unconfirmed_batch_is_sent_again_unchanged_and_new_updates_wait_for_the_next_number():
    cat = _catalog()
    acc = _acc(cat)
    proto = FlushProtocol(acc)
    child = acc.child(cat.get("tokens"), 0, ("m",), "w1")
    child.inc(3)
    first = proto.next_batches()[0]
    child.inc(4)  # recorded while the first batch waits for its answer
    again = proto.next_batches()[0]
    assert again is first and again.seq == 1 and _int_total([again]) == 3
    proto.confirmed(APPLIED)
    second = proto.next_batches()[0]
    assert second.seq == 2 and _int_total([second]) == 7  # the total: 3, then 4 more
    assert not proto.confirmed(SEEN_BEFORE) and not proto.has_pending()


def test_a_lost_reply_resends_the_specs_and_a_lost_catalogue_resends_everything():
    cat = _catalog()
    acc = _acc(cat)
    proto = FlushProtocol(acc)
    acc.child(cat.get("running"), 0, ("m",), "w1").set(5)
    everything = {"tokens", "running", "latency"}
    assert {s.name for s in proto.next_batches()[0].specs} == everything  # the catalogue, once
    proto.confirmed(APPLIED)
    assert proto.next_batches()[0].specs == []
    proto.confirmed(SEEN_BEFORE)
    acc.requeue_specs([cat.get("tokens")])
    sent = proto.next_batches()[0]
    proto.confirmed(SEEN_BEFORE)  # applied by an earlier attempt whose answer (conflicts) was lost
    assert [s.name for s in sent.specs] == ["tokens"]
    assert [s.name for s in proto.next_batches()[0].specs] == ["tokens"]  # sent again, to hear them
    proto.confirmed(FlushResult(status=3, server_time_ms=0))
    # Redis lacks what it confirmed (it lost its data): the next batch stores the gauge and specs
    # again, and says it carries everything (confirmed 0).
    resent = proto.next_batches()[0]
    assert resent.series() == 1 and {s.name for s in resent.specs} == everything
    assert [f.split("|")[0] for f in _sent([resent])] == ["running"] and resent.chunks[0][0].send_names
    assert resent.confirmed == 0


def test_bad_values_are_dropped_and_counted_never_raised():
    cat = _catalog()
    acc = _acc(cat)
    child = acc.child(cat.get("tokens"), 0, ("m",), "w1")
    for bad in (math.nan, math.inf, -1, "3", None):
        child.inc(bad)
    assert acc.drops["invalid_value"] == 5
    # The series exists from its first use (0, as prometheus_client shows it); nothing was added.
    assert _int_total([FlushProtocol(acc).next_batches()[0]]) == 0


def test_updates_racing_the_takes_are_neither_lost_nor_doubled():
    cat = _catalog()
    acc = _acc(cat)
    proto = FlushProtocol(acc)
    children = [acc.child(cat.get("tokens"), 0, (f"m{i}",), "w1") for i in range(4)]
    per_thread = 20_000

    def record(child):
        for _ in range(per_thread):
            child.inc(1)

    threads = [threading.Thread(target=record, args=(c,)) for c in children]
    for t in threads:
        t.start()
    batches = []
    while any(t.is_alive() for t in threads) or proto.has_pending():
        batches.append(proto.next_batches()[0])
        proto.confirmed(APPLIED)
    assert _int_total(batches) == per_thread * len(children)
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))


def test_shards_have_their_own_numbers_and_batches_and_changes_wait_for_a_busy_shard():
    """K=3: engine e's changes go to shard e % 3; a shard whose batch is unconfirmed keeps it
    (same number), the others get new ones; what it missed meanwhile is owed to its next batch
    (pending, and no closing flag until it is sent)."""
    cat = _catalog()
    acc = Accumulator(cat, max_label_length=64, max_series_per_metric=100, shards=3)
    proto = FlushProtocol(acc)
    kids = [acc.child(cat.get("tokens"), e, ("m",), "w1") for e in range(3)]
    for e, kid in enumerate(kids):
        kid.inc(e + 1)
    first = proto.next_batches([0], always=(0,))
    assert sorted(first) == [0, 1, 2]  # shard 0 always, the others once they have data
    assert {s: sorted(b.chunks) for s, b in first.items()} == {0: [0], 1: [1], 2: [2]}
    assert all(b.seq == 1 and len(b.specs) == 3 for b in first.values())  # each shard stores the catalogue
    proto.confirmed(APPLIED, 0)
    proto.confirmed(APPLIED, 2)  # shard 1's answer is lost
    kids[1].inc(10)
    kids[0].inc(10)
    second = proto.next_batches([0], closing=True, always=(0,))
    assert second[1] is first[1] and second[0].seq == 2 and second[2].seq == 2
    assert 1 in acc.owed and not second[1].closing and second[0].closing  # shard 1 is owed its 10
    for s in (0, 1, 2):
        proto.confirmed(APPLIED, s)
    assert proto.has_pending()  # shard 1's 10
    third = proto.next_batches([0], closing=True, always=(0,))
    assert third[1].seq == 2 and third[1].closing and third[1].chunks[1][0].sent_values == "12"
    for s in third:
        proto.confirmed(APPLIED, s)
    assert not proto.has_pending()


def test_a_writer_removed_by_gc_goes_on_with_exactly_what_redis_did_not_hold():
    """gc folded what Redis held of the writer (the confirmed chunks' texts): the writer takes
    exactly that off each total (an int beyond 2**53, a float sum, a histogram's counts), and its
    new id stores only the rest."""
    cat = _catalog()
    cat.counter("seconds", "float counter", labels=["model"])
    acc = _acc(cat)
    proto = FlushProtocol(acc)
    tokens = acc.child(cat.get("tokens"), 0, ("m",), "w1")
    seconds = acc.child(cat.get("seconds"), 0, ("m",), "w1")
    latency = acc.child(cat.get("latency"), 0, ("m",), "w1")
    tokens.inc(2**60 + 1)
    seconds.inc(0.1)
    latency.observe(0.5)
    proto.next_batches()[0]
    proto.confirmed(APPLIED)  # Redis holds these: what gc will fold
    tokens.inc(5)
    seconds.inc(0.2)
    latency.observe(5.0)
    late = proto.next_batches()[0]
    assert _sent([late])[tokens.field] == str(2**60 + 6)
    proto.confirmed(FlushResult(status=2, server_time_ms=0))
    rest = _sent([proto.next_batches()[0]])
    assert rest[tokens.field] == "5"
    assert rest[seconds.field] == repr((0.1 + 0.2) - 0.1)
    assert rest[latency.field] == "5.0 0 0 1"  # sum, then cumulative counts (<=0.1, <=1, +Inf)
