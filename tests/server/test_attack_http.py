"""Attacks on the exporter's HTTP server: clients that hold a connection without ever finishing
a request (slowloris). Each such connection holds one thread and one file descriptor of the
exporter, so enough of them starve Prometheus' scrapes."""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time

from redis_stats import StatsReader
from redis_stats.server import Exporter
from tests.conftest import sample_catalog
from tests.server import states


def _exporter(config, fake_client, timeout: float) -> Exporter:
    reader = StatsReader(config, sample_catalog(), client=fake_client())
    return Exporter(reader, port=0, request_timeout=timeout).start()


def _trickle(port: int, seconds: float, every: float = 0.1) -> tuple[bool, float]:
    """Send a never-ending request one byte at a time; (still open after *seconds*, time held)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    started = time.monotonic()
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Padding: y\r\n" * 1000
    try:
        for byte in request:
            if time.monotonic() - started > seconds:
                return True, time.monotonic() - started
            s.sendall(bytes([byte]))
            time.sleep(every)
            s.setblocking(False)
            try:
                if s.recv(1) == b"":  # closed by the server
                    return False, time.monotonic() - started
            except BlockingIOError:
                pass
            finally:
                s.setblocking(True)
        return True, time.monotonic() - started
    except OSError:  # reset by the server
        return False, time.monotonic() - started
    finally:
        s.close()


def test_a_client_trickling_its_request_is_closed_within_the_request_timeout(config, fake_client):
    # request_timeout is "a client that sends no request for that long is disconnected": a client
    # sending one byte every 0.1 s never completes a request, and must not hold its thread for ever.
    exporter = _exporter(config, fake_client, 0.5)
    try:
        still_open, held = _trickle(exporter.port, seconds=4.0)
        assert not still_open, f"a trickling client held its connection for {held:.1f} s (timeout 0.5 s)"
        assert held < 2.0
    finally:
        exporter.close()


def test_trickling_clients_free_their_threads_and_scrapes_go_on(config, fake_client):
    exporter = _exporter(config, fake_client, 0.5)
    before = threading.active_count()
    try:
        results: list[tuple[bool, float]] = []
        clients = [
            threading.Thread(target=lambda: results.append(_trickle(exporter.port, seconds=3.0)))
            for _ in range(10)
        ]
        for c in clients:
            c.start()
        time.sleep(0.3)
        conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=10)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200
        conn.close()
        for c in clients:
            c.join()
        assert [open_ for open_, _ in results] == [False] * 10
        deadline = time.monotonic() + 5
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= before
    finally:
        exporter.close()


def test_a_slow_but_complete_request_within_the_timeout_is_answered(config, fake_client):
    # The deadline is for the whole request, not shorter: a request sent in pieces within it works.
    exporter = _exporter(config, fake_client, 2.0)
    try:
        s = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
        for piece in (b"GET /hea", b"lthz HTTP/1.0\r\n", b"Host: x\r\n", b"\r\n"):
            s.sendall(piece)
            time.sleep(0.2)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        assert data.startswith(b"HTTP/1.0 200") and b'"status": "ok"' in data
    finally:
        exporter.close()


def test_close_without_start_returns_and_frees_the_port(config, fake_client):
    # Before: close() waited for ever (socketserver's shutdown() waits for a serve_forever()
    # that never ran), e.g. in a finally after a failure between construction and start().
    exporter = Exporter(StatsReader(config, sample_catalog(), client=fake_client()), port=0)
    port = exporter.port
    closer = threading.Thread(target=exporter.close, daemon=True)
    closer.start()
    closer.join(5)
    assert not closer.is_alive(), "Exporter.close() hung"
    with socket.create_server(("127.0.0.1", port)):  # the port is free again
        pass


def _open_idle(port: int, n: int) -> list[socket.socket]:
    """*n* connections that have sent half a request and wait (each holds a server thread)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        socks.append(s)
    return socks


def test_connections_past_the_cap_get_503_at_once_and_served_ones_keep_going(config, fake_client):
    # One thread per connection with no bound: a burst of clients grew threads without limit.
    reader = StatsReader(config, sample_catalog(), client=fake_client())
    exporter = Exporter(reader, port=0, request_timeout=5.0, max_connections=4, self_metrics=True).start()
    before = threading.active_count()
    held = _open_idle(exporter.port, 4)
    try:
        time.sleep(0.3)
        assert threading.active_count() - before <= 4
        extra = [socket.create_connection(("127.0.0.1", exporter.port), timeout=10) for _ in range(20)]
        started = time.monotonic()
        for s in extra:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            s.close()
            assert data.split(b" ", 2)[1] == b"503", data[:80]
            assert b"Retry-After: 1" in data and b"too many connections" in data
        assert time.monotonic() - started < 3.0  # answered at once, not after the held ones time out
        assert threading.active_count() - before <= 4  # no thread per refused connection
        # the held connections finish their requests and are answered normally
        for s in held:
            s.sendall(b"Host: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            assert data.split(b" ", 2)[1] == b"200", data[:80]
        # their slots are free again: a new scrape is served, and shows the refusals
        deadline = time.monotonic() + 5
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=10)
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            body = resp.read().decode()
            conn.close()
            if resp.status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert resp.status == 200
        assert "redis_stats_exporter_connections_refused_total 20.0" in body
    finally:
        for s in held:
            s.close()
        exporter.close()


def test_max_connections_must_be_a_positive_whole_number(config, fake_client):
    reader = StatsReader(config, sample_catalog(), client=fake_client())
    for bad in (0, -1, 2.5, True, "8"):
        try:
            Exporter(reader, port=0, max_connections=bad)  # type: ignore[arg-type]
        except ValueError as exc:
            assert "max_connections" in str(exc) and repr(bad) in str(exc)
        else:
            raise AssertionError(f"max_connections={bad!r} accepted")


def test_concurrent_first_snapshot_requests_start_one_sampler(config, fake_client, monkeypatch):
    # The first /snapshot request starts the window sampler; several first requests at once each
    # started one (check, then set: no lock), and every extra sampler read Redis for ever.
    reader = StatsReader(config, sample_catalog(), client=fake_client())
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        if self.name == "redis_stats-window":
            started.append(self.name)
            return  # counted, not run
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up
    try:
        extra = 0
        for _ in range(100):
            exporter = Exporter(reader, port=0)
            started.clear()
            barrier = threading.Barrier(6)

            def first_request(exporter: Exporter = exporter, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                states.window(exporter).asked()

            threads = [threading.Thread(target=first_request) for _ in range(6)]
            for t in threads:
                real_start(t)
            for t in threads:
                t.join()
            exporter.close()
            extra += len(started) - 1
    finally:
        sys.setswitchinterval(old_interval)
    assert extra == 0, f"{extra} extra window samplers started over 100 exporters"


def test_a_refused_client_still_sending_a_large_request_gets_the_503_not_a_reset(config, fake_client):
    # The 503 was written and the socket closed without reading the request: unread data makes
    # the kernel send a reset, and the client lost the 503 (or its send failed).
    reader = StatsReader(config, sample_catalog(), client=fake_client())
    exporter = Exporter(reader, port=0, request_timeout=5.0, max_connections=1).start()
    held = _open_idle(exporter.port, 1)
    try:
        time.sleep(0.2)
        body = b"x" * (512 * 1024)
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
            request = (
                b"POST /metrics HTTP/1.1\r\nHost: x\r\n"
                + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"y" * 1000) for i in range(32))
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )
            s.sendall(request)  # all of it before reading, as a client posting a body does
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            s.close()
            assert data.split(b" ", 2)[1] == b"503", data[:80]
            assert b"too many connections" in data
    finally:
        for s in held:
            s.close()
        exporter.close()


def test_close_during_a_flood_of_silent_refused_clients_ends_the_responder_thread(config, fake_client):
    # The responder spends up to 2 x _BUSY_WAIT on a client that sends nothing and never hangs
    # up: with a dozen queued, close() gave up waiting for it, then took the queued sockets and
    # the stop sentinel with them, and the thread waited on the empty queue for ever (one thread
    # leaked per exporter closed under a flood).
    reader = StatsReader(config, sample_catalog(), client=fake_client())
    exporter = Exporter(reader, port=0, request_timeout=5.0, max_connections=1).start()
    held = _open_idle(exporter.port, 1)
    silent = []
    try:
        time.sleep(0.2)
        silent = [socket.create_connection(("127.0.0.1", exporter.port), timeout=10) for _ in range(12)]
        time.sleep(0.3)  # all accepted and queued (the responder is on the first)
    finally:
        exporter.close()
        for s in held + silent:
            s.close()

    def busy() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "redis_stats-exporter-busy"]

    deadline = time.monotonic() + 5.0
    while busy() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not busy()
