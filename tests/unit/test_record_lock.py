"""The flusher holds the record lock only to swap the pending set out, never while it encodes.

Record calls must not wait while a batch of many series is built, and no update may be lost or
counted twice when records race the swap.
"""

from __future__ import annotations

import threading

from redis_stats import Catalog
from redis_stats._core.write.accumulator import Accumulator
from redis_stats._core.write.chunks import Total
from redis_stats._core.write.protocol import Batch, FlushProtocol, FlushResult
from tests.conftest import four_kinds_catalog

APPLIED = FlushResult(status=1, server_time_ms=0)


def _acc(cat: Catalog) -> Accumulator:
    return Accumulator(cat, max_label_length=100, max_series_per_metric=100_000)


def _sent(batch: Batch) -> dict[str, str]:
    """Total field -> the value text *batch* sends for it (the writer's absolute total)."""
    out: dict[str, str] = {}
    for chunks in batch.chunks.values():
        for chunk in chunks:
            out.update(zip(chunk.sent_names.split("\n"), chunk.sent_values.split("\n")))
    return out


def test_a_record_call_completes_while_the_flusher_builds_a_batch(monkeypatch):
    cat = four_kinds_catalog()
    acc = _acc(cat)
    children = [acc.child(cat["c"], 0, (str(i),), "w") for i in range(1000)]
    for c in children:
        c.inc()
    finished: list[bool] = []
    racer = threading.Thread(target=lambda: (children[0].inc(10), children[5].inc(1)))
    original = Total.add_total

    def add(self, delta):
        if not finished:  # while the batch is being built, another thread records
            racer.start()
            racer.join(2.0)
            finished.append(not racer.is_alive())
        original(self, delta)

    monkeypatch.setattr(Total, "add_total", add)
    first = acc.take_shards({0: 1})[0]
    racer.join()
    assert finished == [True], "a record call waited for the whole batch to be built"
    stored = _sent(first)  # what Redis holds once it is applied (each series' absolute total)
    assert stored[children[0].field] == "1" and stored[children[5].field] == "1"
    second = acc.take_shards({0: 2})[0]
    monkeypatch.setattr(Total, "add_total", original)
    # The racing updates are in exactly one of the two batches, never both, never neither: the
    # second one sends the totals they made.
    stored.update(_sent(second))
    assert stored[children[0].field] == "11" and stored[children[5].field] == "2"
    assert sum(int(v) for v in stored.values()) == 1000 + 11


def test_threads_hammering_every_kind_while_batches_are_taken_exact_totals():
    cat = four_kinds_catalog()
    acc = _acc(cat)
    protocol = FlushProtocol(acc)
    n_threads, n = 4, 20_000
    counters = [acc.child(cat["c"], 0, (str(i),), "w") for i in range(50)]
    fcounter = acc.child(cat["f"], 0, (), "w")
    gauge = acc.child(cat["g"], 0, (), "w")
    hist = acc.child(cat["h"], 0, (), "w")
    stop = threading.Event()
    stored: dict[str, str] = {}  # what Redis would hold: each batch's absolute texts

    def collect() -> None:
        batch = protocol.next_batches([0])[0]
        protocol.confirmed(APPLIED)
        stored.update(_sent(batch))

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
    assert sum(int(stored[c.field]) for c in counters) == n_threads * n
    assert float(stored[fcounter.field]) == n_threads * n * 0.5
    per_bucket = [len(range(j, n, 3)) * n_threads for j in range(3)]
    hist_sum, *cumulative = stored[hist.field].split(" ")  # stored cumulative
    assert [int(c) for c in cumulative] == [sum(per_bucket[: j + 1]) for j in range(3)]
    assert float(hist_sum) == sum(v * c for v, c in zip((0.5, 1.5, 3.0), per_bucket))
    assert float(stored[gauge.field].split("|")[1]) == n_threads * (n - n // 2)
