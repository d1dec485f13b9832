"""One deadline for a scrape's whole exchange: a source that trickles (its TLS handshake, its
status line and headers, its body) or goes silent after the connect is cut off at `--timeout`."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from redis_stats import StatsConfig
from redis_stats.integrations.bridge import BridgedSource
from tests.helpers.metrics_source import SyntheticCatalogue, serve
from tests.servers import make_certificates

from .compare import store_samples

TIMEOUT = 1.0
TRICKLE = 8.0  # seconds a slow source keeps trickling (a scrape held by it lasts that long)


def _trickle(conn: socket.socket, data: bytes, until: float) -> None:
    """*data* a byte every 50 ms (then the same byte again) until *until*: each receive of the
    client gets something well within its socket timeout."""
    i = 0
    while time.monotonic() < until:
        conn.sendall(data[i % len(data) : i % len(data) + 1])
        i += 1
        time.sleep(0.05)


def _serve(conn: socket.socket, mode: str) -> None:
    until = time.monotonic() + TRICKLE
    try:
        conn.settimeout(TRICKLE + 2)
        if mode == "tls":
            # A TLS record header (handshake, 16 KiB) whose body then comes a byte at a time.
            conn.sendall(b"\x16\x03\x03\x40\x00")
            _trickle(conn, b"\x00", until)
            return
        conn.recv(65536)  # the request
        if mode == "silent":
            time.sleep(TRICKLE)
        elif mode == "headers":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Pad: ")
            _trickle(conn, b"a", until)
        elif mode == "body":
            body = b"# TYPE x counter\nx_total 1\n" * 10_000
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n")
            conn.sendall(b"Content-Length: %d\r\n\r\n" % len(body))
            _trickle(conn, body, until)
        elif mode == "both":  # headers for most of the timeout, then the body as slowly
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            _trickle(conn, b"X-A: b\r\n", time.monotonic() + 0.7 * TIMEOUT)
            conn.sendall(b"Content-Length: 100000\r\n\r\n")
            _trickle(conn, b"# x\n", until)
    except OSError:
        pass  # the client hung up: what the test wants
    finally:
        conn.close()


@pytest.fixture
def slow_source() -> Iterator[callable]:
    listener = socket.create_server(("127.0.0.1", 0))
    mode: dict[str, str] = {}

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_serve, args=(conn, mode["m"]), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()

    def url(m: str) -> str:
        mode["m"] = m
        scheme = "https" if m == "tls" else "http"
        return f"{scheme}://127.0.0.1:{listener.getsockname()[1]}/metrics"

    yield url
    listener.close()


@pytest.mark.parametrize(
    ("mode", "phase"),
    [
        ("headers", "waiting for the status line and headers"),
        ("body", "reading the body"),
        ("silent", "waiting for the status line and headers"),
        ("both", "reading the body"),
        ("tls", "TLS handshake"),
    ],
)
def test_a_slow_source_is_cut_off_at_the_timeout(slow_source, mode, phase):
    config = StatsConfig(url="redis://127.0.0.1:1/0", namespace="deadline")
    source = BridgedSource(slow_source(mode), config, timeout=TIMEOUT)
    start = time.monotonic()
    assert not source.scrape()
    took = time.monotonic() - start
    assert took < TIMEOUT + 0.5, f"the scrape took {took:.1f} s with --timeout {TIMEOUT}"
    assert source.stats.errors == {"timeout": 1}, source.stats
    assert source.stats.last_error == f"timeout: no whole answer within {TIMEOUT:g} s ({phase})"


def test_an_https_source_is_scraped(cfg, tmp_path, monkeypatch):
    """The TLS path opened within the deadline still verifies and serves (a CA the test made,
    trusted through SSL_CERT_FILE, which the default context reads)."""
    certs = make_certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certs["ca"]))
    cat = SyntheticCatalogue("sglang")
    server = serve(cat)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs["cert"], certs["key"])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    try:
        url = f"https://127.0.0.1:{server.server_port}/metrics"
        source = BridgedSource(url, cfg)
        assert source.scrape(), source.stats
        assert [k for k in store_samples(cfg) if k[0] == "sglang:prompt_tokens_total"]
        source.close()
        wrong = BridgedSource(url.replace("127.0.0.1", "localhost"), cfg.replace(engine_offset=1))
        monkeypatch.delenv("SSL_CERT_FILE")  # a server whose CA is not trusted
        assert not wrong.scrape() and wrong.stats.errors == {"down": 1}
        assert "CERTIFICATE_VERIFY_FAILED" in wrong.stats.last_error
    finally:
        server.shutdown()
        server.server_close()
