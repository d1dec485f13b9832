"""The read side of a busy fleet under production conditions: threads, memory over time, forks.

A private redis-server (never port 6379), *engines* x 2 simulated vLLM API servers with the full
catalogue (``bench/scrape_full.py``'s ``fill``/``churn``), and one reader (one ``RedisCollector``)
read the way an exporter reads it:

- ``threads``: 2-8 threads call ``render_text()`` and ``snapshot()`` on one collector/reader
  while the writers flush between them. Each body is checked against what a fresh reader of its
  own renders (and decodes) from the same reply; then the writers stop and every thread's body
  must equal a fresh reader's of the frozen store, no series twice or missing.
- ``memory``: a few hundred scrapes while every chunk changes, writers restart with new ids
  (each deploy), engines come and go (gc removes the departed ones) and names fields change
  (new label values of ``vllm:lora_requests_info``): RSS, ``tracemalloc`` of the reader's modules
  and the size of the reader's caches (names fields, render plans), every few rounds.
- ``fork``: a process forks while another thread is in the middle of a read (gunicorn
  ``--preload``): the child's first scrape must equal a fresh reader's, and not hang.

- ``ring``: the memory of one decoded snapshot, as ``/snapshot``'s window keeps them.

Usage: python bench/read_attack.py [--engines 256] [--section threads,memory,fork,ring]
       [--rounds 300] [--threads 2,4,8]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scrape_full import _imports, churn, fill
from redis_stats._core.read import decoder, groups
from redis_stats.prometheus.exposition import TextRenderer

# Lines whose values move with the clock or the call (not the data).
VOLATILE = (
    "redis_stats_read_duration_seconds",
    "redis_stats_engine_data_age_seconds",
    "redis_stats_writer_last",
)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def stable(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if not line.startswith(VOLATILE))


def series_of(snap: Any) -> Any:
    return {
        e: [sorted(d.items()) for d in (s.counters, s.gauges, s.histograms)] for e, s in snap.engines.items()
    }


def twice_or_missing(body: str, reference: str) -> list[str]:
    names = [line.rpartition(" ")[0] for line in body.splitlines() if line and not line.startswith("#")]
    ref = {line.rpartition(" ")[0] for line in reference.splitlines() if line and not line.startswith("#")}
    wrong = [f"twice: {s}" for s, n in Counter(names).items() if n > 1]
    missing, extra = ref - set(names), set(names) - ref
    if missing or extra:
        wrong.append(f"missing {sorted(missing)[:2]} extra {sorted(extra)[:2]}")
    return wrong


class Fleet:
    """Writers of *engines* engines x 2 API servers on one namespace."""

    def __init__(self, rs: Any, url: str, namespace: str, engines: int) -> None:
        self.rs, self.url, self.namespace = rs, url, namespace
        self.engines = list(range(engines))
        self.made = fill(rs, url, namespace, engines, 2)
        self.lock = threading.Lock()

    def config(self, **kw: Any) -> Any:
        return self.rs.StatsConfig(url=self.url, namespace=self.namespace, socket_timeout_ms=30_000, **kw)

    def writer(self, w: int) -> Any:
        return self.rs.StatsWriter(
            self.config(), self.rs.vllm_catalog(), engines=self.engines, start=False, role=f"api{w}"
        )

    def reader(self) -> Any:
        return self.rs.StatsReader(self.config(), self.rs.vllm_catalog())

    def churn(self) -> None:
        with self.lock:
            churn(self.made)

    def restart(self, rnd: random.Random) -> None:
        """Every writer closes and a new one (a new id) takes its engines: a deploy."""
        rs = self.rs
        with self.lock:
            old = self.made
            self.made = []
            for w, (writer, _) in enumerate(old):
                writer.close()
                new = self.writer(w)
                sims = [
                    rs.SimulatedApiServer(rs.VllmRecorder(new, "model", [e]), e, seed=rnd.randrange(1 << 30))
                    for e in self.engines
                ]
                now = time.monotonic()
                for step in range(3):
                    for sim in sims:
                        sim.step(now + step * 0.05)
                assert new.flush()
                self.made.append((new, sims))

    def new_label_values(self, rnd: random.Random, share: float) -> None:
        """A share of engines sees a new LoRA adapter set: a new series, so a new names field."""
        with self.lock:
            for writer, _ in self.made:
                for e in self.engines:
                    if rnd.random() < share:
                        writer.metric("vllm:lora_requests_info").labels(
                            e,
                            max_lora="4",
                            waiting_lora_adapters="",
                            running_lora_adapters=f"a{rnd.randrange(10**6)}",
                        ).set(time.time())
                assert writer.flush()

    def move_engines(self, count: int) -> None:
        """*count* engines stop (gc removes them); as many new engine indexes start."""
        from redis_stats.ops.retention import collect_garbage

        rs = self.rs
        with self.lock:
            gone = self.engines[:count]
            start = self.engines[-1] + 1
            self.engines = self.engines[count:] + list(range(start, start + count))
            old = self.made
            self.made = []
            for writer, _ in old:
                writer.close()
            time.sleep(1.0)  # the departed engines' and writers' last heartbeat is 1 s old
            for w, (_, sims) in enumerate(old):
                new = self.writer(w)
                keep = [s for s in sims if s.engine not in gone]
                for sim in keep:
                    sim.recorder = rs.VllmRecorder(new, "model", [sim.engine])
                sims = keep + [
                    rs.SimulatedApiServer(rs.VllmRecorder(new, "model", [e]), e, seed=w * 100_000 + e)
                    for e in range(start, start + count)
                ]
                now = time.monotonic()
                for sim in sims:
                    sim.step(now)
                assert new.flush()
                self.made.append((new, sims))
            churn(self.made)  # every live writer and engine heartbeats just before gc
            # gc removes what has been silent for 0.5 s: the departed engines and writers.
            collect_garbage(self.config(flush_interval=0.05, stale_after=0.1, retention=0.5))


# -- threads -------------------------------------------------------------------------------------


def section_threads(fleet: Fleet, counts: list[int], seconds: float) -> None:
    print("\n== threads: render_text() and snapshot() on one collector/reader, writers flushing ==")
    for n in counts:
        threads_once(fleet, n, seconds)


def threads_once(fleet: Fleet, n: int, seconds: float) -> None:
    rs = fleet.rs
    reader = fleet.reader()
    collector = rs.RedisCollector(reader)
    collector.render_text()
    renderer = collector._renderer
    log: list[tuple[str, Any, Any]] = []
    real_render, real_decode, real_decoded = renderer.render, reader.decode, reader.decoded
    last = threading.local()

    def decoded(reply: Any) -> Any:
        last.reply = reply
        return real_decoded(reply)

    def render(form: Any) -> Any:
        out = real_render(form)
        log.append(("text", last.reply, out))
        return out

    def decode(reply: Any) -> Any:
        out = real_decode(reply)
        log.append(("snap", reply, series_of(out)))
        return out

    renderer.render, reader.decode, reader.decoded = render, decode, decoded
    stop = threading.Event()
    failures: list[BaseException] = []
    reads = Counter[str]()

    def scrape(k: int) -> None:
        try:
            while not stop.is_set():
                if k % 2 == 0:
                    collector.render_text()
                    reads["text"] += 1
                else:
                    reader.snapshot()
                    reads["snap"] += 1
        except BaseException as exc:  # reported below
            failures.append(exc)

    def write() -> None:
        while not stop.is_set():
            fleet.churn()

    threads = [threading.Thread(target=scrape, args=(k,)) for k in range(n)]
    writing = threading.Thread(target=write)
    for t in [*threads, writing]:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in [*threads, writing]:
        t.join()
    assert not failures, failures
    # Each body against what a fresh reader of its own makes of the same reply.
    bad = 0
    for kind, reply, got in log:
        own = fleet.reader()
        if kind == "text":
            want = TextRenderer().render(own.decoded(reply))
        else:
            want = series_of(own.decode(reply))
        bad += got != want
    # Writers frozen: every thread's body equals a fresh reader's, series by series.
    renderer.render, reader.decode = real_render, real_decode
    fresh = fleet.reader()
    want_text = stable(rs.RedisCollector(fresh).render_text())
    want_snap = series_of(fresh.snapshot())
    frozen: list[Any] = []
    barrier = threading.Barrier(n)

    def frozen_read(k: int) -> None:
        barrier.wait()
        for _ in range(3):
            frozen.append(stable(collector.render_text()) if k % 2 == 0 else series_of(reader.snapshot()))

    threads = [threading.Thread(target=frozen_read, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    frozen_bad = sum(1 for x in frozen if x != (want_text if isinstance(x, str) else want_snap))
    problems = sum(len(twice_or_missing(x, want_text)) for x in frozen if isinstance(x, str))
    print(
        f"{n} threads: {reads['text']} renders + {reads['snap']} snapshots while writers flushed "
        f"({len(log)} checked against a fresh reader: {bad} differ); frozen: {len(frozen)} reads, "
        f"{frozen_bad} differ, {problems} series twice or missing"
    )


# -- memory --------------------------------------------------------------------------------------

READER_FILES = ("redis_stats/_core/", "redis_stats/prometheus/", "redis_stats/reader.py")


def caches(reader: Any, collector: Any) -> dict[str, int]:
    """Entries held by the reader's caches: names fields, and the renderer's plans."""
    dec = reader._decoder
    plan = collector._renderer._plan
    plans = plan.layouts if plan is not None else {}
    return {
        "layouts": len(dec._layouts),
        "plans": len(plans),
        "plan_engines": len({e for e, _ in plans}),
        "disjoint": len(dec._disjoint),
    }


def section_memory(fleet: Fleet, rounds: int, every: int, seed: int, trace: bool) -> None:
    print("\n== memory: scrapes with churn, deploys (new writer ids), engines moving, names changing ==")
    print("(every round: every chunk changes, then one render_text() and one snapshot(); every 25th a")
    print("deploy, every 10th a new LoRA adapter set in 30 % of engines, every 50th 1/8 of engines move)")
    rs = fleet.rs
    rnd = random.Random(seed)
    reader = fleet.reader()
    collector = rs.RedisCollector(reader)
    if trace:
        tracemalloc.start(1)
    keys = list(caches(reader, collector))
    print(f"{'round':>6}{'RSS MB':>8}{'reader MB':>10}" + "".join(f"{k:>13}" for k in keys))

    def report(r: int) -> None:
        gc.collect()
        ours = 0.0
        if trace:
            stats = tracemalloc.take_snapshot().statistics("filename")
            ours = sum(s.size for s in stats if any(f in s.traceback[0].filename for f in READER_FILES))
        sizes = caches(reader, collector)
        print(f"{r:>6}{rss_mb():>8.0f}{ours / 1e6:>10.1f}" + "".join(f"{sizes[k]:>13}" for k in keys))

    for r in range(1, rounds + 1):
        fleet.churn()
        if r % 25 == 0:
            fleet.restart(rnd)
        if r % 10 == 5:
            fleet.new_label_values(rnd, 0.3)
        if r % 50 == 10:
            fleet.move_engines(max(1, len(fleet.engines) // 8))
        collector.render_text()
        reader.snapshot()
        if r == 1 or r % every == 0:
            report(r)
    if trace:
        tracemalloc.stop()
    sizes_of_one(reader, collector)


def sizes_of_one(reader: Any, collector: Any) -> None:
    """What one names field's Layout, and one engine's render plan of it, take (tracemalloc)."""
    dec = reader._decoder
    names = max(dec._layouts)
    plan = collector._renderer._plan
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    lines = tuple(names.split("\n"))
    made = [
        groups.Layout(dec.catalog, lines, [groups.parse_field(line, dec.catalog, {}) for line in lines])
        for _ in range(20)
    ]
    mid = tracemalloc.take_snapshot()
    layout = dec.layout(names, dec.catalog)
    plans = [plan.of(str(10**6 + i), layout) for i in range(20)]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_layout = sum(x.size_diff for x in mid.compare_to(before, "filename")) / len(made)
    per_plan = sum(x.size_diff for x in after.compare_to(mid, "filename")) / len(plans)
    print(
        f"one names field of {len(lines)} lines: its text {len(names) / 1e3:.1f} KB, its Layout "
        f"{per_layout / 1e3:.1f} KB; one engine's render plan of it {per_plan / 1e3:.1f} KB"
    )


# -- fork ----------------------------------------------------------------------------------------


def section_fork(fleet: Fleet) -> None:
    print("\n== fork: a child forked while another thread is in the middle of a read ==")
    rs = fleet.rs
    reader = fleet.reader()
    collector = rs.RedisCollector(reader)
    collector.render_text()
    fleet.churn()
    real = decoder.in_bulk
    inside, release = threading.Event(), threading.Event()
    count = [0]

    def paused(*args: Any) -> Any:
        count[0] += 1
        if count[0] == len(fleet.engines) and threading.current_thread().name == "mid-read":
            inside.set()
            release.wait()
        return real(*args)

    decoder.in_bulk = paused  # type: ignore[assignment]
    t = threading.Thread(target=collector.render_text, name="mid-read")
    t.start()
    inside.wait()
    pid = os.fork()
    if pid == 0:  # the child
        code = 3
        try:
            decoder.in_bulk = real
            t0 = time.perf_counter()
            got = stable(collector.render_text())
            took = 1e3 * (time.perf_counter() - t0)
            snap = series_of(reader.snapshot())
            fresh = fleet.reader()
            want = stable(rs.RedisCollector(fresh).render_text())
            code = 0 if (got, snap) == (want, series_of(fresh.snapshot())) else 1
            print(f"child: first scrape {took:.0f} ms, equal to a fresh reader's: {code == 0}")
        finally:
            sys.stdout.flush()
            os._exit(code)
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child: HUNG (killed after 60 s)")
    release.set()
    t.join()
    decoder.in_bulk = real
    if status is not None:
        print(f"child exit code {os.waitstatus_to_exitcode(status)}")


# -- ring ----------------------------------------------------------------------------------------


def section_ring(fleet: Fleet) -> None:
    """What the exporter's /snapshot window holds: a decoded Snapshot per sample and request,
    kept for twice the window (60 s), at most SnapshotRing's maxlen (256)."""
    from redis_stats.server.states.window import SnapshotRing

    print("\n== ring: the memory of one decoded snapshot, as /snapshot's window keeps them ==")
    reader = fleet.reader()
    reader.snapshot()
    fleet.churn()
    reply = reader.read()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    snaps = [reader.decode(reply) for _ in range(3)]
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per = sum(x.size_diff for x in after.compare_to(before, "filename")) / len(snaps)
    maxlen = SnapshotRing(keep=60.0)._ring.maxlen or 0
    print(
        f"one snapshot of {len(fleet.engines)} engines: {per / 1e6:.1f} MB; the ring at its "
        f"maxlen ({maxlen}, e.g. 5 clients polling /snapshot every second for 60 s): "
        f"{maxlen * per / 1e9:.2f} GB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=256)
    parser.add_argument("--section", default="threads,memory,fork")
    parser.add_argument("--rounds", type=int, default=300, help="scrapes of the memory section")
    parser.add_argument("--every", type=int, default=25, help="report every so many rounds")
    parser.add_argument("--no-trace", action="store_true", help="memory: RSS only (tracemalloc is slow)")
    parser.add_argument("--threads", default="2,4,8")
    parser.add_argument("--seconds", type=float, default=8.0, help="of each thread count")
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args()
    rs = _imports()
    print(f"redis_stats from {rs.package}; {opts.engines} engines x 2 writers, full vLLM catalogue")
    with rs.EmbeddedRedis() as server:
        for name in opts.section.split(","):
            fleet = Fleet(rs, server.url, f"attack-{name}", opts.engines)
            if name == "threads":
                section_threads(fleet, [int(x) for x in opts.threads.split(",")], opts.seconds)
            elif name == "memory":
                section_memory(fleet, opts.rounds, opts.every, opts.seed, not opts.no_trace)
            elif name == "fork":
                section_fork(fleet)
            elif name == "ring":
                section_ring(fleet)
            for writer, _ in fleet.made:
                writer._closed = True


if __name__ == "__main__":
    main()
