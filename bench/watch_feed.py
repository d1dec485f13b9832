"""The watch feed (issue 40): from a change in an engine to a subscriber of ``/watch``, at 1,024
engines x 2 writers with 100 subscribers, against today's path in the same run.

A private Redis holds a fleet of ``--engines`` x 2 writers: bench/fleet.py's drivers send their
realistic flushes (load entries in them, one round trip each, 1 s apart), so the load hash holds
2,048 entries that change every second. ``redis-stats exporter`` runs in its own process
(``--max-connections 256``). Two probe writers of their own engines (vLLM catalogue and load map,
flush every 1 s): one with the load lane (the default), one without (``load_interval=0``, the
writer before this issue). ``--changes`` times, at random moments, both probes ``set()`` a new
``vllm:num_requests_waiting`` value (the time of each set kept). A subscriber process runs
``--subscribers`` threads, each following ``/watch`` as Server-Sent Events (one connection each:
the first with ``docs/examples/load_router.py``'s ``WatchClient``, which parses every event; the
others parse only the probes' events, as a compiled router keeps up with 2,000 events a second
where 100 Python threads sharing one core cannot), and one thread polling ``/load`` every 50 ms
with ``If-None-Match`` (today's path: a router polling the exporter's 0.25 s refresh); each
records when it first saw each value (a value overwritten before a path showed it is not seen:
the samples column counts the values each path showed).

Printed: p50 / p99 of set() -> seen, for (a) the lane + ``/watch`` (every subscriber's every
change; the example router apart), (b) the lane + ``/load`` polled, (c) no lane + ``/load``
polled (before); Redis CPU and
the exporter process's CPU over the run, with and without the subscribers (the same run, one
window each).

Usage: python bench/watch_feed.py [--engines 1024] [--subscribers 100] [--changes 30]
       python bench/watch_feed.py --edges [--before DIR] ...   # bench/watch_edges.py: an outage
                                                                # mid-stream, 1,000 subscribers' memory
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "docs" / "examples"))

import redis  # noqa: E402

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis, free_port  # noqa: E402

PROBE_LANE, PROBE_BEFORE = 100_000, 100_001  # the probes' engines (apart from the fleet's)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process *pid* so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _probe_events(url: str) -> Any:
    """A stream of /watch read as bytes: a function giving the probes' events in the next chunk."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/watch", headers={"Accept": "text/event-stream"})
    response = conn.getresponse()
    markers = [f'"engine": {e},'.encode() for e in (PROBE_LANE, PROBE_BEFORE)]
    pending = b""

    def next_events() -> list[dict[str, Any]]:
        nonlocal pending
        chunk = response.read1(1 << 20)
        if not chunk:
            raise OSError("the feed ended")
        *blocks, pending = (pending + chunk).split(b"\n\n")
        found = []
        for block in blocks:
            if any(m in block for m in markers):
                data = block.rpartition(b"data: ")[2]
                doc = json.loads(data)
                if "engine" in doc:  # an event (the first block is the whole state)
                    found.append(doc)
        return found

    return next_events


def _stored(url: str, namespace: str, stored_at: dict[int, float], done: threading.Event) -> None:
    """When each value of the lane probe's gauge is first in Redis (its load entry read every 5 ms):
    the lane's share of the path to a subscriber."""
    from redis_stats.keys import Keys
    from redis_stats.load import FIELDS, decode_entries

    waiting = FIELDS.index("requests_waiting")

    client = redis.Redis.from_url(url, decode_responses=True)
    key = Keys(namespace).load
    fields = [f for f in client.hkeys(key) if f.startswith(f"{PROBE_LANE}|")]
    while not done.is_set():
        for entry in decode_entries(client.hmget(key, fields)):
            value = entry.values[waiting] if entry else None
            if value is not None and int(value) not in stored_at:
                stored_at[int(value)] = time.time()
        time.sleep(0.005)


def subscribers(url: str, n: int, seconds: float, out: Any) -> None:
    """*n* threads following /watch and one polling /load; each value's first sighting per thread."""
    from load_router import LoadClient, WatchClient

    stop = time.monotonic() + seconds
    seen: list[tuple[str, int, int, float]] = []  # (path, engine, value, time seen)
    lock = threading.Lock()

    def follow(i: int) -> None:
        """Subscriber 0 is the example router (WatchClient: every event parsed); the others read
        the stream's bytes and parse only the probes' events, as a router in a compiled language
        would keep up: 100 Python subscribers parsing 2,000 events a second each would measure
        the subscriber process's one core, not the feed."""
        if i == 0:
            client = WatchClient(url)
            client.start()
            events: Any = lambda: client.follow()  # noqa: E731
        else:
            events = _probe_events(url)
        firsts: set[tuple[int, int]] = set()
        while time.monotonic() < stop:
            try:
                got = events()
            except OSError:
                continue
            now = time.time()
            for e in got:
                key = (e["engine"], int(e["requests_waiting"] or -1))
                if e["engine"] in (PROBE_LANE, PROBE_BEFORE) and key not in firsts:
                    firsts.add(key)
                    with lock:
                        seen.append(("watch" if i else "example router", key[0], key[1], now))

    def poll() -> None:
        client = LoadClient(url)
        firsts: set[tuple[int, int]] = set()
        while time.monotonic() < stop:
            try:
                doc = client.poll()
            except OSError:
                continue
            now = time.time()
            for e in (PROBE_LANE, PROBE_BEFORE):
                load = doc["engines"].get(str(e))
                if load and load["requests_waiting"] is not None:
                    key = (e, int(load["requests_waiting"]))
                    if key not in firsts:
                        firsts.add(key)
                        with lock:
                            seen.append(("load", key[0], key[1], now))
            time.sleep(0.05)

    threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(n)]
    threads.append(threading.Thread(target=poll, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    out.put(seen)


def _exporter(root: Path, redis_url: str, namespace: str, port: int, extra: list[str]) -> subprocess.Popen:
    """``redis-stats exporter`` of the checkout at *root* (its own package: ``python -m`` there)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redis_stats",
            "exporter",
            "--redis-url",
            redis_url,
            "--namespace",
            namespace,
            "--port",
            str(port),
            "--max-connections",
            "256",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )


def phase(
    name: str,
    root: Path,
    extra: list[str],
    redis_url: str,
    namespace: str,
    gauges: dict[int, Any],
    opts: Any,
    ctx: Any,
) -> dict[str, Any]:
    """One exporter (of *root*, with *extra* options) measured: /load alone, then the subscribers."""
    from fleet import cpu_seconds

    node = redis.Redis.from_url(redis_url)
    port = free_port()
    exporter = _exporter(root, redis_url, namespace, port, extra)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/load", timeout=30).read()
            break
        except OSError:
            time.sleep(0.2)
    load_before = os.getloadavg()[0]
    window = 4.0
    cpu0, ex0 = cpu_seconds(node), proc_cpu(exporter.pid)  # (1) no subscriber: /load alone
    for _ in range(int(window / 0.05)):
        urllib.request.urlopen(url + "/load", timeout=30).read()
        time.sleep(0.05)
    cpu1, ex1 = cpu_seconds(node), proc_cpu(exporter.pid)

    out: Any = ctx.Queue()
    follow_for = 6.0 + opts.changes * 0.6
    subs = ctx.Process(target=subscribers, args=(url, opts.subscribers, follow_for, out))
    subs.start()
    time.sleep(4.0)  # every subscriber has its state and waits
    cpu2, ex2, t2 = cpu_seconds(node), proc_cpu(exporter.pid), time.monotonic()
    set_at: dict[tuple[int, int], float] = {}
    stored_at: dict[int, float] = {}  # the lane probe's values: when first in Redis
    done = threading.Event()
    watcher = threading.Thread(target=_stored, args=(redis_url, namespace, stored_at, done), daemon=True)
    watcher.start()
    base = PHASE_VALUES * phase.count  # type: ignore[attr-defined]
    phase.count += 1  # type: ignore[attr-defined]
    for n in range(base + 1, base + opts.changes + 1):
        time.sleep(random.uniform(0.2, 0.5))
        for e, g in gauges.items():
            set_at[(e, n)] = time.time()
            g.set(n)
    time.sleep(1.5)
    done.set()
    watcher.join()
    cpu3, ex3, t3 = cpu_seconds(node), proc_cpu(exporter.pid), time.monotonic()
    seen = out.get()
    subs.join()
    exporter.terminate()
    exporter.wait(10)
    node.close()
    load_after = os.getloadavg()[0]

    lat: dict[str, list[float]] = {
        "set() -> in Redis (lane)": [
            stored_at[n] - set_at[(PROBE_LANE, n)] for n in stored_at if (PROBE_LANE, n) in set_at
        ],
        "in Redis -> /watch subscriber": [
            when - stored_at[value]
            for path, engine, value, when in seen
            if path == "watch" and engine == PROBE_LANE and value in stored_at
        ],
        "lane + /watch": [],
        "lane + /watch, example router": [],
        "lane + /load polled": [],
        "no lane + /load polled": [],
    }
    for path, engine, value, when in seen:
        at = set_at.get((engine, value))
        if at is None:
            continue
        if path == "watch" and engine == PROBE_LANE:
            lat["lane + /watch"].append(when - at)
        elif path == "example router" and engine == PROBE_LANE:
            lat["lane + /watch, example router"].append(when - at)
        elif path == "load":
            lat["lane + /load polled" if engine == PROBE_LANE else "no lane + /load polled"].append(when - at)
    print(f"\n  {name}: exporter of {root}{' ' + ' '.join(extra) if extra else ''}", flush=True)
    print(f"    load average {load_before:.1f} -> {load_after:.1f}")
    print(f"    {'':<32}{'p50':>8}{'p99':>8}{'max':>8}{'samples':>9}")
    for key, xs in lat.items():
        print(
            f"    {key:<32}{1000 * pct(xs, 0.5):>8.0f}{1000 * pct(xs, 0.99):>8.0f}"
            f"{1000 * max(xs or [0]):>8.0f}{len(xs):>9}"
        )
    redis_idle, redis_watch = (cpu1 - cpu0) / window, (cpu3 - cpu2) / (t3 - t2)
    ex_idle, ex_watch = (ex1 - ex0) / window, (ex3 - ex2) / (t3 - t2)
    print(
        f"    Redis CPU: {redis_idle:.3f} of a core with /load alone, {redis_watch:.3f} with the subscribers"
    )
    print(f"    exporter process CPU: {ex_idle:.3f} with /load alone, {ex_watch:.3f} with the subscribers")
    return {
        "latency_s": lat,
        "load_average": [load_before, load_after],
        "redis_cpu": [redis_idle, redis_watch],
        "exporter_cpu": [ex_idle, ex_watch],
        "p50_ms": {k: 1000 * statistics.median(v) for k, v in lat.items() if v},
        "p99_ms": {k: 1000 * pct(v, 0.99) for k, v in lat.items() if v},
    }


PHASE_VALUES = 10_000  # each phase sets values of its own range: a phase never sees another's


def main() -> None:
    if "--edges" in sys.argv:  # the feed at its edges (issue 46): bench/watch_edges.py
        import watch_edges

        watch_edges.main([a for a in sys.argv[1:] if a != "--edges"])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=1024)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument(
        "--exporter",
        action="append",
        default=[],
        metavar="NAME=ROOT[:OPTION ...]",
        help="an exporter to measure (repeatable, in this order, against the same fleet): the "
        "checkout at ROOT ('.' for this one) with the exporter's OPTIONs; default: this one",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="the exporters measured this many times each, in turn"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "watch_feed.json"))
    opts = parser.parse_args()
    from fleet import drive

    exporters = []
    for spec in opts.exporter or ["this=."]:
        name, _, rest = spec.partition("=")
        root, *extra = rest.split(":")
        exporters.append(
            (name, ROOT if root == "." else Path(root).resolve(), [x for e in extra for x in e.split()])
        )
    phase.count = 0  # type: ignore[attr-defined]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in exporters}
    with EmbeddedRedis() as server:
        namespace = f"watch{opts.engines}"
        ctx = mp.get_context("spawn")
        writers = [(e, a) for e in range(opts.engines) for a in range(2)]
        # the fleet flushes for the whole run: every phase (~12 s + 0.35 s a change, with start-up)
        seconds = 10.0 + len(exporters) * opts.rounds * (22.0 + opts.changes * 0.6)
        start_at = time.time() + 20.0
        queue: Any = ctx.Queue()
        drivers = [
            ctx.Process(
                target=drive, args=(server.url, namespace, writers[d::2], seconds, start_at, queue, 1, 0.0)
            )
            for d in range(2)
        ]
        for p in drivers:
            p.start()
        cfg = StatsConfig(url=server.url, namespace=namespace, flush_interval=1.0)
        probes = {
            PROBE_LANE: StatsWriter(
                cfg.replace(endpoint="probe-lane:1"), vllm_catalog(), engines=[PROBE_LANE], load=VLLM_LOAD
            ),
            PROBE_BEFORE: StatsWriter(
                cfg.replace(endpoint="probe-before:1", load_interval=0.0),
                vllm_catalog(),
                engines=[PROBE_BEFORE],
                load=VLLM_LOAD,
            ),
        }
        gauges = {
            e: w.metric("vllm:num_requests_waiting").labels(e, model_name="m") for e, w in probes.items()
        }
        for g in gauges.values():
            g.set(0)
        time.sleep(max(0.0, start_at + 3.0 - time.time()))  # the fleet flushing
        print(
            f"\nset() -> seen, {opts.engines} engines x 2 writers flushing, {opts.subscribers} subscribers, "
            f"{opts.changes} changes a phase; ms"
        )
        for _ in range(opts.rounds):
            for name, root, extra in exporters:
                results[name].append(phase(name, root, extra, server.url, namespace, gauges, opts, ctx))
        for w in probes.values():
            w.close()
        for p in drivers:  # done: a driver behind on a loaded machine would send its late flushes still
            p.terminate()
            p.join()
    if len(exporters) > 1:
        first = exporters[0][0]
        print("\n  p99 of 'lane + /watch' (every subscriber), ms, per round; ratio to " + first)
        for name, _, _ in exporters:
            cells = []
            for r, b in zip(results[name], results[first]):
                p, p0 = r["p99_ms"].get("lane + /watch", math.nan), b["p99_ms"].get("lane + /watch", math.nan)
                cells.append(f"{p:.0f} ({p / p0:.2f}x)")
            print(f"    {name:<12}" + "   ".join(cells))
    Path(opts.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
