"""``make nemesis``: the run (its seed printed first), then the checker over what it recorded.

    python -m tests.nemesis.run [--seed N] [--duration S] [--dir DIR]

Exit status 0 when the checker found no anomaly. The history stays in DIR (a temporary directory
by default, printed) for a look after the fact.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis_stats.tools.embedded import free_port
from tests.nemesis import checker
from tests.nemesis.cluster import Processes, Server, previous_release, wait_port
from tests.nemesis.history import Recorder
from tests.nemesis.schedule import EVICTION_POLICIES, PROCESS_SLOTS, Fault, make_schedule
from tests.nemesis.workers import get, ledger, states
from tests.proxy import CuttingProxy
from tests.store.test_load_rolling_upgrade import LAST_RELEASE

WRITER_KINDS = ("sync", "sync-old", "asyncio", "fork")
SNAPSHOT_EVERY = 8.0  # seconds between two RDBs kept for time travel


class Nemesis:
    """The deployment, and the faults applied to it as the schedule says."""

    def __init__(self, directory: Path, seed: int, duration: float) -> None:
        self.dir = directory
        self.seed = seed
        self.duration = duration
        self.rec = Recorder(directory, "harness")
        self.namespace = f"nemesis{seed}"
        self.server = Server(directory / "redis", self.rec)
        self.server.start()
        # A replica, promoted by a failover (the master's snapshots are the pair's).
        self.replica = Server(directory / "replica", self.rec, replica_of=self.server.port)
        self.replica.snapshots = self.server.snapshots
        self.replica.start()
        self.synced_at: float | None = None
        self.proxies = {
            "w": CuttingProxy(self.server.port, seed=seed),
            "r": CuttingProxy(self.server.port, seed=seed + 1),
        }
        self.procs = Processes(directory, self.rec, self.namespace, seed)
        self.procs.old_release = previous_release(LAST_RELEASE, directory / "previous-release")
        self.exporter_ports = {"exp0": free_port(), "exp1": free_port()}
        self.injected: Counter[str] = Counter()
        self.t0 = time.monotonic()

    def deploy(self) -> None:
        w, r = self.proxies["w"].url, self.proxies["r"].url
        for engine, (slot, kind) in enumerate(s for s in PROCESS_SLOTS.items() if s[1] in WRITER_KINDS):
            self.procs.add(slot, kind, w, [str(engine)])
        for slot, port in self.exporter_ports.items():
            self.procs.add(slot, "exporter", r, ["--port", str(port), "--host", "127.0.0.1"])
        for slot in ("lease0", "lease1", "lease2"):
            self.procs.add(slot, "lease", w, [])
        self.procs.add("watch0", "watch", r, [str(self.exporter_ports["exp0"])])
        self.procs.add("watch1", "watch", r, [str(self.exporter_ports["exp1"])])
        self.procs.add("observer", "observe", r, [str(p) for p in self.exporter_ports.values()])
        for slot in [*PROCESS_SLOTS, "observer"]:
            if slot == "old0" and self.procs.old_release is None:
                print(
                    f"nemesis: no {LAST_RELEASE} in the git history here: no writer of the previous release"
                )
                continue
            self.procs.start(slot)
        for port in self.exporter_ports.values():
            wait_port(port)
        self.t0 = time.monotonic()  # the schedule's offsets count from here
        self.rec("deployed", seed=self.seed, duration=self.duration)

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- faults: each a start and an end ----------------------------------------------------

    def begin(self, fault: Fault) -> None:
        of = PROCESS_SLOTS.get(fault.target)
        self.rec("fault", phase="start", what=fault.describe(), kind=fault.kind, target=fault.target, of=of)
        self.injected[f"{fault.kind} {of}" if of else fault.kind] += 1
        self._apply(fault, on=True)

    def end(self, fault: Fault) -> None:
        self._apply(fault, on=False)
        self.rec("fault", phase="end", what=fault.describe(), kind=fault.kind, target=fault.target)

    def _apply(self, fault: Fault, on: bool) -> None:
        actions: dict[str, Callable[[Fault, bool], None]] = {
            "redis-kill": self._redis_kill,
            "redis-travel": self._redis_travel,
            "redis-freeze": lambda f, on: self.server.freeze(on),
            "evict": lambda f, on: self.server.squeeze(on, EVICTION_POLICIES[int(f.param)]),
            "failover": self._failover,
            "kill": self._kill,
            "pause": lambda f, on: self.procs.pause(f.target, on),
        }
        action = actions.get(fault.kind)
        if fault.target in PROCESS_SLOTS and fault.target not in self.procs.argv:
            return  # a slot this run has not (no previous release here)
        if action is not None:
            action(fault, on)
        else:
            self._proxy(fault, on)

    def _redis_kill(self, fault: Fault, on: bool) -> None:
        if on:
            self.server.kill()
        elif self.server.process is None:
            self.server.start()

    def _failover(self, fault: Fault, on: bool) -> None:
        """Start: the replica stops applying (once it holds everything); end: the master is killed,
        the lagging replica promoted, the clients sent to it, the old master its replica."""
        if on:
            self.synced_at = self.server.in_sync()
            if self.synced_at is not None:
                self.rec("replica_synced", taken=self.synced_at)
                self.replica.freeze(True)
            else:  # still syncing (after a restart or the last failover): no failover this time
                self.rec("failover_skipped")
                self.injected["failover skipped (replica not in sync)"] += 1
            return
        if self.synced_at is None or self.server.process is None:
            return
        self.rec("loss")
        self.server.kill()
        self.replica.freeze(False)
        self.replica.promote()
        old, self.server, self.replica = self.server, self.replica, self.server
        for proxy in self.proxies.values():
            proxy.retarget(self.server.port)
        self.rec("failover", taken=self.synced_at)
        self.rec("redis_up", pid=self.server.process.pid if self.server.process else None)
        old.follow(self.server)

    def _redis_travel(self, fault: Fault, on: bool) -> None:
        if on:
            self.rec("loss")
            self.server.kill()
        elif self.server.process is None:
            self.server.restart_from_older(int(fault.seconds * 10))

    def _kill(self, fault: Fault, on: bool) -> None:
        if on:
            self.procs.kill(fault.target)
            self.rec("killed", slot=fault.target)
        else:
            self.procs.start(fault.target, skew=fault.param)

    def _proxy(self, fault: Fault, on: bool) -> None:
        proxy = self.proxies[fault.target]
        if fault.kind == "delay":
            proxy.delay = fault.param if on else 0.0
        elif fault.kind == "cut":
            proxy.cut_probability = fault.param if on else 0.0
        elif fault.kind == "reset":
            proxy.reset_probability = fault.param if on else 0.0
        elif fault.kind == "partition":
            if on:
                proxy.stall()
            else:
                proxy.resume()
        elif fault.kind == "server-clock":
            proxy.shift_ms = int(fault.param) if on else 0

    # -- the run -----------------------------------------------------------------------------

    def run(self, schedule: list[Fault]) -> None:
        queue: list[tuple[float, int, str, Fault | None]] = []
        for i, fault in enumerate(schedule):
            heapq.heappush(queue, (fault.at, i, "begin", fault))
        n = len(schedule)
        t = SNAPSHOT_EVERY
        while t < self.duration:
            n += 1
            heapq.heappush(queue, (t, n, "snapshot", None))
            t += SNAPSHOT_EVERY
        while queue:
            at, i, what, fault = heapq.heappop(queue)
            if at > self.duration - 25:  # the quiet end: no fault, no snapshot
                continue
            time.sleep(max(0.0, at - self.now()))
            if fault is None:
                self.server.snapshot()
            elif what == "begin":
                self.begin(fault)
                heapq.heappush(queue, (at + fault.seconds, i, "end", fault))
            else:
                self.end(fault)
        self.rec("quiet")

    def finish(self) -> None:
        """Heal, let the writers catch up, close them, read the end state."""
        for proxy in self.proxies.values():
            proxy.delay, proxy.cut_probability, proxy.reset_probability, proxy.shift_ms = 0.0, 0.0, 0.0, 0
            proxy.resume()
        time.sleep(max(0.0, self.duration - 16 - self.now()))
        self.drain()
        writers = [s for s, k in PROCESS_SLOTS.items() if k in WRITER_KINDS]
        self.procs.terminate(writers)
        self._end_orphans()
        time.sleep(1.0)
        self.rec("writers_closed")
        time.sleep(max(2.0, self.duration - self.now()))
        final_read(self.server.url, self.namespace, self.rec)
        self.procs.terminate([s for s in PROCESS_SLOTS if s not in writers] + ["observer"], timeout=10)

    def drain(self) -> None:
        """Every front end's requests and every router's bookings end: 4 s later every live
        engine's ``in_flight`` and ``booked`` must read 0 on both exporters."""
        (self.dir / "drain").touch()
        self.rec("drain")
        time.sleep(4.0)
        for port in self.exporter_ports.values():
            t0 = time.monotonic()
            status, doc = get(f"http://127.0.0.1:{port}/load", 5.0, "application/json")
            ok = status == 200 and isinstance(doc, dict)
            self.rec("drained", t0=t0, port=port, status=status, states=states(doc) if ok else None)

    def _end_orphans(self) -> None:
        """Forked writers whose parent was killed carry on alone: closed now, by their pids."""
        from tests.nemesis.history import load

        pids = {e["pid"] for e in load(self.dir) if e["k"] == "start" and e.get("forked")}
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"tests.nemesis.workers" in cmdline:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.1)

    def close(self) -> None:
        self.procs.terminate(list(self.procs.argv), timeout=5)
        for proxy in self.proxies.values():
            proxy.close()
        self.server.stop()
        self.replica.stop()


def final_read(url: str, namespace: str, rec: Recorder) -> None:
    """The end state read by the library itself (not through an exporter)."""
    from redis_stats import StatsConfig, StatsReader

    reader = StatsReader(StatsConfig(url=url, namespace=namespace))
    snap = reader.snapshot()
    reader.close()
    rec("final", **checker.snapshot_series(snap), u=ledger(url, namespace))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--duration", type=float, default=180.0)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    if args.duration < 60:
        parser.error("--duration must be at least 60 s (25 s of them are the quiet end)")
    directory = Path(args.dir or tempfile.mkdtemp(prefix=f"nemesis-{seed}-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"nemesis: SEED={seed} DURATION={args.duration:g} history in {directory}", flush=True)
    schedule = make_schedule(seed, args.duration)
    nemesis = Nemesis(directory, seed, args.duration)
    try:
        nemesis.deploy()
        nemesis.run(schedule)
        nemesis.finish()
    finally:
        nemesis.close()
    report = checker.check(directory, seed)
    print(report.summary(nemesis.injected), flush=True)
    return 1 if report.new else 0


def _main() -> Any:
    sys.exit(main())


if __name__ == "__main__":
    _main()
