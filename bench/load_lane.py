"""The load lane (issue 40): how fresh the router numbers are in Redis, what the lane costs Redis at
1,024 engines x 2 API servers, and what it costs the writer's host. Every figure is printed with
its ratio to a baseline measured in the same run: the writer as it was by default before the
lane (its load entries with each flush only, ``load_interval=0``: f5ee21c's default).

(1) Freshness, one real writer (the vLLM catalogue and load map, flush every 1 s) on a private
Redis. *Changes at random moments* (``--changes``, default 30; gaps of 0.05-0.6 s): a thread
``set()``s ``vllm:num_requests_waiting`` to a new value, another reads the writer's load entry
with ``HGET`` every 1 ms; the time from ``set()`` to the first read that shows it, p50 and p99;
and to the first ``/load`` document that shows it (an exporter's refresher every 0.25 s, polled
at 50 Hz, as the issue measured). *Changes all the time* (``--busy-seconds``): a new value every
5 ms; every 2 ms, how old the value Redis holds is (now minus the time it was set).

(2) Redis CPU (``INFO cpu``, all of Redis' time), ``--engines`` x 2 writers: the flushes of
bench/fleet.py (its drivers, realistic vLLM flushes with the load entries in them, one round trip
each, 1 s apart) alone, then with the lane's calls beside them: one ``HSET`` of a writer's entry per
round trip, each writer on a connection of its own, at most one per ``load_interval`` per writer,
when its numbers changed. Activity models: *none* (an idle fleet, the baseline's cost), *one API
server per engine sees the changes* (vLLM gives each engine step's stats to one front end, the
first with outputs: under load the same one), the same changes with ``--per-call`` engines'
entries in one call (a process's :class:`~redis_stats.writer.LaneGroup` of one writer per
engine, or one writer of that many engines: a vLLM API server of a data-parallel deployment),
and with ``--worst`` *every writer changes in every interval*.

(3) The writer's host: a process recording realistic engine steps (``VllmRecorder``, 2 engines,
200 steps a second each) for ``--host-seconds`` with its flusher running, without and with the
lane: its CPU time, its garbage collections by generation (``gc.callbacks``), and a record call's
time (the record path is the same code in both).

Usage: python bench/load_lane.py [--part freshness,redis,host] [--engines 1024] [--seconds 8]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import math
import multiprocessing as mp
import os
import random
import socket
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import redis  # noqa: E402

from redis_stats import StatsConfig, StatsReader, StatsWriter  # noqa: E402
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.keys import Keys  # noqa: E402
from redis_stats.server import Exporter  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402

LANE = StatsConfig().load_interval  # the default


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# -- (1) freshness ---------------------------------------------------------------------------------


def _writer(url: str, namespace: str, load_interval: float) -> StatsWriter:
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=1.0, load_interval=load_interval)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0], load=VLLM_LOAD)
    w.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(0)
    w.metric("vllm:kv_cache_usage_perc").labels(0, model_name="m").set(0.1)
    assert w.flush()
    return w


def _stored_waiting(client: redis.Redis, key: str, field: str) -> float | None:
    raw = client.hget(key, field)
    if raw is None:
        return None
    return json.loads("[" + raw.decode() + "]")[5]  # stored ms, version, stamp, modes, running, waiting


def freshness_random(url: str, load_interval: float, changes: int) -> dict[str, Any]:
    namespace = f"fresh{load_interval}-{time.time_ns()}"
    w = _writer(url, namespace, load_interval)
    client = redis.Redis.from_url(url)
    key, field = Keys(namespace).load, f"0|{w.writer_id}"
    exporter = Exporter(StatsReader(StatsConfig(url=url, namespace=namespace)), port=0).start()
    waiting = w.metric("vllm:num_requests_waiting").labels(0, model_name="m")
    to_redis, to_load = [], []
    try:
        for n in range(1, changes + 1):
            time.sleep(random.uniform(0.05, 0.6))
            seen: dict[str, float] = {}

            def watch_load(n: int = n, seen: dict[str, float] = seen) -> None:
                while "load" not in seen:
                    with urllib.request.urlopen(exporter.url + "/load", timeout=5) as r:
                        doc = json.loads(r.read())
                    if doc["engines"]["0"]["requests_waiting"] == n:
                        seen["load"] = time.monotonic()
                    time.sleep(0.02)  # 50 Hz

            t = threading.Thread(target=watch_load, daemon=True)
            t.start()
            at = time.monotonic()
            waiting.set(n)
            while _stored_waiting(client, key, field) != n:
                time.sleep(0.001)
            to_redis.append(time.monotonic() - at)
            t.join(10)
            to_load.append(seen["load"] - at)
    finally:
        exporter.close()
        w.close()
    return {"redis": to_redis, "load": to_load}


def freshness_busy(url: str, load_interval: float, seconds: float) -> list[float]:
    namespace = f"busy{load_interval}-{time.time_ns()}"
    w = _writer(url, namespace, load_interval)
    client = redis.Redis.from_url(url)
    key, field = Keys(namespace).load, f"0|{w.writer_id}"
    waiting = w.metric("vllm:num_requests_waiting").labels(0, model_name="m")
    set_at: dict[int, float] = {}
    stop = threading.Event()

    def change() -> None:
        n = 1
        while not stop.is_set():
            set_at[n] = time.monotonic()
            waiting.set(n)
            n += 1
            time.sleep(0.005)

    t = threading.Thread(target=change, daemon=True)
    t.start()
    time.sleep(1.5)  # past the first flush
    ages = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            held = _stored_waiting(client, key, field)
            now = time.monotonic()
            if held and int(held) in set_at:
                ages.append(now - set_at[int(held)])
            time.sleep(0.002)
    finally:
        stop.set()
        t.join(2)
        w.close()
    return ages


def part_freshness(url: str, opts: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, li in (
        ("before: each flush only (load_interval=0)", 0.0),
        (f"the lane (load_interval={LANE})", LANE),
    ):
        rnd = freshness_random(url, li, opts.changes)
        busy = freshness_busy(url, li, opts.busy_seconds)
        out[name] = {"random": rnd, "busy": busy}
    print("\n(1) freshness: one writer, flush every 1 s; ms, p50 / p99")
    print(f"    {'':<46}{'set() -> Redis':>18}{'set() -> /load':>18}{'busy: age in Redis':>22}")
    base = None
    for name, r in out.items():
        row = [
            (pct(r["random"]["redis"], 0.5), pct(r["random"]["redis"], 0.99)),
            (pct(r["random"]["load"], 0.5), pct(r["random"]["load"], 0.99)),
            (pct(r["busy"], 0.5), pct(r["busy"], 0.99)),
        ]
        cells = "".join(f"{1000 * a:>9.0f} / {1000 * b:<6.0f}" for a, b in row)
        print(f"    {name:<46}{cells}")
        if base is None:
            base = row
        else:
            ratios = "".join(f"{b1 / b0:>15.2f}x p99" for (_, b0), (_, b1) in zip(base, row))
            print(f"    {'  ratio to before':<46}{ratios}")
    return out


# -- (2) Redis CPU ---------------------------------------------------------------------------------


def _resp(*args: str) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def lane_driver(
    url: str,
    namespace: str,
    writers: list[tuple[int, int]],
    interval: float,
    start_at: float,
    seconds: float,
    queue: Any,
    per_call: int = 1,
) -> None:
    """The lane's calls of *writers* (engine, api): one HSET per round trip, every *interval* at a
    random phase (their numbers changed in every interval), each call on its own connection
    with the entries of *per_call* writers (1: a writer's own lane; more: a process's
    ``LaneGroup``, or a writer of that many engines)."""
    from fleet import TEMPLATE_ENGINES, templates

    tpl = templates()
    host, port = url.split("//")[1].split("/")[0].split(":")
    key = Keys(namespace).load
    conns = []
    for i in range(0, len(writers), per_call):
        s = socket.create_connection((host, int(port)))
        s.setblocking(False)
        fields = [
            (f"{e}|fleet:{e}:api{a}", tpl[(e % TEMPLATE_ENGINES) * 2 + a][2][5][2])
            for e, a in writers[i : i + per_call]
        ]
        conns.append((s, fields))
    start = time.monotonic() + (start_at - time.time())
    heap = [(start + random.random() * interval, i) for i in range(len(conns))]
    heapq.heapify(heap)
    end = start + seconds
    sent = 0
    while heap and heap[0][0] < end:
        due, i = heap[0]
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, 0.001))
            continue
        heapq.heappop(heap)
        s, fields = conns[i]
        stamp = f"{time.time() * 1000:.0f},"
        s.send(_resp("HSET", key, *[x for field, entry in fields for x in (field, stamp + entry)]))
        sent += 1
        with_replies = 0
        try:
            with_replies = len(s.recv(4096))
        except BlockingIOError:
            pass
        del with_replies
        heapq.heappush(heap, (due + interval, i))
    for s, _ in conns:
        s.close()
    queue.put(sent)


def redis_run(
    url: str,
    engines: int,
    seconds: float,
    lane_writers: list[tuple[int, int]],
    interval: float,
    per_call: int = 1,
    flushes: bool = True,
) -> dict[str, Any]:
    from fleet import cpu_seconds, drive

    namespace = f"lane{engines}-{time.time_ns()}"
    writers = [(e, a) for e in range(engines) for a in range(2)]
    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    lanes: Any = ctx.Queue()
    start_at = time.time() + 20.0  # the drivers build their templates first
    drivers = 2
    procs = [
        ctx.Process(
            target=drive, args=(url, namespace, writers[d::drivers], seconds, start_at, queue, 1, 0.0)
        )
        for d in range(drivers if flushes else 0)
    ]
    lane_procs = [
        ctx.Process(
            target=lane_driver,
            args=(
                url,
                namespace,
                lane_writers[d::2],
                interval,
                start_at + 2.0,
                seconds - 2.0,
                lanes,
                per_call,
            ),
        )
        for d in range(2 if lane_writers else 0)
    ]
    for p in procs + lane_procs:
        p.start()
    node = redis.Redis.from_url(url)
    time.sleep(max(0.0, start_at + 2.0 - time.time()))  # from the third second, as bench/fleet.py
    cpu0, t0 = cpu_seconds(node), time.monotonic()
    results = [queue.get() for _ in procs]
    sent = 0 if procs else sum(lanes.get() for _ in lane_procs)  # the lane alone: until it ends
    cpu1, wall = cpu_seconds(node), time.monotonic() - t0
    if procs:
        sent = sum(lanes.get() for _ in lane_procs)
    for p in procs + lane_procs:
        p.join()
    node.close()
    return {
        "cpu": (cpu1 - cpu0) / wall,
        "flushes_per_s": sum(len(lat) for lat, _ in results) / wall,
        "lane_calls_per_s": sent / (seconds - 2.0),
        "flush_p99_ms": pct([x for lat, _ in results for x in lat], 0.99) * 1e3 if results else math.nan,
        "behind_s": max((b for _, b in results), default=0.0),
    }


def part_redis(url: str, opts: Any) -> dict[str, Any]:
    n = opts.engines
    every = [(e, a) for e in range(n) for a in range(2)]
    one = [(e, 0) for e in range(n)]
    rows = {
        "flushes only (before: no lane)": redis_run(url, n, opts.seconds, [], LANE),
        f"+ lane, one API server per engine changes every {LANE} s": redis_run(
            url, n, opts.seconds, one, LANE
        ),
        f"+ lane, the same changes, {opts.per_call} engines' entries a call (LaneGroup)": redis_run(
            url, n, opts.seconds, one, LANE, opts.per_call
        ),
    }
    if opts.worst:
        rows[f"+ lane, every writer changes every {LANE} s (worst case)"] = redis_run(
            url, n, opts.seconds, every, LANE
        )
    alone = {
        k: redis_run(url, n, opts.seconds, one, LANE, k, flushes=False) for k in sorted({1, opts.per_call})
    }
    base = next(iter(rows.values()))["cpu"]
    print(
        f"\n(2) Redis CPU, {n} engines x 2 writers, flushes 1/s each (1.0 = one core), {opts.seconds:.0f} s; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"    {'':<66}{'Redis CPU':>10}{'x before':>10}{'flushes/s':>10}{'lane calls/s':>14}"
        f"{'flush p99 ms':>14}{'behind s':>10}"
    )
    for name, r in rows.items():
        print(
            f"    {name:<66}{r['cpu']:>10.3f}{r['cpu'] / base:>10.2f}{r['flushes_per_s']:>10.0f}"
            f"{r['lane_calls_per_s']:>14.0f}"
            f"{r['flush_p99_ms']:>14.2f}{r['behind_s']:>10.2f}"
        )
    # The budget from parts measured apart: the flushes at their full pace (2 per engine a
    # second; the first row's CPU scaled when its drivers fell behind on a loaded machine), and
    # the lane alone at its pace (its calls keep time: a few per connection a second).
    flushes = rows["flushes only (before: no lane)"]
    at_pace = flushes["cpu"] * 2 * n / max(flushes["flushes_per_s"], 1.0)
    print(
        f"    the lane alone, one API server per engine changing every {LANE} s "
        f"({n / LANE:,.0f} entries/s), and the budget: the flushes at 2,048/s ({at_pace:.3f}) + the lane"
    )
    for k, r in alone.items():
        per_call = 1e6 * r["cpu"] / max(r["lane_calls_per_s"], 1.0)
        print(
            f"      {k} engine(s) a call: {r['lane_calls_per_s']:>7,.0f} calls/s, Redis CPU {r['cpu']:.3f} "
            f"({per_call:.1f} µs a call, {per_call / k:.1f} µs an entry); flushes + lane "
            f"{at_pace + r['cpu']:.3f} of a core"
        )
    out = dict(rows)
    out.update({f"the lane alone, {k} a call": r for k, r in alone.items()})
    out["flushes_at_pace_cpu"] = {"cpu": at_pace}
    return out


# -- (3) the writer's host -------------------------------------------------------------------------


def host_run(url: str, load_interval: float, seconds: float, queue: Any) -> None:
    from vllm_record import batches

    cfg = StatsConfig(url=url, namespace=f"host{load_interval}-{time.time_ns()}", load_interval=load_interval)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0, 1], load=VLLM_LOAD)
    rec = VllmRecorder(w, "m", [0, 1])
    steps = batches(8)
    collections = [0, 0, 0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections[info["generation"]] += 1

    for k in range(400):  # bind every series before measuring
        sched, it = steps[k % len(steps)]
        rec.record(sched, it, None, k % 2)
    time.sleep(1.5)
    gc.callbacks.append(count)
    cpu0, t0 = time.process_time(), time.monotonic()
    record_times = []
    k = 0
    period = 1 / 400  # 200 steps a second on each of 2 engines
    next_at = time.monotonic()
    while time.monotonic() - t0 < seconds:
        sched, it = steps[k % len(steps)]
        sched.kv_cache_usage = (k % 97) / 100  # the numbers move every step: the lane's worst case
        a = time.perf_counter()
        rec.record(sched, it, None, k % 2)
        record_times.append(time.perf_counter() - a)
        k += 1
        next_at += period
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    cpu = time.process_time() - cpu0
    wall = time.monotonic() - t0
    gc.callbacks.remove(count)
    w.close()
    queue.put(
        {
            "cpu_per_s": cpu / wall,
            "collections_per_min": [60 * c / wall for c in collections],
            "record_us_p50": statistics.median(record_times) * 1e6,
            "steps": k,
        }
    )


def part_host(url: str, opts: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    rows = {}
    for name, li in (("before: no lane", 0.0), (f"the lane ({LANE} s)", LANE)):
        q: Any = ctx.Queue()
        p = ctx.Process(target=host_run, args=(url, li, opts.host_seconds, q))
        p.start()
        rows[name] = q.get()
        p.join()
    base = next(iter(rows.values()))
    print(
        "\n(3) the writer's host: 2 engines x 200 steps/s, numbers moving every step, "
        f"{opts.host_seconds:.0f} s"
    )
    print(
        f"    {'':<24}{'CPU (1.0 = a core)':>20}{'x before':>10}{'GC gen0/1/2 per min':>24}"
        f"{'record µs p50':>15}"
    )
    for name, r in rows.items():
        gcs = "/".join(f"{c:.0f}" for c in r["collections_per_min"])
        print(
            f"    {name:<24}{r['cpu_per_s']:>20.4f}{r['cpu_per_s'] / base['cpu_per_s']:>10.2f}{gcs:>24}"
            f"{r['record_us_p50']:>15.1f}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", default="freshness,redis,host")
    parser.add_argument("--engines", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--per-call", type=int, default=8, help="engines' entries in a grouped lane call")
    parser.add_argument("--worst", action="store_true", help="(2) also every writer changing (slow)")
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--busy-seconds", type=float, default=10.0)
    parser.add_argument("--host-seconds", type=float, default=20.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "load_lane.json"))
    opts = parser.parse_args()
    parts = opts.part.split(",")
    results: dict[str, Any] = {}
    with EmbeddedRedis() as server:
        if "freshness" in parts:
            results["freshness"] = part_freshness(server.url, opts)
        if "redis" in parts:
            results["redis"] = part_redis(server.url, opts)
        if "host" in parts:
            results["host"] = part_host(server.url, opts)
    Path(opts.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
