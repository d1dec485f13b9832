"""Against a private real redis-server: several processes, exactly once through a cutting proxy,
and a server that stops and comes back."""

import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.tools.embedded import free_port
from tests.conftest import PYTHON, ROOT, sample_catalog
from tests.proxy import CuttingProxy

pytestmark = pytest.mark.redis_server

N = 10_000


def test_four_writer_processes_totals_exact_and_fifth_process_metrics_lists_every_engine(
    core_server, namespace, python_env
):
    layout = ["0,1", "2,3", "0,2", "1,3"]  # 4 processes x 2 engines, engines shared by writers
    procs = [
        subprocess.Popen(
            [PYTHON, "-m", "tests.helpers.writer_proc", core_server.url, namespace, engines, str(N)],
            cwd=ROOT,
            env=python_env,
        )
        for engines in layout
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]

    port = free_port()
    reader = subprocess.Popen(
        [PYTHON, "-m", "tests.helpers.reader_proc", core_server.url, namespace, str(port)],
        cwd=ROOT,
        env=python_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "ready"
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        reader.stdin.close()
        reader.wait(timeout=10)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    writers_per_engine = {e: sum(str(e) in lay.split(",") for lay in layout) for e in range(4)}
    tokens = {s.labels["engine"]: s.value for s in fams["tokens"].samples}
    assert tokens == {str(e): float(N * k) for e, k in writers_per_engine.items()}
    requests = {s.labels["engine"]: s.value for s in fams["requests"].samples}
    assert requests == tokens
    counts = {
        s.labels["engine"]: s.value
        for s in fams["latency_seconds"].samples
        if s.name == "latency_seconds_count"
    }
    assert counts == tokens
    # Every writer closed cleanly when its process exited: the engines are down at once (not
    # stale_after later), their totals still exact.
    up = {s.labels["engine"]: s.value for s in fams["redis_stats_engine_up"].samples}
    assert up == {"0": 0.0, "1": 0.0, "2": 0.0, "3": 0.0}


def test_exactly_once_over_a_thousand_flushes_with_cut_replies(core_server, namespace):
    proxy = CuttingProxy(core_server.port, seed=7)
    cfg = StatsConfig(url=proxy.url, namespace=namespace, socket_timeout_ms=2000)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0], start=False)
    tokens = writer.counter("tokens").labels(engine=0)
    hist = writer.histogram("latency_seconds").labels(engine=1)
    try:
        proxy.cut_probability = 0.2
        for i in range(1000):
            tokens.inc(i % 7 + 1)
            hist.observe(0.3)
            writer.flush()
        proxy.cut_probability = 0.0
        deadline = time.monotonic() + 10
        while writer.pending() and time.monotonic() < deadline:
            writer.flush()
    finally:
        proxy.close()
    assert not writer.pending()
    assert proxy.cuts > 100
    assert writer.stats.duplicates > 50  # replies were lost after Redis applied the batch
    snap = StatsReader(StatsConfig(url=core_server.url, namespace=namespace), sample_catalog()).snapshot()
    assert snap.engines[0].counter("tokens") == sum(i % 7 + 1 for i in range(1000))
    h = snap.engines[1].histogram("latency_seconds")
    assert h.count == 1000
    assert h.sum == pytest.approx(300.0)


def test_server_down_then_back_record_never_blocks_and_totals_are_exact(own_core_server, namespace):
    server = own_core_server
    cfg = StatsConfig(
        url=server.url,
        namespace=namespace,
        flush_interval=0.05,
        connect_timeout_ms=200,
        socket_timeout_ms=200,
    )
    writer = StatsWriter(cfg, sample_catalog(), engines=[0])
    tokens = writer.counter("tokens").labels(engine=0)
    worst = 0.0
    sent = 0

    def record(n: int) -> None:
        nonlocal worst, sent
        for _ in range(n):
            t0 = time.perf_counter()
            tokens.inc()
            worst = max(worst, time.perf_counter() - t0)
            sent += 1

    record(1000)
    time.sleep(0.3)
    server.stop(keep_data=True)
    stop = time.monotonic() + 2.0
    while time.monotonic() < stop:  # Redis is down for 2 s while the flusher keeps failing
        record(500)
        time.sleep(0.01)
    assert sum(writer.stats.errors.values()) > 0
    server.start()
    deadline = time.monotonic() + 10
    while writer.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writer.close()
    # A call that waited on the network could take the 200 ms timeouts; scheduler noise on a
    # loaded machine stays well below 150 ms (the calls' own figures: bench/core.py).
    assert worst < 0.15, f"a record call took {worst * 1000:.1f} ms during the outage"
    snap = StatsReader(StatsConfig(url=server.url, namespace=namespace), sample_catalog()).snapshot()
    assert snap.engines[0].counter("tokens") == sent


def test_writer_starts_before_redis_exists(namespace):
    port = free_port()
    cfg = StatsConfig(
        url=f"redis://127.0.0.1:{port}/0", namespace=namespace, flush_interval=0.05, connect_timeout_ms=100
    )
    writer = StatsWriter(cfg, sample_catalog(), engines=[0])
    writer.counter("tokens").labels(engine=0).inc(3)
    from redis_stats.tools.embedded import EmbeddedRedis

    time.sleep(0.2)
    with EmbeddedRedis(port=port) as server:
        deadline = time.monotonic() + 10
        while writer.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert writer.close()
        snap = StatsReader(StatsConfig(url=server.url, namespace=namespace), sample_catalog()).snapshot()
        assert snap.engines[0].counter("tokens") == 3


def test_scraper_never_sees_a_torn_histogram(core_server, namespace):
    cfg = StatsConfig(url=core_server.url, namespace=namespace, flush_interval=0.01)
    writers = [StatsWriter(cfg, sample_catalog(), engines=[0]) for _ in range(3)]
    stop = threading.Event()

    def load(w):
        h = w.histogram("latency_seconds").labels(engine=0)
        while not stop.is_set():
            for v in (0.05, 0.3, 0.7, 2, 9):
                h.observe(v)
            time.sleep(0.0005)

    threads = [threading.Thread(target=load, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    reader = StatsReader(cfg, sample_catalog())
    torn = checked = 0
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            h = reader.snapshot().engines.get(0)
            h = h and h.histogram("latency_seconds")
            if h is None:
                continue
            checked += 1
            # Every bucket holds one distinct value, so the sum is fixed by the bucket counts: a
            # read that saw part of a flush would break this equation.
            per_bucket = [b - a for a, b in zip((0.0, *h.cumulative[:-1]), h.cumulative)]
            expected_sum = sum(n * v for n, v in zip(per_bucket, (0.05, 0.3, 0.7, 2, 9)))
            torn += h.sum != pytest.approx(expected_sum, rel=1e-9)
    finally:
        stop.set()
        for t in threads:
            t.join()
        for w in writers:
            w.close()
    assert checked > 20
    assert torn == 0
