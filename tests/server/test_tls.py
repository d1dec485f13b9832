"""TLS on the server of views: inside the request deadline and the connection limit, client
certificates (missing, unknown, expired, misnamed), plain HTTP to the TLS port, renewal."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import time

import pytest

from redis_stats import StatsReader
from redis_stats.server import Exporter
from tests.certs import Certificates, bcrypt_hash, client_context, http_get, https_get
from tests.conftest import sample_catalog

PASSWORD = "tls-pw-0a9b8c"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    found = Certificates(tmp_path_factory.mktemp("tls"))
    found.ca("ca")
    found.ca("clients")
    found.ca("stranger")
    found.leaf("server")
    found.leaf("prometheus", ca="clients", san="DNS:prometheus.monitoring.svc")
    found.leaf("other", ca="clients", san="DNS:someone.else")
    found.leaf("expired", ca="clients", days=-1, san="DNS:prometheus.monitoring.svc")
    found.leaf("unknown", ca="stranger", san="DNS:prometheus.monitoring.svc")
    return found


@pytest.fixture
def serve(config, fake_client, tmp_path, certs):
    started: list[Exporter] = []

    def run(tls: str = "", users: bool = True, **options) -> Exporter:
        web = tmp_path / "web.yml"
        text = (
            f"tls_server_config:\n  cert_file: {certs.dir}/server.pem\n  key_file: {certs.dir}/server.key\n"
        )
        text += "".join(f"  {line}\n" for line in tls.splitlines() if line)
        if users:
            text += f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD)}\n"
        web.write_text(text)
        reader = StatsReader(config, sample_catalog(), client=fake_client())
        options.setdefault("request_timeout", 5)
        exporter = Exporter(reader, port=0, web_config_file=str(web), **options).start()
        started.append(exporter)
        return exporter

    yield run
    for exporter in started:
        exporter.close()


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closes *sock* (reading and dropping what it sends)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, TimeoutError):
        pass
    return time.monotonic() - started


def _client_hello() -> bytes:
    """A real ClientHello, as a TLS client's first bytes."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    out = ssl.MemoryBIO()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def test_a_scrape_over_tls_with_basic_auth(serve, certs):
    exporter = serve()
    assert exporter.url.startswith("https://")
    ctx = client_context(certs.dir / "ca.pem")
    assert https_get(exporter.port, "/metrics", ctx)[0] == 401
    status, _, body, _ = https_get(exporter.port, "/metrics", ctx, AUTH)
    assert status == 200 and b"redis_stats_up" in body


def test_plain_http_to_the_tls_port_is_told_to_use_https(serve):
    exporter = serve()
    status, _, body, _ = http_get(exporter.port, "/metrics")
    assert status == 400 and b"this port serves HTTPS (TLS): use https://" in body


def test_a_client_that_never_says_hello_is_closed_at_the_request_timeout(serve):
    # The handshake runs on the connection's thread: a client that opens TCP and sends nothing
    # must not hold it past --request-timeout (the slowloris protection, for TLS too).
    exporter = serve(request_timeout=0.5)
    with socket.create_connection(("127.0.0.1", exporter.port)) as sock:
        assert _closed_within(sock, 5) < 1.5


def test_a_client_trickling_its_hello_is_closed_at_the_request_timeout(serve):
    exporter = serve(request_timeout=0.6)
    hello = _client_hello()
    with socket.create_connection(("127.0.0.1", exporter.port)) as sock:
        started = time.monotonic()
        sock.settimeout(0.05)
        closed = False
        for byte in hello:
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = True
                break
            if time.monotonic() - started > 4:
                break
        assert closed, "a hello sent a byte every 50 ms held its connection for 4 s"
        assert time.monotonic() - started < 1.6


def test_the_handshake_counts_in_the_request_deadline(serve, certs):
    # One deadline from accept to the end of the headers: a slow handshake leaves less for the
    # request, not a fresh timeout (which would close it 2 s after the hello, 3.5 s in).
    exporter = serve(request_timeout=2.0)
    ctx = client_context(certs.dir / "ca.pem")
    with socket.create_connection(("127.0.0.1", exporter.port)) as raw:
        connected = time.monotonic()
        time.sleep(1.5)  # the hello, late
        tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        tls.sendall(b"GET /metrics HTTP/1.1\r\n")  # and the request never finished
        _closed_within(tls, 5)
        assert time.monotonic() - connected < 3.0  # 2 s after the connection, not after the hello


def test_the_connection_limit_counts_tls_connections_and_answers_503_over_tls(serve, certs):
    exporter = serve(max_connections=2, request_timeout=3)
    ctx = client_context(certs.dir / "ca.pem")
    idle = []
    for _ in range(2):  # two clients past their handshake, holding their slots
        conn = ctx.wrap_socket(
            socket.create_connection(("127.0.0.1", exporter.port)), server_hostname="127.0.0.1"
        )
        idle.append(conn)
    try:
        status, headers, body, _ = https_get(exporter.port, "/metrics", ctx, AUTH)
        assert status == 503 and headers["Retry-After"] == "1" and b"too many connections" in body
    finally:
        for conn in idle:
            conn.close()
    time.sleep(0.3)
    assert https_get(exporter.port, "/metrics", ctx, AUTH)[0] == 200


def test_silent_clients_free_their_slots_and_scrapes_go_on(serve, certs):
    exporter = serve(max_connections=4, request_timeout=0.5)
    silent = [socket.create_connection(("127.0.0.1", exporter.port)) for _ in range(8)]
    try:
        time.sleep(1.5)
        assert https_get(exporter.port, "/metrics", client_context(certs.dir / "ca.pem"), AUTH)[0] == 200
    finally:
        for sock in silent:
            sock.close()


def _refused(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        status = https_get(port, "/metrics", ctx, AUTH, timeout=5)[0]
    except (OSError, http.client.HTTPException):
        return True
    raise AssertionError(f"served {status}")


MTLS = (
    "client_auth_type: RequireAndVerifyClientCert\nclient_ca_file: {dir}/clients.pem\n"
    "client_allowed_sans: [prometheus.monitoring.svc]"
)


def test_client_certificates_missing_unknown_expired_or_misnamed_are_refused(serve, certs):
    exporter = serve(tls=MTLS.format(dir=certs.dir), self_metrics=True)
    ca = certs.dir / "ca.pem"
    for name in (None, "unknown", "expired", "other"):
        cert = None if name is None else (certs.dir / f"{name}.pem", certs.dir / f"{name}.key")
        assert _refused(exporter.port, client_context(ca, cert)), name
    good = client_context(ca, (certs.dir / "prometheus.pem", certs.dir / "prometheus.key"))
    status, _, body, _ = https_get(exporter.port, "/metrics", good, AUTH)
    assert status == 200
    assert 'redis_stats_exporter_tls_handshake_failures_total{reason="handshake"} 3.0' in body.decode()
    assert 'redis_stats_exporter_tls_handshake_failures_total{reason="client_name"} 1.0' in body.decode()
    # with a certificate required and users configured, both are needed, as in the toolkit
    assert https_get(exporter.port, "/metrics", good)[0] == 401


def test_with_certificates_if_given_a_client_without_one_reaches_the_open_paths_only(serve, certs):
    exporter = serve(
        tls=f"client_auth_type: VerifyClientCertIfGiven\nclient_ca_file: {certs.dir}/clients.pem",
        users=False,
        web_open=["/healthz"],
    )
    ca = certs.dir / "ca.pem"
    anonymous = client_context(ca)
    assert https_get(exporter.port, "/healthz", anonymous)[0] in (200, 503)
    status, _, body, _ = https_get(exporter.port, "/metrics", anonymous)
    assert status == 403 and b"needs a client certificate" in body
    good = client_context(ca, (certs.dir / "prometheus.pem", certs.dir / "prometheus.key"))
    assert https_get(exporter.port, "/metrics", good)[0] == 200
    assert _refused(exporter.port, client_context(ca, (certs.dir / "expired.pem", certs.dir / "expired.key")))


def test_a_renewed_certificate_is_served_to_the_next_connections(serve, certs, tmp_path):
    # cert-manager renews the Secret's files in place: no restart.
    served = tmp_path / "served"
    served.mkdir()
    for name in ("server.pem", "server.key"):
        (served / name).write_bytes((certs.dir / name).read_bytes())
    exporter = serve()
    web = tmp_path / "web.yml"
    web.write_text(web.read_text().replace(f"{certs.dir}/server", f"{served}/server"))
    assert exporter.reload_web_config()
    ctx = client_context(certs.dir / "ca.pem")

    def serial() -> str:
        with ctx.wrap_socket(
            socket.create_connection(("127.0.0.1", exporter.port)), server_hostname="127.0.0.1"
        ) as s:
            return s.getpeercert()["serialNumber"]

    before = serial()
    renewed = Certificates(tmp_path / "renew")
    for name in ("ca.pem", "ca.key"):
        (renewed.dir / name).write_bytes((certs.dir / name).read_bytes())
    cert, key = renewed.leaf("server")
    for source, target in ((key, "server.key"), (cert, "server.pem")):
        (served / f"{target}.new").write_bytes(source.read_bytes())
        (served / f"{target}.new").replace(served / target)
    deadline = time.monotonic() + 5
    while serial() == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert serial() != before


def test_a_reload_cannot_turn_tls_off(serve, tmp_path, caplog):
    exporter = serve()
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD)}\n")
    assert exporter.reload_web_config() is False
    assert "a reload cannot turn it off: restart the exporter" in caplog.text
    assert http_get(exporter.port, "/metrics")[0] == 400  # still TLS
