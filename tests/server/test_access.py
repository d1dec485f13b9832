"""Who may read what: basic auth, bearer tokens, open paths, private routes, reloads, and secrets
that must never come out (plain HTTP here; TLS in test_tls.py)."""

from __future__ import annotations

import base64
import logging
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redis_stats import StatsReader
from redis_stats.errors import WebConfigError
from redis_stats.server import Exporter
from redis_stats.server import exporter as exporter_module
from redis_stats.server.app import Route
from redis_stats.server.http import json_response
from redis_stats.server.routes import ROUTES
from tests.certs import bcrypt_hash, http_get
from tests.conftest import sample_catalog

PASSWORD = "Planted-pw-5b1d7a"
TOKEN = "planted-token-8c4e1f0a2b9d"
OTHER_TOKEN = "planted-token-second-77aa"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def serve(config, fake_client):
    started: list[Exporter] = []

    def run(**options) -> Exporter:
        reader = StatsReader(config, sample_catalog(), client=fake_client())
        exporter = Exporter(reader, port=0, request_timeout=5, **options).start()
        started.append(exporter)
        return exporter

    yield run
    for exporter in started:
        exporter.close()


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD)}\n")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n{OTHER_TOKEN}\n")
    return {"web": web, "tokens": tokens}


def test_basic_auth_guards_every_path_but_the_open_ones(serve, files):
    exporter = serve(web_config_file=str(files["web"]), web_open=["/healthz"])
    port = exporter.port
    status, headers, body, _ = http_get(port, "/metrics")
    assert status == 401
    assert headers["WWW-Authenticate"] == 'Basic realm="redis_stats", charset="UTF-8"'
    assert b"needs credentials (basic auth)" in body
    assert http_get(port, "/metrics", basic("prometheus", "wrong"))[0] == 401
    assert http_get(port, "/metrics", basic("nobody", PASSWORD))[0] == 401
    assert http_get(port, "/metrics", basic("prometheus", PASSWORD))[0] == 200
    assert http_get(port, "/load", basic("prometheus", PASSWORD))[0] in (200, 503)
    # the open path: a kubelet's probe without credentials
    assert http_get(port, "/healthz")[0] in (200, 503)
    # an unknown path does not list the paths to a stranger
    status, _, body, _ = http_get(port, "/nope")
    assert status == 401 and b"/metrics" not in body
    status, _, body, _ = http_get(port, "/nope", basic("prometheus", PASSWORD))
    assert status == 404 and b"/metrics" in body


def test_malformed_authorization_headers_are_refused_not_crashed(serve, files):
    exporter = serve(web_config_file=str(files["web"]))
    for value in (
        "Basic",
        "Basic !!!",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + base64.b64encode(b"\xff\xfe:" + PASSWORD.encode()).decode(),
        "Basic " + base64.b64encode(b"prometheus:" + b"x" * 100).decode(),  # past bcrypt's 72 bytes
        "Digest username=prometheus",
        "Bearer " + TOKEN,  # tokens are not configured here
        "basic " + base64.b64encode(f"prometheus:{PASSWORD}\x00".encode()).decode(),
    ):
        assert http_get(exporter.port, "/metrics", {"Authorization": value})[0] == 401, value
    # the scheme is case-insensitive (RFC 7235)
    lower = {"Authorization": "basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}
    assert http_get(exporter.port, "/metrics", lower)[0] == 200


def test_bearer_tokens_from_the_token_file_each_admit(serve, files):
    exporter = serve(web_token_file=str(files["tokens"]))
    port = exporter.port
    status, headers, _, _ = http_get(port, "/metrics")
    assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="redis_stats"'
    status, headers, _, _ = http_get(port, "/metrics", bearer("wrong-token-000000000"))
    assert (
        status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="redis_stats", error="invalid_token"'
    )
    assert http_get(port, "/metrics", bearer(TOKEN[:-1]))[0] == 401  # a prefix is not the token
    assert http_get(port, "/metrics", bearer(TOKEN))[0] == 200
    assert http_get(port, "/metrics", bearer(OTHER_TOKEN))[0] == 200  # rotation: both in force
    assert http_get(port, "/metrics", basic("prometheus", PASSWORD))[0] == 401


def test_with_users_and_tokens_either_admits_and_both_are_offered(serve, files):
    exporter = serve(web_config_file=str(files["web"]), web_token_file=str(files["tokens"]))
    status, _, _, every = http_get(exporter.port, "/snapshot")
    assert status == 401
    assert [v for k, v in every if k == "WWW-Authenticate"] == [
        'Basic realm="redis_stats", charset="UTF-8"',
        'Bearer realm="redis_stats"',
    ]
    assert http_get(exporter.port, "/metrics", bearer(TOKEN))[0] == 200
    assert http_get(exporter.port, "/metrics", basic("prometheus", PASSWORD))[0] == 200


def test_the_http_server_configs_headers_are_on_every_answer(serve, tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(
        f"http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n"
        f"basic_auth_users:\n  p: {bcrypt_hash(PASSWORD)}\n"
    )
    exporter = serve(web_config_file=str(web), web_open=["/healthz"])
    for path, headers in (("/metrics", {}), ("/metrics", basic("p", PASSWORD)), ("/healthz", {})):
        _, got, _, _ = http_get(exporter.port, path, headers)
        assert got["X-Frame-Options"] == "deny" and got["X-Content-Type-Options"] == "nosniff", path


def test_open_paths_must_exist(serve, files):
    with pytest.raises(WebConfigError, match=r"web_open \['/helthz'\]: no such path; paths: .*/healthz"):
        serve(web_config_file=str(files["web"]), web_open=["/helthz"])
    with pytest.raises(ValueError, match="must be a list of paths"):
        serve(web_open="/healthz")


def _private_routes(monkeypatch, private=True):
    """The route table with a private view (the usage ledger's /usage is one)."""

    def ledger(app, request):
        return json_response(200, {"tenant": "acme", "spend": 12})

    monkeypatch.setattr(exporter_module, "ROUTES", {**ROUTES, "/ledger": Route(ledger, private=private)})


def test_a_private_route_is_never_served_without_access_control_unless_the_operator_says_insecure(
    serve, monkeypatch, files
):
    _private_routes(monkeypatch)
    with pytest.raises(WebConfigError) as caught:
        serve()
    message = str(caught.value)
    assert "/ledger serve business data" in message and "--insecure-private-views" in message
    assert "--web-config-file" in message and "--web-token-file" in message
    # said explicitly: served to anyone
    exporter = serve(insecure_private_views=True)
    assert http_get(exporter.port, "/ledger")[0] == 200
    # with credentials: behind them
    exporter = serve(web_token_file=str(files["tokens"]))
    assert http_get(exporter.port, "/ledger")[0] == 401
    assert http_get(exporter.port, "/ledger", bearer(TOKEN))[2] == b'{"tenant": "acme", "spend": 12}'
    # and never opened by --web-open alone
    with pytest.raises(WebConfigError, match=r"web_open \['/ledger'\]: business data .* cannot be opened"):
        serve(web_token_file=str(files["tokens"]), web_open=["/ledger"])
    exporter = serve(web_token_file=str(files["tokens"]), web_open=["/ledger"], insecure_private_views=True)
    assert http_get(exporter.port, "/ledger")[0] == 200


def test_whether_a_route_is_private_may_depend_on_the_options(serve, monkeypatch):
    # /metrics is private once it carries the ledger's top tenants: a function of the options.
    _private_routes(monkeypatch, private=lambda options: options.self_metrics)
    serve(self_metrics=False)  # not private with these options: served as any path
    with pytest.raises(WebConfigError, match="/ledger serve business data"):
        serve(self_metrics=True)


def test_a_client_certificate_only_config_is_access_control_for_private_routes(serve, monkeypatch, tmp_path):
    # (served over TLS: test_tls.py; here only that it counts as access control at start)
    _private_routes(monkeypatch)
    web = tmp_path / "web.yml"
    web.write_text("http_server_config: {headers: {X-Frame-Options: deny}}\n")
    with pytest.raises(WebConfigError, match="no access control is configured"):
        serve(web_config_file=str(web))  # headers only: no credential


def _rewrite(path: Path, text: str) -> None:
    """Write *path* anew so that a look at it sees a change (a new inode, as a Secret's update)."""
    new = path.with_suffix(".new")
    new.write_text(text)
    new.replace(path)


def _until(check, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_the_last_good(serve, files, caplog):
    exporter = serve(web_config_file=str(files["web"]), self_metrics=True)
    port, web = exporter.port, files["web"]
    new_password = "Rotated-pw-3e3e3e"
    _rewrite(web, f"basic_auth_users:\n  prometheus: {bcrypt_hash(new_password)}\n")
    assert _until(lambda: http_get(port, "/metrics", basic("prometheus", new_password))[0] == 200)
    assert http_get(port, "/metrics", basic("prometheus", PASSWORD))[0] == 401
    caplog.set_level(logging.ERROR, logger="redis_stats.exporter")
    broken_hash = bcrypt_hash("x")
    _rewrite(web, f"basic_auth_users:\n  prometheus: [{broken_hash}\n")
    time.sleep(1.5)
    for _ in range(3):  # said once, not at every look
        assert http_get(port, "/metrics", basic("prometheus", new_password))[0] == 200  # the old one kept
        time.sleep(0.5)
    errors = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(errors) == 1 and "not YAML" in errors[0] and broken_hash not in errors[0]
    metrics = http_get(port, "/metrics", basic("prometheus", new_password))[2].decode()
    assert "redis_stats_exporter_web_config_last_reload_successful 0.0" in metrics
    assert 'redis_stats_exporter_web_config_reloads_total{result="failure"} 1.0' in metrics
    _rewrite(web, f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD)}\n")
    assert _until(lambda: http_get(port, "/metrics", basic("prometheus", PASSWORD))[0] == 200)
    metrics = http_get(port, "/metrics", basic("prometheus", PASSWORD))[2].decode()
    assert "redis_stats_exporter_web_config_last_reload_successful 1.0" in metrics


def test_a_reload_may_not_leave_private_routes_without_credentials(serve, monkeypatch, files, caplog):
    _private_routes(monkeypatch)
    exporter = serve(web_config_file=str(files["web"]))
    _rewrite(files["web"], "http_server_config: {headers: {X-Frame-Options: deny}}\n")
    assert exporter.reload_web_config() is False  # SIGHUP's way: at once
    assert "no credential left" in caplog.text
    assert http_get(exporter.port, "/ledger")[0] == 401
    assert http_get(exporter.port, "/ledger", basic("prometheus", PASSWORD))[0] == 200


def test_a_file_the_parser_chokes_on_costs_the_reload_never_a_request(serve, files, caplog):
    # A key that is a list made PyYAML's loader raise TypeError, deep nesting RecursionError: at a
    # reload that would have ended the connection that looked, once a second.
    exporter = serve(web_config_file=str(files["web"]))
    for text in ("? [a, b]\n: c\n", "basic_auth_users: " + "[" * 5000 + "]" * 5000):
        _rewrite(files["web"], text)
        time.sleep(1.1)
        for _ in range(5):
            assert http_get(exporter.port, "/metrics", basic("prometheus", PASSWORD))[0] == 200
    assert caplog.text.count("not reloaded") == 2


def test_concurrent_clients_each_get_their_own_answer(serve, files):
    # The verdicts are cached and shared by every connection's thread: a right password must never
    # admit a wrong one sent at the same moment, nor the reverse.
    import threading

    exporter = serve(
        web_config_file=str(files["web"]), web_token_file=str(files["tokens"]), max_connections=16
    )
    cases = [
        (basic("prometheus", PASSWORD), 200),
        (basic("prometheus", PASSWORD + "!"), 401),
        (basic("nobody", PASSWORD), 401),
        (bearer(TOKEN), 200),
        (bearer(OTHER_TOKEN + "x"), 401),
        ({}, 401),
    ]
    wrong: list[tuple[int, int]] = []

    def client(i: int) -> None:
        for n in range(20):
            headers, expected = cases[(i + n) % len(cases)]
            status = http_get(exporter.port, "/healthz", headers)[0]
            if (status == 200) != (expected == 200) and status != 503:
                wrong.append((i, n))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_a_deleted_file_keeps_the_configuration_in_force(serve, files):
    exporter = serve(web_token_file=str(files["tokens"]))
    files["tokens"].unlink()
    time.sleep(1.2)
    assert http_get(exporter.port, "/metrics")[0] == 401
    assert http_get(exporter.port, "/metrics", bearer(TOKEN))[0] == 200


def test_planted_secrets_never_come_out(serve, files, caplog, tmp_path):
    """A password and a token planted, then every output scanned: logs at DEBUG, reprs, errors,
    the 401s, /metrics with the exporter's own metrics (REVIEW.md: a secret is anywhere a string goes)."""
    caplog.set_level(logging.DEBUG)
    exporter = serve(
        web_config_file=str(files["web"]), web_token_file=str(files["tokens"]), self_metrics=True
    )
    secrets = [PASSWORD, TOKEN, OTHER_TOKEN, base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()]
    secrets.append(files["web"].read_text().split(": ", 1)[1].strip())  # the hash too
    outputs = [repr(exporter.app.gate), repr(exporter.options), repr(exporter.app.gate.current())]
    for headers in (basic("prometheus", PASSWORD + "x"), bearer(TOKEN + "x"), basic("prometheus", PASSWORD)):
        _status, got, body, _ = http_get(exporter.port, "/metrics", headers)
        outputs += [body.decode(), repr(got)]
    outputs += [http_get(exporter.port, "/nope", bearer(TOKEN))[2].decode()]
    for bad in (f"{TOKEN} {PASSWORD}\n", f"{PASSWORD}!\n"):  # broken token files
        (tmp_path / "bad").write_text(bad)
        with pytest.raises(WebConfigError) as caught:
            serve(web_token_file=str(tmp_path / "bad"))
        outputs.append(str(caught.value))
    exporter.reload_web_config()
    outputs.append(caplog.text)
    everything = "\n".join(outputs)
    assert "redis_stats_exporter_unauthorized_requests_total" in everything  # /metrics was read
    for secret in secrets:
        assert secret not in everything


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    from redis_stats.server.access import Gate

    tmp = tmp_path_factory.mktemp("gate")
    (tmp / "web.yml").write_text(f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD)}\n")
    (tmp / "tokens").write_text(f"{TOKEN}\n")
    return Gate(str(tmp / "web.yml"), str(tmp / "tokens"))


@settings(max_examples=400, deadline=None)
@given(
    value=st.one_of(
        st.text(max_size=200),
        st.builds(
            lambda s, t: s + t, st.sampled_from(["Basic ", "Bearer ", "basic  "]), st.text(max_size=120)
        ),
    )
)
def test_any_authorization_header_is_refused_with_a_401_unless_it_is_a_credential(gate, value):
    from redis_stats.server.http import Request

    answer = gate.check(Request("GET", "/metrics", "", {"Authorization": value}))
    if answer is None:  # admitted: only the token, or the password, were in it
        assert TOKEN in value or base64.b64decode(value.split()[1]) == f"prometheus:{PASSWORD}".encode()
    else:
        assert answer.status == 401  # the same words whatever was sent: nothing of it echoed
        assert (
            answer.body
            == b'{"error": "unauthorized: this path needs credentials (basic auth or a bearer token)"}'
        )
