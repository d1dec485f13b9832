"""The writer's sans-I/O core (accumulator + flush protocol) with no Redis: what each batch
carries, and what an answer from Redis means for the next one."""

import math
import threading

from redis_stats import Catalog
from redis_stats._core.write.accumulator import Accumulator
from redis_stats._core.write.protocol import CALL_WORDS, FlushProtocol, FlushResult
from redis_stats.keys import Keys


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


def _words(batch) -> int:
    """The words of *batch*'s flush call (EVALSHA, SHA, key count, keys, arguments), with no
    claims, self-metrics or load entries."""
    keys = Keys("ns")
    return 3 + len(batch.script_keys(keys, "w1")) + len(batch.script_args(keys.prefix, "w1"))


def _stored(batches) -> dict[tuple[int, str], str]:
    """(engine, series field) -> the value text the batches leave in Redis."""
    out: dict[tuple[int, str], str] = {}
    for b in batches:
        for engine, chunks in b.chunks.items():
            for chunk in chunks:
                out.update(
                    ((engine, f), v)
                    for f, v in zip(chunk.sent_names.split("\n"), chunk.sent_values.split("\n"))
                )
    return out


def _parts(proto, room: int, engines=()):
    """Every batch one flush round sends shard 0 at *room* words: the first, then each next
    part once the one before is confirmed (applied)."""
    batch = proto.next_batches(engines, room={0: room})[0]
    out = [batch]
    while proto.confirmed(APPLIED):
        out.append(proto.next_parts([0], {0: room})[0])
    return out


def test_a_batch_bigger_than_one_call_is_sent_in_parts_each_its_own_exactly_once_batch():
    """More changes than a call's room: each part within it, its own number, the next one made
    only once the one before is confirmed (and carrying that number as confirmed); every series
    in exactly one part; an engine cut in two sends its lowest chunks first (so the store holds
    every chunk below the last one confirmed)."""
    cat = _catalog()
    acc = Accumulator(cat, max_label_length=64, max_series_per_metric=10_000)
    proto = FlushProtocol(acc)
    kids = [acc.child(cat.get("tokens"), e, (f"m{i}",), "w1") for e in range(40) for i in range(300)]
    for n, kid in enumerate(kids):
        kid.inc(n + 1)
    room = 100
    parts = _parts(proto, room)
    assert len(parts) > 5
    assert all(_words(p) <= CALL_WORDS + room for p in parts)
    assert [p.seq for p in parts] == list(range(1, len(parts) + 1))
    assert parts[0].confirmed == 0 and [p.confirmed for p in parts[1:]] == [p.seq for p in parts[:-1]]
    assert [p.cut for p in parts] == [True] * (len(parts) - 1) + [False]
    assert {s.name for s in parts[0].specs} == {"tokens", "running", "latency"}
    assert not any(p.specs for p in parts[1:])
    sent = [(e, c.index) for p in parts for e, chunks in p.chunks.items() for c in chunks]
    assert len(sent) == len(set(sent)) == 40 * 5  # 300 series: 5 chunks an engine, each once
    for e in range(40):
        assert [i for engine, i in sent if engine == e] == list(range(5))
    assert sum(int(v) for v in _stored(parts).values()) == sum(range(1, len(kids) + 1))
    assert not proto.has_pending()


def test_a_part_not_confirmed_keeps_the_rest_waiting_and_a_store_found_behind_gets_everything():
    cat = _catalog()
    acc = Accumulator(cat, max_label_length=64, max_series_per_metric=10_000)
    proto = FlushProtocol(acc)
    kids = [acc.child(cat.get("tokens"), e, (f"m{i}",), "w1") for e in range(20) for i in range(64)]
    for kid in kids:
        kid.inc(1)
    first = proto.next_batches(room={0: 60})[0]
    assert first.cut and proto.confirmed(APPLIED)
    second = proto.next_parts([0], {0: 60})[0]
    # Its answer is lost: the same part goes again (same number, same contents), nothing else.
    assert proto.next_batches(room={0: 60})[0] is second
    assert proto.has_pending()
    proto.confirmed(FlushResult(status=3, server_time_ms=0))  # the store lost everything
    assert proto.has_pending()
    resent = _parts(proto, 60)
    assert resent[0].confirmed == 0 and resent[0].specs and len(resent) > 1
    stored = _stored(resent)
    assert len(stored) == len(kids) and set(stored.values()) == {"1"}
    assert not proto.has_pending()


def test_specs_go_before_every_series_when_they_do_not_fit_in_one_call():
    """A catalogue bigger than the room: the first parts carry only specs, the series come
    once every spec went (a series never reaches Redis before its metric's spec)."""
    cat = Catalog()
    for i in range(100):
        cat.counter(f"c{i}", "c")
    acc = _acc(cat)
    proto = FlushProtocol(acc)
    acc.child(cat.get("c7"), 0, (), "w1").inc(2)
    parts = _parts(proto, 60)
    assert [len(p.specs) for p in parts] == [30, 30, 30, 10]
    assert [bool(p.chunks) for p in parts] == [False, False, False, True]
    assert {s.name for p in parts for s in p.specs} == {f"c{i}" for i in range(100)}


def test_checks_beyond_the_room_are_made_in_turn():
    """A writer holding chunks in more idle engines than one call can check: each call checks
    as many as fit, the next ones the next, so every engine is checked within a few flushes."""
    cat = _catalog()
    acc = _acc(cat)
    proto = FlushProtocol(acc)
    for e in range(100):
        acc.child(cat.get("tokens"), e, ("m",), "w1").inc(1)
    _parts(proto, 10_000)
    checked = []
    for _ in range(4):
        batch = proto.next_batches(room={0: 160})[0]
        assert not batch.chunks and len(batch.checks) == 40 and _words(batch) <= CALL_WORDS + 160
        checked += batch.checks
        proto.confirmed(APPLIED)
    assert set(checked) == set(range(100))
