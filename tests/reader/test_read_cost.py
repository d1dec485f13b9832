"""How a read adds an engine's writers up (docs/architecture.md, "The read path"): reads in threads
and in a forked child show what a reader of their own shows; what a reader keeps between reads
(the meaning of each names field) follows the namespace, not its history; a fleet flushing in
another order is read once per read. (That the bulk read and the line-by-line read agree is
tests/unit/test_read_paths.py.)"""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from redis_stats import RedisCollector, StatsReader, StatsWriter
from redis_stats.keys import Keys
from redis_stats.prometheus.exposition import TextRenderer
from tests.reader.test_bad_data import samples
from tests.reads import series


def _writers(config: Any, catalog: Any, fake_client: Any, engines: list[int]) -> list[StatsWriter]:
    """Two API servers of the same engines recording the same series (the common case)."""
    out = []
    for role, n in (("api0", 3), ("api1", 5)):
        w = StatsWriter(config, catalog, engines=engines, client=fake_client(), start=False, role=role)
        for e in engines:
            w.counter("tokens").labels(engine=e).inc(n + e)
            w.counter("requests").labels(engine=e, reason="stop").inc(n)
            w.gauge("inflight").labels(engine=e).set(n)
            w.gauge("running").labels(engine=e).set(n)
            w.histogram("latency_seconds").labels(engine=e).observe(0.1 * n)
        # The second flush sends the gauges again, stamped in the server's time now known: from
        # then on only what changes is sent.
        assert w.flush() and w.flush()
        out.append(w)
    return out


def test_totals_follow_one_writer_moving_on_and_a_new_series(config, catalog, fake_client):
    engines = [0, 1, 2]
    a, b = _writers(config, catalog, fake_client, engines)
    reader = StatsReader(config, catalog, client=fake_client())
    collector = RedisCollector(reader)

    def both() -> tuple[str, Any]:
        return collector.render_text(), reader.snapshot()

    text, snap = both()
    assert snap.engines[2].counter("tokens") == 3 + 2 + 5 + 2
    text2, snap2 = both()
    assert (samples(text2), series(snap2)) == (samples(text), series(snap))

    # One writer moves on in one engine: the totals move.
    b.counter("tokens").labels(engine=1).inc(100)
    assert b.flush()
    text3, snap3 = both()
    assert snap3.engines[1].counter("tokens") == 3 + 1 + 5 + 1 + 100
    assert 'tokens_total{engine="1"} 110\n' in text3

    # A writer adds a series: its names field changes, and the new series shows.
    a.counter("requests").labels(engine=0, reason="length").inc(1)
    assert a.flush()
    text4, snap4 = both()
    assert snap4.engines[0].counter("requests", "length") == 1
    assert 'requests_total{engine="0",reason="length"} 1\n' in text4
    for w in (a, b):
        w._closed = True


def test_reads_in_threads_and_in_a_forked_child_show_what_a_reader_of_their_own_shows(
    config, catalog, fake_client, monkeypatch
):
    """Threads render and snapshot one reader at once, each read a reply of its own among
    several (writers flushed between them: some chunks changed, some not), switching every
    microsecond: a read never shows another's values. Then a forked child reads too."""
    engines = list(range(8))
    writers = _writers(config, catalog, fake_client, engines)
    reader = StatsReader(config, catalog, client=fake_client())
    replies = []
    for step in range(6):
        for i, w in enumerate(writers):
            for e in engines:
                if (e + step + i) % 3:
                    w.counter("tokens").labels(engine=e).inc(step + 1)
                    w.histogram("latency_seconds").labels(engine=e).observe(0.01 * (step + e))
            assert w.flush()
        replies.append(reader.read())
    expected = []
    for reply in replies:
        own = StatsReader(config, catalog, client=fake_client())
        expected.append((TextRenderer().render(own.decoded(reply)), repr(series(own.decode(reply)))))
    assert len(set(expected)) == len(replies)
    renderer = TextRenderer()
    wrong: list[Any] = []

    def read(k: int, text: bool) -> None:
        if text:
            if renderer.render(reader.decoded(replies[k])) != expected[k][0]:
                wrong.append(("text", k))
        elif repr(series(reader.decode(replies[k]))) != expected[k][1]:
            wrong.append(("snapshot", k))

    def run(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(60):
                read(rnd.randrange(len(replies)), rnd.random() < 0.5)
        except Exception as exc:  # pragma: no cover - a failure
            wrong.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong, wrong[:5]
    if hasattr(os, "fork"):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                read(len(replies) - 1, True)
                read(0, False)
                code = 0 if not wrong else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    for w in writers:
        w._closed = True


def test_what_a_reader_keeps_follows_the_namespace_not_its_history(config, catalog, fake_client):
    """What a names field means (~15 KB for a vLLM chunk) and each engine's render plan (~35 KB)
    are kept between reads: a fleet whose writers restart with new ids every deploy, with new
    label values (a names field no writer holds any more) and engines gc removed, must not leave
    them behind. After 30 deploys a reader holds what a fresh reader of the same store holds."""
    import gc
    import tracemalloc

    keys = Keys(config.namespace)
    client = fake_client()
    reader = StatsReader(config, catalog, client=fake_client())
    collector = RedisCollector(reader)
    from redis_stats.prometheus import exposition

    # Where a reader keeps them: the decoder's caches and groups (by file: nothing of the core is
    # imported here), and the renderer's plans.
    read = Path(exposition.__file__).parents[1] / "_core" / "read"
    traced = [
        tracemalloc.Filter(True, str(f))
        for f in (read / "decoder.py", read / "groups.py", exposition.__file__)
    ]

    def held() -> int:
        gc.collect()
        return sum(t.size for t in tracemalloc.take_snapshot().filter_traces(traced).traces)

    def deploy(k: int) -> None:
        engines = [4 * k + e for e in range(4)]
        for old in range(4 * k - 4, 4 * k):  # gc removed the engines of the deploy before
            client.zrem(keys.engines, str(old))
            client.delete(keys.counters(old))
        w = StatsWriter(config, catalog, engines=engines, client=fake_client(), start=False)
        for e in engines:
            w.counter("requests").labels(engine=e, reason=f"r{k}").inc(e + 1)
            w.histogram("latency_seconds").labels(engine=e).observe(0.1 * k)
        assert w.flush()
        w._closed = True

    tracemalloc.start()
    try:
        for k in range(30):
            deploy(k)
            text = collector.render_text()
            snap = reader.snapshot()
        assert snap.engines[119].counter("requests", "r29") == 120 and 'reason="r28"' not in text
        del text, snap  # what the reads returned: the caller's, not the reader's
        ours = held()
        fresh = StatsReader(config, catalog, client=fake_client())
        fresh_collector = RedisCollector(fresh)
        fresh_collector.render_text()
        fresh.snapshot()
        both = held()
    finally:
        tracemalloc.stop()
    assert ours < 2 * (both - ours), (ours, both - ours)


@pytest.mark.parametrize("feed", ["snapshot", "load"])
def test_a_fleet_flushing_in_another_order_is_read_once_per_read(config, catalog, fake_client, feed):
    """The engines and writers lists come ordered by heartbeat, which a live fleet reorders with
    every flush: a read planned from the last one's lists must not take the new order for new
    engines or writers and read again (it did: two or three reads each, a /load refresh of a
    2,048-writer fleet 40 -> 560 ms of the exporter's CPU)."""
    import time

    writers = [
        StatsWriter(config, catalog, engines=[e], client=fake_client(), start=False, role=f"api{e}")
        for e in range(3)
    ]
    reader = StatsReader(config, catalog, client=fake_client())
    made = []
    real = reader._transaction
    reader._transaction = lambda cmds: made.append(len(cmds)) or real(cmds)  # type: ignore[method-assign]
    read = reader.read if feed == "snapshot" else reader.load

    def flush_in(order: list[int]) -> None:
        for e in order:
            writers[e].counter("tokens").labels(engine=e).inc(1)
            assert writers[e].flush()
            time.sleep(0.003)  # a heartbeat later than the one before

    flush_in([0, 1, 2])
    read()  # the first read plans (twice: it knew no engine)
    made.clear()
    for order in ([2, 1, 0], [1, 0, 2], [0, 2, 1]):
        flush_in(order)
        got = read()
        assert len(made) == 1, f"{feed} read {len(made)} times after flushes in the order {order}"
        made.clear()
    engines = got.engines if feed == "load" else reader.decode(got).engines
    assert sorted(engines) == [0, 1, 2]
