"""A loopback TCP proxy that can cut a connection after forwarding a request, before the reply.

That is the failure that makes a non-idempotent retry count twice: the server applied the command,
the client never heard so.
"""

from __future__ import annotations

import random
import re
import socket
import threading
import time

from redis_stats.tools.embedded import free_port

# The head of a flush.lua reply (RESP2): an array of 5 to 7, the status, the server time in ms.
_FLUSH_REPLY = re.compile(rb"(\*[5-7]\r\n:[0-3]\r\n:)(\d{13})\r\n")


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<target_port>.

    ``cut_probability``: chance that a reply from the server is dropped and both sides closed
    (the server applied the command; the client never hears so).
    ``reset_probability``: chance that a request is dropped and both sides closed before the
    server sees it. ``delay``: seconds added before each reply is forwarded;
    ``late_probability``: chance that a reply is held ``late_delay`` seconds.
    """

    def __init__(self, target_port: int, *, seed: int = 1) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.cut_probability = 0.0
        self.reset_probability = 0.0
        self.delay = 0.0
        # late_probability: chance that a reply is held late_delay seconds first (past a client's
        # timeout: it gives up, the server has applied the command).
        self.late_probability = 0.0
        self.late_delay = 0.0
        self.lates = 0
        # Added to the server time (ms) in flush.lua's replies: the writers behind this proxy see
        # a server whose clock is this far ahead (emulates a server clock; TIME inside the script,
        # which heartbeats use, stays the server's own).
        self.shift_ms = 0
        # Cleared: nothing is forwarded either way (a stalled link: the bytes wait in the proxy).
        self.flowing = threading.Event()
        self.flowing.set()
        self.cuts = 0
        self.resets = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _should_cut(self, is_reply: bool) -> bool:
        with self._lock:
            if self._rng.random() < (self.cut_probability if is_reply else self.reset_probability):
                if is_reply:
                    self.cuts += 1
                else:
                    self.resets += 1
                return True
            return False

    def _late(self) -> bool:
        with self._lock:
            late = self._rng.random() < self.late_probability
            self.lates += late
            return late

    def _pump(self, src: socket.socket, dst: socket.socket, is_reply: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self.flowing.wait()
                if is_reply and self.delay:
                    time.sleep(self.delay)
                if is_reply and self.late_probability and self._late():
                    time.sleep(self.late_delay)
                if self._should_cut(is_reply):
                    break
                if is_reply and self.shift_ms:
                    data = _FLUSH_REPLY.sub(lambda m: self._shifted(m), data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _shifted(self, m: re.Match[bytes]) -> bytes:
        return m.group(1) + str(int(m.group(2)) + self.shift_ms).encode() + b"\r\n"

    def stall(self) -> None:
        """Hold every byte from now on (connections stay open) until :meth:`resume`."""
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    def retarget(self, target_port: int) -> None:
        """Send new connections to *target_port* and cut the current ones (a failover behind one
        address: the clients reconnect, to the new server)."""
        self.target_port = target_port
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for s in self._conns:
                try:
                    s.close()
                except OSError:
                    pass
