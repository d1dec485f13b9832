"""The deployment of the nemesis run: a real Redis (AOF on, ``appendfsync always``) that can be
killed, restarted from its AOF or from an older RDB, frozen and squeezed under ``maxmemory``; and
the processes of :mod:`tests.nemesis.workers` and the exporters, each started, signalled and
restarted by its pid. Everything listens on 127.0.0.1, on free ports; nothing outlives the run
(each child is tied to this process, tests/servers.py's way)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from redis_stats.tools.embedded import find_server_binary, free_port, tied_to_me
from tests.conftest import PYTHON, ROOT
from tests.nemesis.history import Recorder

__all__ = ["Processes", "Server"]


class Server:
    """One redis-server on a port kept across restarts, in *directory*."""

    def __init__(self, directory: Path, rec: Recorder, replica_of: int | None = None) -> None:
        self.dir = directory
        self.replica_of = replica_of  # the master's port, while this one is a replica
        self.dir.mkdir(parents=True, exist_ok=True)
        self.snapshots: list[tuple[float, Path]] = []  # (when the RDB was taken, its copy)
        self.port = free_port()
        self.binary = find_server_binary("redis")
        self.rec = rec
        self.process: subprocess.Popen[bytes] | None = None
        self.frozen = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, decode_responses=True)

    def start(self, aof: bool = True) -> None:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if aof else "no",
            "--appendfsync", "always",
            "--logfile", str(self.dir / "server.log"),
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if self.replica_of:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        self.process = subprocess.Popen(args, start_new_session=True, preexec_fn=tied_to_me())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    if not self.replica_of:
                        self.rec("redis_up", pid=self.process.pid)
                    return
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.exceptions.ConnectionError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port}: see {self.dir}/server.log")

    def kill(self) -> None:
        """SIGKILL (a crash: nothing saved but what the AOF holds)."""
        if self.process is None:
            return
        if self.frozen:
            os.kill(self.process.pid, signal.SIGCONT)
            self.frozen = False
        self.process.kill()
        self.process.wait()
        self.process = None
        if not self.replica_of:
            self.rec("redis_down")

    def restart_from_older(self, index: int) -> float | None:
        """Start again from a snapshot taken earlier (the *index*-th from the newest, modulo): the
        AOF removed, the RDB copied in, then AOF switched on again. Its time, or None (none yet:
        restarted from the AOF instead)."""
        if not self.snapshots:
            self.start()
            return None
        taken, path = self.snapshots[-1 - index % min(8, len(self.snapshots))]  # up to ~a minute back
        shutil.rmtree(self.dir / "appendonlydir", ignore_errors=True)
        shutil.copy(path, self.dir / "dump.rdb")
        self.start(aof=False)
        self.client().config_set("appendonly", "yes")  # a rewrite from what was loaded
        self.rec("travel", taken=taken)
        return taken

    def snapshot(self) -> None:
        """An RDB of now, kept for a later time travel (when Redis can take one: not while
        frozen, rewriting its AOF or down)."""
        if self.process is None or self.frozen:
            return
        try:
            c = self.client()
            before = c.lastsave()
            c.bgsave()
            taken = time.monotonic()
            deadline = taken + 10
            while c.lastsave() == before and time.monotonic() < deadline:
                time.sleep(0.05)
            if c.lastsave() == before:
                return
        except redis.exceptions.RedisError:
            return
        copy = self.dir / f"older-{len(self.snapshots)}.rdb"
        shutil.copy(self.dir / "dump.rdb", copy)
        self.snapshots.append((taken, copy))
        self.rec("rdb", taken=taken)

    def in_sync(self) -> float | None:
        """When the replica last held everything this master had applied: a write of its own
        (a key outside the store) that ``WAIT`` saw the replica acknowledge; None when it did
        not within a second (the replica still syncing)."""
        try:
            c = self.client()
            taken = time.monotonic()
            c.set("nemesis:sync", str(taken))
            return taken if c.wait(1, 1000) >= 1 else None
        except redis.exceptions.RedisError:
            return None

    def promote(self) -> None:
        """This replica becomes the master (``REPLICAOF NO ONE``)."""
        self.client().replicaof("NO", "ONE")
        self.replica_of = None

    def follow(self, master: Server) -> None:
        """Start again as a replica of *master* (this one's data given up: a full sync)."""
        shutil.rmtree(self.dir / "appendonlydir", ignore_errors=True)
        (self.dir / "dump.rdb").unlink(missing_ok=True)
        self.replica_of = master.port
        self.start()

    def freeze(self, on: bool) -> None:
        if self.process is None or self.frozen == on:
            return
        os.kill(self.process.pid, signal.SIGSTOP if on else signal.SIGCONT)
        self.frozen = on
        if not self.replica_of:  # a frozen replica is a lagging one, not an outage
            self.rec("redis_frozen" if on else "redis_thawed")

    def squeeze(self, on: bool, policy: str) -> None:
        """``maxmemory`` just under what is used, under *policy* (refusing writes, evicting keys
        with a TTL, or evicting any), or off."""
        if self.process is None or self.frozen:
            return
        try:
            c = self.client()
            if on:
                used = int(c.info("memory")["used_memory"])
                c.config_set("maxmemory-policy", policy)
                c.config_set("maxmemory", str(max(1, int(used * 0.8))))
                self.rec("evict", policy=policy, lru=policy.startswith("allkeys"))
            else:
                c.config_set("maxmemory", "0")
                self.rec("evict_end")
        except redis.exceptions.RedisError:
            pass

    def stop(self) -> None:
        if self.frozen and self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


class Processes:
    """The run's processes by slot: start, signal, restart (a new incarnation, a new name)."""

    def __init__(self, directory: Path, rec: Recorder, namespace: str, seed: int) -> None:
        self.dir = directory
        self.rec = rec
        self.namespace = namespace
        self.seed = seed
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.old_release: Path | None = None  # a tree of the previous release's redis_stats
        self.incarnation: dict[str, int] = {}
        self.argv: dict[str, tuple[str, list[str]]] = {}  # slot -> (kind, extra args)
        self.urls: dict[str, str] = {}
        self.stopped: set[str] = set()

    def add(self, slot: str, kind: str, url: str, extra: list[str]) -> None:
        self.argv[slot] = (kind, extra)
        self.urls[slot] = url

    def start(self, slot: str, skew: float = 0.0) -> None:
        kind, extra = self.argv[slot]
        n = self.incarnation[slot] = self.incarnation.get(slot, -1) + 1
        name = f"{slot}.{n}"
        env = dict(os.environ, NEMESIS_SKEW=str(skew), PYTHONPATH=str(ROOT))
        log = open(self.dir / f"{name}.log", "ab")
        if kind == "exporter":
            argv = [
                str(Path(PYTHON).with_name("redis-stats")), "exporter",
                "--redis-url", self.urls[slot], "--namespace", self.namespace, *extra,
            ]  # fmt: skip
        else:
            argv = [PYTHON, "-m", "tests.nemesis.workers", kind.removesuffix("-old"), str(self.dir), name,
                    self.urls[slot], self.namespace, str(self.seed * 100 + n), *extra]  # fmt: skip
        root = ROOT
        if kind.endswith("-old") and self.old_release is not None:
            root = self.old_release
            env["PYTHONPATH"] = str(root)
        self.procs[slot] = subprocess.Popen(
            argv, cwd=root, env=env, stdout=log, stderr=log, preexec_fn=tied_to_me()
        )
        log.close()
        self.stopped.discard(slot)
        self.rec("spawn", slot=slot, name=name, pid=self.procs[slot].pid, skew=skew)

    def kill(self, slot: str) -> None:
        proc = self.procs.get(slot)
        if proc is not None and proc.poll() is None:
            if slot in self.stopped:
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
        self.stopped.discard(slot)

    def pause(self, slot: str, on: bool) -> None:
        proc = self.procs.get(slot)
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGSTOP if on else signal.SIGCONT)
        (self.stopped.add if on else self.stopped.discard)(slot)

    def alive(self, slot: str) -> bool:
        proc = self.procs.get(slot)
        return proc is not None and proc.poll() is None

    def terminate(self, slots: list[str], timeout: float = 30.0) -> None:
        """SIGTERM (the writers close), then wait; SIGKILL what is left at *timeout*."""
        for slot in slots:
            proc = self.procs.get(slot)
            if proc is not None and proc.poll() is None:
                if slot in self.stopped:
                    os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        deadline = time.monotonic() + timeout
        for slot in slots:
            proc = self.procs.get(slot)
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def previous_release(commit: str, into: Path) -> Path | None:
    """A tree with *commit*'s ``redis_stats`` and this checkout's nemesis workers (what a writer
    of the previous release runs here), or None without that commit in the git history (of this
    checkout, or of ``NEMESIS_GIT``: a run from a copy of the tree names the repository)."""
    try:
        archive = subprocess.run(
            ["git", "-C", os.environ.get("NEMESIS_GIT") or str(ROOT), "archive", commit, "redis_stats"],
            check=True,
            capture_output=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    (into / "tests" / "nemesis").mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=60)
    (into / "tests" / "__init__.py").write_text("")
    for name in ("__init__.py", "history.py", "workers.py"):
        shutil.copy(ROOT / "tests" / "nemesis" / name, into / "tests" / "nemesis" / name)
    return into


def wait_port(port: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")
