"""What a flush allocates in its host (issue 28): no GC-tracked object per series.

CPython's cyclic collector runs a full collection of the host's whole heap once enough objects
have survived its young collections since the last one; in a host with millions of objects (a
vLLM API server) that is a pause of tens to hundreds of milliseconds, in whichever thread
allocates next. A writer whose take kept one tuple per changed series until Redis confirmed the
batch pushed its host into a full collection every few flushes at 100,000 series. These tests
count what a take and its confirmation leave for the collector to see, at two sizes: it must not
grow with the number of series. Each count runs in a fresh interpreter (`_fresh`): the collector's
counters are the process' own, and a test run leaves threads behind that allocate too.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis_stats import Catalog
from redis_stats._core.write.accumulator import Accumulator
from redis_stats._core.write.protocol import FlushProtocol, FlushResult
from redis_stats._core.write.series import HistogramChild
from tests.conftest import ROOT

APPLIED = FlushResult(status=1, server_time_ms=0)


def _catalog() -> Catalog:
    cat = Catalog()
    cat.counter("tokens", "tokens", labels=["route"])
    cat.counter("seconds", "float counter", labels=["route"])
    cat.gauge("running", "requests running", labels=["route"])
    cat.histogram("latency", "seconds", labels=["route"], buckets=[0.1, 1.0, 10.0])
    return cat


def _writer(n: int) -> tuple[FlushProtocol, Callable[[], None]]:
    """A protocol over *n* series per kind in two engines, in its steady state, and a function
    that changes every one of them."""
    cat = _catalog()
    acc = Accumulator(cat, max_label_length=64, max_series_per_metric=n + 1)
    series = [
        (acc.child(cat[name], engine, (f"/route/{i}",), "w"), name)
        for engine in (0, 1)
        for name in ("tokens", "seconds", "running", "latency")
        for i in range(n // 2)
    ]

    def change_all() -> None:
        for child, name in series:
            if name == "tokens":
                child.inc(3)
            elif name == "seconds":
                child.inc(0.25)
            elif name == "running":
                child.set(7)
            else:
                child.observe(0.5)

    proto = FlushProtocol(acc)
    change_all()
    # The steady state: the catalogue and names stored, and the gauges sent again once stamped in
    # the server's time (known from the first answer on).
    for _ in range(2):
        proto.next_batches([0, 1])[0]
        proto.confirmed(APPLIED)
    return proto, change_all


@contextmanager
def _young_collections_counted() -> Iterator[list[int]]:
    """Counts the objects that live through a young collection inside the block.

    Young collections run every 100 net new objects and older ones never, so each survivor stays
    in generation 1: its growth over a young collection is what that collection promoted (objects
    that are freed before the next one, as most temporaries are, are never seen).
    """
    promoted = [0]
    before = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 0:
            if phase == "start":
                before[0] = len(gc.get_objects(generation=1))
            else:
                promoted[0] += len(gc.get_objects(generation=1)) - before[0]

    old = gc.get_threshold()
    gc.collect()
    gc.set_threshold(100, 10**9, 10**9)
    gc.callbacks.append(count)
    try:
        yield promoted
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*old)
        gc.collect()


def _fresh(name: str, *args: Any) -> Any:
    """``name(*args)`` of this module, run in a new interpreter (no other thread allocating)."""
    imported = f"from tests.unit.test_flush_allocations import {name}"
    code = f"import json; {imported}; print(json.dumps({name}(*{args!r})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def flush_survivors(n: int) -> int:
    """Objects that live through a young collection during a flush of every series of _writer(n)."""
    proto, change_all = _writer(n)
    change_all()
    with _young_collections_counted() as promoted:
        batch = proto.next_batches([0, 1])[0]
        proto.confirmed(APPLIED)
    assert batch.series() == 8 * (n // 2)  # every series changed and went with the batch
    return promoted[0]


def held_until_answered(n: int) -> list[int]:
    """Tracked objects a batch of every series made and holds while it waits for its answer
    (counted one by one: also those that replaced objects of the previous batch), the net count
    of new tracked objects then, and after the answer."""
    proto, change_all = _writer(n)
    change_all()
    gc.collect()
    gc.disable()
    try:
        old = gc.get_objects()  # held: no id of theirs is reused meanwhile
        known = {id(o) for o in old}
        before = gc.get_count()[0]
        batch = proto.next_batches([0, 1])[0]
        held = gc.get_count()[0] - before  # net new tracked objects: kept until the answer
        made = sum(1 for o in gc.get_objects() if id(o) not in known) - 2  # old, known
        proto.confirmed(APPLIED)
        after = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert batch.series() == 8 * (n // 2)
    return [made, held, after]


def heartbeat_survivors(n: int) -> int:
    """As flush_survivors, for a flush in which no series changed."""
    proto, _change_all = _writer(n)
    with _young_collections_counted() as promoted:
        batch = proto.next_batches([0, 1])[0]
        proto.confirmed(APPLIED)
    assert batch.series() == 0 and not batch.chunks and sorted(batch.engines) == [0, 1]
    return promoted[0]


def record_growth() -> int:
    """Net new tracked objects over 50 x 800 record calls on bound series (every kind)."""
    _proto, change_all = _writer(200)
    change_all()  # every series on the dirty list already: what follows is the steady state
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for _ in range(50):
            change_all()
        return int(gc.get_count()[0] - before)
    finally:
        gc.enable()


def test_a_flush_of_many_changed_series_leaves_the_collector_nothing_per_series():
    small, large = _fresh("flush_survivors", 200), _fresh("flush_survivors", 4_000)
    # A few containers per shard and engine (the chunk lists of the batch), whatever the size.
    assert large < 200 and large - small < 100, (small, large)


def test_a_batch_waiting_for_its_answer_holds_no_object_per_series():
    small, large = _fresh("held_until_answered", 200), _fresh("held_until_answered", 4_000)
    assert large[0] < 100 and large[0] - small[0] < 50, (small, large)  # made and still alive
    assert large[1] < 100 and large[1] - small[1] < 50, (small, large)  # net
    assert large[2] <= large[1] + 5


def test_a_heartbeat_flush_of_unchanged_series_allocates_nothing_per_series():
    for n in (200, 4_000):
        assert _fresh("heartbeat_survivors", n) < 20


def test_record_calls_leave_the_collector_nothing():
    """The record path (the host's own threads) keeps no new tracked object per call: deltas
    and pending buckets change in place, a gauge's (stamp, value) pair replaces the last one."""
    assert _fresh("record_growth") < 10


def first_flush_made(n: int) -> list[int]:
    """Tracked objects the first take (and its answer) of _writer(n)'s series makes, all new (their
    place in the totals made then), and the number of series: issue 32."""
    cat = _catalog()
    acc = Accumulator(cat, max_label_length=64, max_series_per_metric=n + 1)
    series = [
        acc.child(cat[name], engine, (f"/route/{i}",), "w")
        for engine in (0, 1)
        for name in ("tokens", "running", "latency")
        for i in range(n // 2)
    ]
    for child in series:
        if isinstance(child, HistogramChild):
            child.observe(0.5)
        else:
            child.inc(2)
    proto = FlushProtocol(acc)
    gc.collect()
    gc.disable()
    try:
        known = {id(o) for o in gc.get_objects()}
        batch = proto.next_batches([0, 1])[0]
        proto.confirmed(APPLIED)
        made = sum(1 for o in gc.get_objects() if id(o) not in known)
    finally:
        gc.enable()
    assert batch.series() == len(series)
    return [made, len(series)]


def test_the_first_flush_of_many_new_series_makes_no_object_per_series():
    """The first flush of 100,000 new series made one tracked object per series (its place in the
    totals), which started a full collection of the host's heap (bench/host_gc.py --first: 130 ms
    with the GIL held, the worst inc() 125 ms against 3 ms without a flusher). Now a few per chunk
    of 64 series remain (the chunk, its list of series)."""
    small, large = _fresh("first_flush_made", 200), _fresh("first_flush_made", 4_000)
    chunks = large[1] / 64
    assert large[0] < 4 * chunks + 100 and large[0] < large[1] / 10, (small, large)
