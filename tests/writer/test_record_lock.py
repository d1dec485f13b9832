"""The flusher holds the record lock only to swap the pending set out, never while it encodes.

Record calls must not wait while a batch of many series is built, and no update may be lost or
counted twice when records race the swap.
"""

from __future__ import annotations

import threading

from redis_stats import Catalog
from redis_stats._core.accumulator import Accumulator, Batch, FlushProtocol


def _catalog() -> Catalog:
    cat = Catalog()
    cat.counter("c", "c", labels=["i"])
    cat.counter("f", "float counter")
    cat.gauge("g", "g", mode="sum")
    cat.histogram("h", "h", buckets=[1.0, 2.0])
    return cat


def _acc(cat: Catalog) -> Accumulator:
    return Accumulator(cat, max_label_length=100, max_series_per_metric=100_000)


def test_a_record_call_completes_while_the_flusher_builds_a_batch(monkeypatch):
    cat = _catalog()
    acc = _acc(cat)
    children = [acc.child(cat["c"], 0, (str(i),), "w") for i in range(1000)]
    for c in children:
        c.inc()
    finished: list[bool] = []
    racer = threading.Thread(target=lambda: (children[0].inc(10), children[5].inc(1)))
    original = Batch.add_delta

    def add_delta(self, engine, field_name, delta):
        if not finished:  # while the batch is being built, another thread records
            racer.start()
            racer.join(2.0)
            finished.append(not racer.is_alive())
        original(self, engine, field_name, delta)

    monkeypatch.setattr(Batch, "add_delta", add_delta)
    first = acc.take_batch(1)
    racer.join()
    assert finished == [True], "a record call waited for the whole batch to be built"
    second = acc.take_batch(2)
    monkeypatch.setattr(Batch, "add_delta", original)
    # The racing updates are in exactly one of the two batches, never both, never neither.
    sent = {}
    for batch in (first, second):
        ints = batch.engines[0].ints
        for name, value in zip(ints[::2], ints[1::2]):
            sent[name] = sent.get(name, 0) + int(value)
    assert sent[children[0].field] == 11 and sent[children[5].field] == 2
    assert sum(sent.values()) == 1000 + 11


def test_threads_hammering_every_kind_while_batches_are_taken_exact_totals():
    cat = _catalog()
    acc = _acc(cat)
    protocol = FlushProtocol(acc)
    n_threads, n = 4, 20_000
    counters = [acc.child(cat["c"], 0, (str(i),), "w") for i in range(50)]
    fcounter = acc.child(cat["f"], 0, (), "w")
    gauge = acc.child(cat["g"], 0, (), "w")
    hist = acc.child(cat["h"], 0, (), "w")
    stop = threading.Event()
    totals: dict[str, float] = {}
    hist_counts = [0, 0, 0]
    hist_sum = [0.0]
    last_gauge: list[str] = []

    def collect() -> None:
        batch = protocol.next_batch([0])
        protocol.in_flight = None  # "confirmed"
        for block in batch.engines.values():
            for name, value in zip(block.ints[::2], block.ints[1::2]):
                totals[name] = totals.get(name, 0) + int(value)
            for name, value in zip(block.floats[::2], block.floats[1::2]):
                totals[name] = totals.get(name, 0.0) + float(value)
            if block.gauges:
                last_gauge[:] = [block.gauges[1]]
            for i in range(0, len(block.hists), 3):
                hist_sum[0] += float(block.hists[i + 1])
                for j, c in enumerate(block.hists[i + 2]):  # the batch's per-bucket increases
                    hist_counts[j] += int(c)

    def flusher() -> None:
        while not stop.is_set():
            collect()

    def record(k: int) -> None:
        for i in range(n):
            counters[(i + k) % len(counters)].inc(1)
            fcounter.inc(0.5)
            gauge.inc(1)
            gauge.dec(1) if i % 2 else None
            hist.observe((0.5, 1.5, 3.0)[i % 3])

    f = threading.Thread(target=flusher)
    f.start()
    workers = [threading.Thread(target=record, args=(k,)) for k in range(n_threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    f.join()
    collect()  # what was recorded after the flusher's last take
    assert sum(totals[c.field] for c in counters) == n_threads * n
    assert totals[fcounter.field] == n_threads * n * 0.5
    per_bucket = [len(range(j, n, 3)) * n_threads for j in range(3)]
    assert hist_counts == per_bucket
    assert hist_sum[0] == sum(v * c for v, c in zip((0.5, 1.5, 3.0), per_bucket))
    assert float(last_gauge[0].split("|")[1]) == n_threads * (n - n // 2)


def test_sliced_packer_sends_the_bytes_redis_py_would():
    from redis.connection import HiredisRespSerializer

    from redis_stats.writer import _SlicedPacker

    big = ("EVALSHA", "f" * 40, 6, *(f"k{i}" for i in range(6)), *(f"v{i}é" for i in range(10_000)), 1.5, 7)
    for args in (big, ("SCRIPT LOAD", "return 1"), (b"SCRIPT LOAD", bytearray(b"x")), ("PING",)):
        sliced = b"".join(bytes(c) for c in _SlicedPacker().pack(*args))
        assert sliced == b"".join(HiredisRespSerializer().pack(*args))


def test_a_flush_of_many_series_in_slices_is_exact(redis_server, namespace):
    from redis_stats import StatsConfig, StatsReader, StatsWriter

    cat = _catalog()
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, max_series_per_metric=10_000)
    writer = StatsWriter(cfg, cat, engines=[0], start=False)
    for i in range(5000):  # ~20,000 arguments: several slices
        writer.counter("c").labels(engine=0, i=str(i)).inc(i)
    assert writer.flush()
    writer.close()
    snap = StatsReader(cfg, cat).snapshot()
    assert sum(snap.engines[0].counters.values()) == sum(range(5000))
