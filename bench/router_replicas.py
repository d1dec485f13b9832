"""Router replicas on one load plane (issue 47): imbalance and queue wait, four views, one run.

    python bench/router_replicas.py [--seconds 20] [--bursts 2] [--load 0.8] [--rounds 3]

16 stand-in engines (one process: each a queue with ``--slots`` requests served at once, an
exponential service time of mean ``--service`` s, reporting ``requests_running`` and
``requests_waiting`` through a real :class:`~redis_stats.StatsWriter`, the 16 engines' one, as an
API server of 16 data-parallel ranks, its load lane on, and counting arrivals with
:class:`~redis_stats.writer.Arrivals` by rank), a private redis-server, and router
processes running the example router's rule (``docs/examples/load_router.py``: ``pick_least``,
fewest expected requests, ties at random). Each mode runs the same traffic: Poisson arrivals at
``--load`` x the fleet's capacity for ``--seconds``, then ``--bursts`` bursts of 512 requests at
once (split over the routers), each drained before the next (1.5 x 512 x service / slots). Modes:

(i)   4 replicas, each on its own view: the engines' running + waiting from the feed;
(ii)  4 replicas, with arrivals: the feed's ``in_flight`` (counted where requests land);
(iii) 4 replicas, with bookings too: ``expected_in_flight`` (in_flight + every replica's bookings);
(iv)  1 router alone (the ideal): its own exact count of what it sent and what came back.

Every replica reads the feed itself (``StatsReader.load()``) every ``--view`` s, adds its own
dispatches made since that read began and takes off its own completions since a lane interval
before it (what it knows that the view cannot show yet). Measured at
the engines: imbalance, the most requests held by one engine over the mean per engine, summed
over 10 ms samples (so weighted by load: a drain's last few requests weigh little), and the p99
(and p50) queue wait, from arrival to service start; and the engines' event-loop lag (how late
a 10 ms sleep wakes: the machine keeping up). ``--rounds`` runs every mode that many times, in
alternating order, and reports the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "examples")]

from load_router import pick_least  # noqa: E402  (the example router's rule)

from redis_stats import Catalog, StatsConfig, StatsReader, StatsWriter  # noqa: E402
from redis_stats.bookings import Bookings  # noqa: E402
from redis_stats.load import LoadMap, LoadSource  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis, free_port  # noqa: E402
from redis_stats.writer import Arrivals  # noqa: E402

ENGINES = 16
BURST = 512
MODES = {"i": "own view", "ii": "arrivals", "iii": "arrivals + bookings", "iv": "one router (ideal)"}
FIELD = {"i": None, "ii": "in_flight", "iii": "expected_in_flight"}
LOAD = LoadMap(requests_running=LoadSource("running"), requests_waiting=LoadSource("waiting"))


def catalog() -> Catalog:
    cat = Catalog()
    cat.gauge("running", "Requests running.")
    cat.gauge("waiting", "Requests waiting.")
    return cat


# -- the stand-in engines ---------------------------------------------------------------------


class Engine:
    """A queue with *slots* served at once, exponential service times, reporting through *writer*
    (the engines' one writer, as one API server of 16 data-parallel ranks) and counting arrivals."""

    def __init__(
        self, index: int, writer: StatsWriter, arrivals: Arrivals, slots: int, service: float
    ) -> None:
        self.index, self.slots, self.service = index, slots, service
        self.running_g = writer.metric("running").labels(index)
        self.waiting_g = writer.metric("waiting").labels(index)
        self.arrivals = arrivals
        self.running = 0
        self.queue: asyncio.Queue[asyncio.Future[float]] = asyncio.Queue()
        self.waits: list[float] = []
        self._report()

    def _report(self) -> None:
        self.running_g.set(self.running)
        self.waiting_g.set(self.queue.qsize())

    def held(self) -> int:
        return self.running + self.queue.qsize()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        request_id = line.decode().strip() or None
        arrived = time.monotonic()
        with self.arrivals.begin(rank=self.index, request_id=request_id):
            started: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            self.queue.put_nowait(started)
            self._report()
            self._kick()
            begun = await started
            self.waits.append(begun - arrived)
            await asyncio.sleep(random.expovariate(1.0 / self.service))
            self.running -= 1
            self._report()
            self._kick()
        writer.write(b"ok\n")
        await writer.drain()
        writer.close()

    def _kick(self) -> None:
        while self.running < self.slots and not self.queue.empty():
            self.queue.get_nowait().set_result(time.monotonic())
            self.running += 1
        self._report()


def engines_main(
    url: str, namespace: str, ports: list[int], slots: int, service: float, lane: float, conn: Any
) -> None:
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=1.0, stale_after=10.0, load_interval=lane)

    async def run() -> None:
        writer = StatsWriter(cfg, catalog(), engines=list(range(ENGINES)), role="engines", load=LOAD)
        arrivals = Arrivals(writer)
        engines = [Engine(i, writer, arrivals, slots, service) for i in range(ENGINES)]
        for engine, port in zip(engines, ports):
            await asyncio.start_server(engine.serve, "127.0.0.1", port, backlog=1024)
        conn.send("ready")
        loop = asyncio.get_running_loop()
        while True:  # one measurement window per command
            command = await loop.run_in_executor(None, conn.recv)
            if command == "stop":
                break
            for e in engines:
                e.waits.clear()
            most = total = lag = 0.0
            samples = 0
            while not conn.poll():
                held = [e.held() for e in engines]
                most, total = most + max(held), total + sum(held) / len(held)
                asked = time.monotonic()
                await asyncio.sleep(0.01)
                lag += time.monotonic() - asked - 0.01
                samples += 1
            conn.recv()  # "end"
            waits = sorted(w for e in engines for w in e.waits)
            conn.send((most / total if total else float("nan"), waits, lag / max(samples, 1)))
        writer.close()

    asyncio.run(run())


# -- the routers ------------------------------------------------------------------------------


class View:
    """The feed as one replica reads it: refreshed every *every* s in a thread."""

    def __init__(self, cfg: StatsConfig, every: float) -> None:
        self.reader = StatsReader(cfg)
        self.doc: dict[str, Any] = {"engines": {}}
        self.read_at = 0.0
        self.every = every
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.doc = self.reader.load().to_dict()
                self.read_at = began
            except Exception:
                pass
            self._stop.wait(max(0.0, self.every - (time.monotonic() - began)))

    def stop(self) -> None:
        self._stop.set()


def router_main(
    url: str,
    namespace: str,
    ports: list[int],
    mode: str,
    kind: str,
    replica: int,
    rate: float,
    plan: dict[str, Any],
    conn: Any,
) -> None:
    share = 1.0 / (1 if mode == "iv" else plan["replicas"])
    cfg = StatsConfig(url=url, namespace=namespace)
    view = View(cfg, plan["view"]) if mode != "iv" else None
    bookings = Bookings(cfg, bound=5.0) if mode == "iii" else None
    sent: list[tuple[float, int]] = []  # (time, engine) of this replica's dispatches
    done: list[tuple[float, int]] = []  # (time, engine) of their completions
    outstanding = [0] * ENGINES  # the ideal's exact count (mode iv)
    rng = random.Random(os.getpid())

    def choose() -> int:
        if view is None:
            low = min(outstanding)
            return rng.choice([e for e, n in enumerate(outstanding) if n == low])
        newer = [0] * ENGINES
        for at, e in reversed(sent):
            if at < view.read_at:
                break
            newer[e] += 1
        # its own completions the view may not show yet: since a lane interval before the read
        for at, e in reversed(done):
            if at < view.read_at - plan["lane"]:
                break
            newer[e] -= 1
        engine = pick_least(view.doc, FIELD[mode], newer, rng)
        return engine if engine is not None else rng.randrange(ENGINES)

    async def dispatch() -> None:
        engine = choose()
        sent.append((time.monotonic(), engine))
        outstanding[engine] += 1
        request_id = uuid.uuid4().hex
        booking = bookings.book(engine, request_id) if bookings is not None else None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", ports[engine])
            writer.write(request_id.encode() + b"\n")
            await writer.drain()
            await reader.readline()
            writer.close()
        finally:
            outstanding[engine] -= 1
            done.append((time.monotonic(), engine))
            if booking is not None:
                booking.end()

    async def run() -> None:
        tasks: set[asyncio.Task[None]] = set()

        def go() -> None:
            task = asyncio.ensure_future(dispatch())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        conn.send("ready")
        start = await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # a wall time
        await asyncio.sleep(max(0.0, start - time.time()))
        if kind == "poisson":  # the same arrival times in every mode (seeded), caught up when late
            times, at, seeded = [], 0.0, random.Random(plan["seed"] * 100 + replica)
            while at < plan["seconds"]:
                at += seeded.expovariate(rate)
                times.append(start + at)
            for due in times:
                if due > time.time():
                    await asyncio.sleep(due - time.time())
                go()
        else:
            for b in range(plan["bursts"]):
                await asyncio.sleep(max(0.0, start + plan["gap"] * b - time.time()))
                for _ in range(int(BURST * share)):
                    go()
        while tasks:
            await asyncio.sleep(0.05)
        conn.send("done")

    asyncio.run(run())
    if view is not None:
        view.stop()
    if bookings is not None:
        bookings.close()


def run_mode(
    url: str, ports: list[int], engines_conn: Any, mode: str, kind: str, plan: dict[str, Any]
) -> dict[str, float]:
    replicas = 1 if mode == "iv" else plan["replicas"]
    capacity = ENGINES * plan["slots"] / plan["service"]
    rate = plan["load"] * capacity / replicas
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for replica in range(replicas):
        mine, theirs = ctx.Pipe()
        args = (url, "bench", ports, mode, kind, replica, rate, plan, theirs)
        proc = ctx.Process(target=router_main, args=args, daemon=True)
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    for pipe in pipes:
        pipe.recv()
    time.sleep(0.5)  # the views' first reads
    engines_conn.send("start")
    start = time.time() + 0.2
    for pipe in pipes:
        pipe.send(start)
    for pipe in pipes:
        pipe.recv()
    engines_conn.send("end")
    imbalance, waits, lag = engines_conn.recv()
    for proc in procs:
        proc.join(timeout=10)
    return {
        "imbalance": imbalance,
        "lag_ms": 1000 * lag,
        "p99_wait_ms": 1000 * waits[int(0.99 * (len(waits) - 1))] if waits else float("nan"),
        "p50_wait_ms": 1000 * waits[len(waits) // 2] if waits else float("nan"),
        "requests": len(waits),
    }


def table(kind: str, results: dict[str, dict[str, float]]) -> None:
    """The Markdown table of one traffic kind, each mode against the ideal (iv)."""
    ideal = results.get("iv")
    if not ideal:
        return
    print(
        f"\n{kind}:\n\n| view | imbalance (max/mean) | vs (iv) | p99 queue wait | vs (iv) | p50 | loop lag |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(
            f"| ({mode}) {MODES[mode]} | {r['imbalance']:.3f} | {r['imbalance'] / ideal['imbalance']:.2f}x "
            f"| {r['p99_wait_ms']:.0f} ms | {r['p99_wait_ms'] / max(ideal['p99_wait_ms'], 1e-9):.2f}x "
            f"| {r['p50_wait_ms']:.0f} ms | {r['lag_ms']:.1f} ms |"
        )
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of Poisson arrivals per mode")
    parser.add_argument("--bursts", type=int, default=2, help="bursts of 512 requests per mode")
    parser.add_argument("--load", type=float, default=0.8, help="the Poisson rate, a share of capacity")
    parser.add_argument("--slots", type=int, default=4, help="requests an engine serves at once")
    parser.add_argument("--service", type=float, default=1.0, help="mean service time (s)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument(
        "--view", type=float, default=0.05, help="seconds between a replica's reads of the feed"
    )
    parser.add_argument("--modes", default="i,ii,iii,iv")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every mode (medians reported)")
    parser.add_argument("--lane", type=float, default=0.08, help="the engines' writer's load_interval (s)")
    parser.add_argument("--kinds", default="poisson,burst", help="the traffic: poisson, burst or both")
    parser.add_argument(
        "--seed", type=int, default=1, help="the Poisson arrivals' seed (every mode the same)"
    )
    opts = parser.parse_args()
    plan = vars(opts)
    # seconds between two bursts: one burst drains (512 requests over every slot) well before the next
    plan["gap"] = max(3.0, 1.5 * BURST * opts.service / (ENGINES * opts.slots))
    server = EmbeddedRedis().start()
    ports = [free_port() for _ in range(ENGINES)]
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    engines = ctx.Process(
        target=engines_main,
        args=(server.url, "bench", ports, opts.slots, opts.service, opts.lane, theirs),
        daemon=True,
    )
    engines.start()
    try:
        mine.recv()
        time.sleep(1.5)  # every writer's first flush
        modes = opts.modes.split(",")
        for kind in opts.kinds.split(","):
            runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for r in range(opts.rounds):
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    runs[mode].append(got := run_mode(server.url, ports, mine, mode, kind, plan))
                    print(
                        f"{kind} ({mode}) {MODES[mode]}: imbalance {got['imbalance']:.3f}, queue wait p50 "
                        f"{got['p50_wait_ms']:.1f} ms, p99 {got['p99_wait_ms']:.1f} ms ({got['requests']} "
                        f"requests, engines' loop lag {got['lag_ms']:.1f} ms)",
                        flush=True,
                    )
                    time.sleep(1.0)
            table(
                kind, {m: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for m, rs in runs.items()}
            )
        mine.send("stop")
        engines.join(timeout=10)
    finally:
        engines.kill()
        server.close()


if __name__ == "__main__":
    main()
