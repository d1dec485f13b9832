"""One library's side of bench/peers.py, run in that library's own virtualenv.

    python bench/peer_worker.py LIB TASK URL [ENGINES]

LIB: redis_stats | prometheus_client | prometheus_client_mp | pytheus | prometheus_redis_client
TASK: record (cost of one engine step, Redis commands and round trips per step),
      scrape (populate ENGINES engines of the synthetic 40-series set, then time the exposition),
      scrape_busy (the same, every series changed before each timed scrape, as a busy fleet's:
      issue 33; PEER_BUCKETS=20 for histograms of 20 buckets),
      down (one update with Redis refusing connections, and with Redis hung).
Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0]
if os.environ.get("PEER_BUCKETS") == "20":  # 19 bounds and +Inf (issue 33's busy comparison)
    BUCKETS = [0.001 * 2**i for i in range(19)]
N_COUNTERS, N_GAUGES, N_HISTS = 20, 16, 4
LIB, TASK, URL = sys.argv[1], sys.argv[2], sys.argv[3]
ENGINES = int(sys.argv[4]) if len(sys.argv) > 4 else 1
HOST, PORT = urlsplit(URL).hostname, urlsplit(URL).port


class RoundTrips:
    """Counts writes to Redis sockets made through redis-py (each is one round trip here)."""

    count = 0

    @classmethod
    def install(cls) -> None:
        try:
            from redis.connection import AbstractConnection as Conn
        except ImportError:
            from redis.connection import Connection as Conn
        original = Conn.send_packed_command

        def counted(self, *args, **kwargs):
            cls.count += 1
            return original(self, *args, **kwargs)

        Conn.send_packed_command = counted


class Lib:
    """Uniform face of each library: counters, gauges, histograms with an engine label."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.counters: list = []
        self.gauges: list = []
        self.hists: list = []

    def bind(self, engine: int) -> tuple[list, list, list]:
        raise NotImplementedError

    def scrape(self) -> str:
        raise NotImplementedError

    def flush(self) -> None:
        """Make recorded data visible to a scrape (only redis_stats batches)."""


class RedisStats(Lib):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        from redis_stats import Catalog, RedisCollector, StatsConfig, StatsReader, StatsWriter

        cat = Catalog()
        for i in range(N_COUNTERS):
            cat.counter(f"counter_{i}", "c")
        for i in range(N_GAUGES):
            cat.gauge(f"gauge_{i}", "g")
        for i in range(N_HISTS):
            cat.histogram(f"hist_{i}", "h", buckets=BUCKETS)
        cfg = StatsConfig(url=url, namespace="bench", flush_interval=1.0)
        self.writer = StatsWriter(cfg, cat, start=False)
        self.collector = RedisCollector(StatsReader(cfg, cat))

    def bind(self, engine):
        w = self.writer
        return (
            [w.counter(f"counter_{i}").labels(engine=engine).inc for i in range(N_COUNTERS)],
            [w.gauge(f"gauge_{i}").labels(engine=engine).set for i in range(N_GAUGES)],
            [w.histogram(f"hist_{i}").labels(engine=engine).observe for i in range(N_HISTS)],
        )

    def flush(self):
        assert self.writer.flush()

    def scrape(self):
        return self.collector.render_text()


class PromClient(Lib):
    def __init__(self, url: str, multiprocess: bool = False) -> None:
        super().__init__(url)
        import prometheus_client as pc

        self.pc = pc
        self.multiprocess = multiprocess
        self.registry = pc.CollectorRegistry()
        reg = None if multiprocess else self.registry
        kw = {"registry": reg} if reg is not None else {"registry": None}
        gauge_kw = {"multiprocess_mode": "mostrecent"} if multiprocess else {}
        self.c = [pc.Counter(f"counter_{i}", "c", ["engine"], **kw) for i in range(N_COUNTERS)]
        self.g = [pc.Gauge(f"gauge_{i}", "g", ["engine"], **kw, **gauge_kw) for i in range(N_GAUGES)]
        self.h = [pc.Histogram(f"hist_{i}", "h", ["engine"], buckets=BUCKETS, **kw) for i in range(N_HISTS)]
        if multiprocess:
            from prometheus_client import multiprocess as mp

            mp.MultiProcessCollector(self.registry)

    def bind(self, engine):
        e = str(engine)
        return (
            [c.labels(e).inc for c in self.c],
            [g.labels(e).set for g in self.g],
            [h.labels(e).observe for h in self.h],
        )

    def scrape(self):
        return self.pc.generate_latest(self.registry).decode()


class Pytheus(Lib):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        from pytheus.backends import load_backend
        from pytheus.backends.redis import MultiProcessRedisBackend

        load_backend(backend_class=MultiProcessRedisBackend, backend_config={"host": HOST, "port": PORT})
        from pytheus.exposition import generate_metrics
        from pytheus.metrics import Counter, Gauge, Histogram
        from pytheus.registry import CollectorRegistry

        self.generate = generate_metrics
        self.registry = CollectorRegistry()
        r = self.registry
        self.c = [
            Counter(f"counter_{i}", "c", required_labels=["engine"], registry=r) for i in range(N_COUNTERS)
        ]
        self.g = [Gauge(f"gauge_{i}", "g", required_labels=["engine"], registry=r) for i in range(N_GAUGES)]
        self.h = [
            Histogram(f"hist_{i}", "h", required_labels=["engine"], buckets=BUCKETS, registry=r)
            for i in range(N_HISTS)
        ]

    def bind(self, engine):
        labels = {"engine": str(engine)}
        return (
            [c.labels(labels).inc for c in self.c],
            [g.labels(labels).set for g in self.g],
            [h.labels(labels).observe for h in self.h],
        )

    def scrape(self):
        return self.generate(self.registry)


class PromRedisClient(Lib):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        import prometheus_redis_client as prc
        import redis

        self.registry = prc.Registry(redis.StrictRedis(host=HOST, port=PORT))
        r = self.registry
        self.c = [
            prc.Counter(f"counter_{i}", "c", labelnames=["engine"], registry=r) for i in range(N_COUNTERS)
        ]
        self.g = [
            prc.CommonGauge(f"gauge_{i}", "g", labelnames=["engine"], registry=r) for i in range(N_GAUGES)
        ]
        self.h = [
            prc.Histogram(f"hist_{i}", "h", labelnames=["engine"], buckets=BUCKETS, registry=r)
            for i in range(N_HISTS)
        ]

    def bind(self, engine):
        e = str(engine)
        # A fresh labels dict per call: the library adds "le" to the dict it is given.
        return (
            [lambda v, c=c: c.inc(v, labels={"engine": e}) for c in self.c],
            [lambda v, g=g: g.set(v, labels={"engine": e}) for g in self.g],
            [lambda v, h=h: h.observe(v, labels={"engine": e}) for h in self.h],
        )

    def scrape(self):
        return self.registry.output()


def make(lib: str, url: str) -> Lib:
    if lib == "redis_stats":
        return RedisStats(url)
    if lib == "prometheus_client":
        return PromClient(url)
    if lib == "prometheus_client_mp":
        return PromClient(url, multiprocess=True)
    if lib == "pytheus":
        return Pytheus(url)
    if lib == "prometheus_redis_client":
        return PromRedisClient(url)
    raise SystemExit(f"unknown library {lib}")


def step(counters, gauges, hists) -> None:
    """One vLLM engine step: 3 gauges, 4 counters, 34 histogram observations (41 updates)."""
    gauges[0](12)
    gauges[1](3)
    gauges[2](0.41)
    counters[0](400)
    counters[1](32)
    counters[2](600)
    counters[3](200)
    hists[0](0.12)
    hists[1](432)
    obs = hists[2]
    for _ in range(32):
        obs(0.014)


def task_record() -> dict:
    RoundTrips.install()
    lib = make(LIB, URL)
    children = lib.bind(0)
    remote = LIB in ("pytheus", "prometheus_redis_client")
    n = 200 if remote else 20000
    step(*children)
    RoundTrips.count = 0
    t0 = time.perf_counter()
    for _ in range(n):
        step(*children)
    seconds = time.perf_counter() - t0
    round_trips = RoundTrips.count / n
    if LIB == "redis_stats":
        lib.flush()  # the only round trip: one per flush interval, whatever the traffic
        round_trips = 0.0
    return {"us_per_step": seconds / n * 1e6, "round_trips_per_step": round_trips, "steps": n}


def task_scrape() -> dict:
    lib = make(LIB, URL)
    t0 = time.perf_counter()
    if LIB == "prometheus_client_mp":
        populate_multiprocess(lib)
    else:
        for e in range(ENGINES):
            counters, gauges, hists = lib.bind(e)
            for i, c in enumerate(counters):
                c(e + i)
            for i, g in enumerate(gauges):
                g(i)
            for h in hists:
                for v in BUCKETS:
                    h(v)
        lib.flush()
    populate = time.perf_counter() - t0
    text = lib.scrape()
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        text = lib.scrape()
        times.append(time.perf_counter() - t0)
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {
        "engines": ENGINES,
        "scrape_ms": min(times) * 1e3,  # the best of 7: noise on a shared machine only adds
        "bytes": len(text),
        "samples": samples,
        "populate_s": populate,
    }


def task_scrape_busy() -> dict:
    """The scrape of a busy fleet: every series of every engine changed (and, for redis_stats,
    flushed) before each timed scrape, outside the timing, as another process's writes would be."""
    lib = make(LIB, URL)
    bound = [lib.bind(e) for e in range(ENGINES)]

    def churn(k: int) -> None:
        for counters, gauges, hists in bound:
            for i, c in enumerate(counters):
                c(1 + (i + k) % 5)
            for i, g in enumerate(gauges):
                g(k + i * 0.5)
            for i, h in enumerate(hists):
                h(BUCKETS[(k + i) % len(BUCKETS)] * 0.9)
        lib.flush()

    churn(0)
    text = lib.scrape()
    times = []
    for k in range(1, int(os.environ.get("PEER_RUNS", "9")) + 1):
        churn(k)
        t0 = time.perf_counter()
        text = lib.scrape()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "engines": ENGINES,
        "scrape_ms": times[0] * 1e3,
        "median_ms": times[len(times) // 2] * 1e3,
        "bytes": len(text),
    }


def populate_multiprocess(lib: PromClient) -> None:
    """Four API-server processes each write every engine (prometheus_client's mmap files)."""
    import multiprocessing

    def child(part: int) -> None:
        for e in range(ENGINES):
            counters, gauges, hists = lib.bind(e)
            for i, c in enumerate(counters):
                c(e + i if part == 0 else 0)
            for i, g in enumerate(gauges):
                g(i)
            for h in hists:
                for v in BUCKETS:
                    if part == 0:
                        h(v)

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=child, args=(p,)) for p in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


def hung_server() -> int:
    """A loopback listener that accepts and never answers (a hung Redis)."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns = []

    def accept():
        while True:
            try:
                conns.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv.getsockname()[1]


def task_down() -> dict:
    out = {}
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    closed_port = refused.getsockname()[1]
    refused.close()
    global HOST, PORT
    for case, port in (("refused", closed_port), ("hung", hung_server())):
        HOST, PORT = "127.0.0.1", port
        url = f"redis://127.0.0.1:{port}/0"
        result: dict = {}

        def one_update(result=result, url=url):
            try:
                lib = make(LIB, url)
                counters, _, _ = lib.bind(0)
                t0 = time.perf_counter()
                try:
                    counters[0](1)
                    result["raised"] = None
                except Exception as exc:
                    result["raised"] = type(exc).__name__
                result["seconds"] = time.perf_counter() - t0
            except Exception as exc:
                result["setup_error"] = type(exc).__name__

        t = threading.Thread(target=one_update, daemon=True)
        t.start()
        t.join(10)
        if t.is_alive():
            result = {"blocked_over_s": 10}
        out[case] = result
    return out


if __name__ == "__main__":
    if LIB == "prometheus_client_mp":
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="bench-mp-")
    tasks = {"record": task_record, "scrape": task_scrape, "scrape_busy": task_scrape_busy, "down": task_down}
    task = tasks[TASK]
    print(json.dumps(task()))
    sys.stdout.flush()
    os._exit(0)  # libraries may leave non-daemon threads (refreshers) behind
