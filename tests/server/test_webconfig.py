"""The web configuration file (Prometheus exporter-toolkit's format) and the bearer token file, as
the exporter reads them: what is accepted, and what is refused with an error naming the key and
the fix and never quoting a secret."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from redis_stats.errors import ConfigError, WebConfigError
from redis_stats.server.webconfig import read_tokens, read_web_config
from tests.certs import Certificates, bcrypt_hash

SECRET = "Planted-S3cret-9f7c2e"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    found = Certificates(tmp_path_factory.mktemp("certs"))
    found.ca("ca")
    found.leaf("server")
    return found


def write(tmp_path: Path, text: str, name: str = "web.yml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(WebConfigError) as caught:
        read_web_config(write(tmp_path, text))
    assert isinstance(caught.value, ConfigError)  # caught where config errors are
    assert caught.value.option == "web_config_file"
    return str(caught.value)


def test_the_toolkits_own_forms_are_read(tmp_path, certs):
    hashed = bcrypt_hash("pw")
    path = write(
        tmp_path,
        f"""
# node_exporter's TLS + basic auth example, with headers
tls_server_config:
  cert_file: {certs.dir}/server.pem
  key_file: {certs.dir}/server.key
  min_version: TLS12
  max_version: TLS13
  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
http_server_config:
  http2: true
  headers:
    X-Frame-Options: deny
    X-Content-Type-Options: nosniff
    Content-Security-Policy: ""
basic_auth_users:
  alice: {hashed}
""",
    )
    web = read_web_config(path)
    assert web.tls is not None and web.tls.cert_file == f"{certs.dir}/server.pem"
    assert web.tls.cipher_suites == ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256")
    assert web.headers == (("X-Frame-Options", "deny"), ("X-Content-Type-Options", "nosniff"))  # blank: unset
    assert web.users == {"alice": hashed.encode()}
    assert hashed not in repr(web)
    assert web.tls.context(path) is not None


def test_an_empty_file_is_plain_http_without_users(tmp_path):
    web = read_web_config(write(tmp_path, ""))
    assert web.tls is None and web.users == {} and web.headers == ()


def test_relative_paths_are_the_files_directorys_as_in_the_toolkit(tmp_path, certs):
    (tmp_path / "tls").mkdir()
    for name in ("server.pem", "server.key"):
        (tmp_path / "tls" / name).write_bytes((certs.dir / name).read_bytes())
    web = read_web_config(
        write(tmp_path, "tls_server_config: {cert_file: tls/server.pem, key_file: tls/server.key}")
    )
    assert web.tls is not None and web.tls.cert_file == str(tmp_path / "tls" / "server.pem")


T = "tls_server_config: {cert_file: a, key_file: b, "
H = "http_server_config: {headers: "
ANY_HASH = "$2y$04$" + "a" * 53


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("tls_server_confg: {}", "unknown key tls_server_confg (did you mean tls_server_config?)"),
        ("basic_auth_user: {}", "did you mean basic_auth_users?"),
        ("rate_limit: {interval: 1s, burst: 5}", "rate_limit is not served here"),
        (T + "client_auth: x}", "did you mean tls_server_config.client_auth_type?"),
        (T + "curve_preferences: [X25519]}", "curve_preferences cannot be served"),
        ("tls_server_config: {cert: x, key_file: b}", "tls_server_config.cert (a certificate given inline)"),
        (T + "client_auth_type: RequireAnyClientCert}", "cannot ask for a client certificate without"),
        (T + "client_auth_type: RequestClientCert}", "RequestClientCert cannot be served"),
        (T + "client_auth_type: Sometimes}", "'Sometimes' is not one of NoClientCert, VerifyClient"),
        ("tls_server_config: {cert_file: a}", "needs cert_file and key_file"),
        (T + "client_ca_file: c}", "a client CA is given but client_auth_type is NoClientCert"),
        (T + "client_auth_type: RequireAndVerifyClientCert}", "needs client_ca_file (or client_ca)"),
        (
            T + "client_auth_type: VerifyClientCertIfGiven, client_ca_file: c, client_allowed_sans: [x]}",
            "client_allowed_sans needs client_auth_type: RequireAndVerifyClientCert",
        ),
        (T + "min_version: TLS14}", "min_version 'TLS14' is not one of TLS10"),
        (T + "min_version: TLS13, max_version: TLS12}", "min_version TLS13 is above max_version TLS12"),
        (
            T + "cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA]}",
            "unknown cipher 'TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA' (did you mean "
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256?)",
        ),
        (T + "prefer_server_cipher_suites: maybe}", "must be true or false"),
        ("tls_server_config: [a]", "tls_server_config must be a mapping (key: value), not a list"),
        (H + "{Server: x}}", "'Server' cannot be configured"),
        (H + "{X-Frame-Options: allow}}", "X-Frame-Options 'allow' is not one of deny, sameorigin"),
        (H + '{Content-Security-Policy: "a\\r\\nSet-Cookie: x"}}', "must be one line of text"),
        ("http_server_config: {http2: sometimes}", "http_server_config.http2 must be true or false"),
        (f"basic_auth_users: {{no: {ANY_HASH}}}", "quote names YAML reads otherwise"),
        ("basic_auth_users: [alice]", "basic_auth_users must be a mapping"),
        ("- a\n- b", "the file must be a mapping"),
        ("? [a, b]\n: c\n", "line 1: a key must be a name, not a list"),
        ("basic_auth_users: &a {x: *a}", "not YAML (found unconstructable recursive node)"),
        ("tls_server_config: !!python/object:os.system {}", "could not determine a constructor"),
        ("basic_auth_users: " + "[" * 5000 + "]" * 5000, "not YAML (exceeded maximum nesting depth)"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_the_key_and_the_fix(tmp_path, text, said):
    assert said in refused(tmp_path, text)


def test_a_password_that_is_no_bcrypt_hash_is_refused_without_showing_it(tmp_path):
    # The toolkit takes bcrypt hashes only (Go's bcrypt.Cost): a plain password put there by mistake
    # must not be printed back into a log.
    message = refused(tmp_path, f"basic_auth_users:\n  alice: {SECRET}\n")
    assert "the password of 'alice' is not a bcrypt hash" in message and "htpasswd -nBC 10" in message
    assert SECRET not in message


def test_a_key_given_inline_is_refused_without_showing_it(tmp_path):
    message = refused(tmp_path, f"tls_server_config:\n  cert_file: a\n  key: |\n    {SECRET}\n")
    assert "mount it as a file" in message and SECRET not in message


def test_a_user_given_twice_is_refused_as_gos_strict_yaml_does(tmp_path):
    # PyYAML keeps the second in silence: two hashes for one user, the operator believing the first.
    h1, h2 = bcrypt_hash("one"), bcrypt_hash("two")
    message = refused(tmp_path, f"basic_auth_users:\n  alice: {h1}\n  alice: {h2}\n")
    assert "line 3: key 'alice' is given twice" in message
    assert h1 not in message and h2 not in message


def test_a_yaml_error_says_where_and_never_quotes_the_text(tmp_path):
    # PyYAML's own message quotes the lines around the error: the hash beside it would be logged.
    hashed = bcrypt_hash(SECRET)
    message = refused(tmp_path, f"basic_auth_users:\n  alice: {hashed}\n  bob: [unclosed, {SECRET}\n")
    assert "not YAML" in message and "line " in message
    assert SECRET not in message and hashed not in message


def test_unreadable_or_broken_tls_files_are_said_with_the_key(tmp_path, certs):
    missing = refused(
        tmp_path, f"tls_server_config: {{cert_file: {tmp_path}/none.pem, key_file: {certs.dir}/server.key}}"
    )
    assert "cannot be loaded" in missing and "none.pem" in missing
    # a key that is not the certificate's
    other = Certificates(tmp_path / "other")
    other.ca("ca2")
    other.leaf("x", ca="ca2")
    mismatch = refused(
        tmp_path, f"tls_server_config: {{cert_file: {certs.dir}/server.pem, key_file: {other.dir}/x.key}}"
    )
    assert "cannot be loaded" in mismatch
    empty_ca = tmp_path / "empty.pem"
    empty_ca.write_text("")
    assert "client_ca_file cannot be loaded" in refused(
        tmp_path,
        f"tls_server_config: {{cert_file: {certs.dir}/server.pem, key_file: {certs.dir}/server.key, "
        f"client_auth_type: RequireAndVerifyClientCert, client_ca_file: {empty_ca}}}",
    )


def test_an_encrypted_key_is_refused_instead_of_prompting_on_the_terminal(tmp_path, certs):
    # OpenSSL asks for a passphrase on the terminal by default: a server would wait for ever.
    import subprocess

    encrypted = tmp_path / "enc.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(certs.dir / "server.key"), "-aes256", "-passout", f"pass:{SECRET}",
         "-out", str(encrypted)],
        check=True, capture_output=True,
    )  # fmt: skip
    message = refused(
        tmp_path, f"tls_server_config: {{cert_file: {certs.dir}/server.pem, key_file: {encrypted}}}"
    )
    assert "is encrypted" in message and SECRET not in message


def test_without_bcrypt_basic_auth_users_name_the_extra(tmp_path, monkeypatch):
    text = f"basic_auth_users: {{alice: {bcrypt_hash('pw')}}}"
    monkeypatch.setitem(sys.modules, "bcrypt", None)  # import bcrypt now raises ImportError
    message = refused(tmp_path, text)
    assert "needs the bcrypt package: pip install 'redis_stats[web]'" in message


def test_without_pyyaml_the_file_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    assert "needs PyYAML: pip install 'redis_stats[web]'" in refused(tmp_path, "")


def test_the_token_file_keeps_digests_and_refuses_what_is_no_token(tmp_path):
    token = "t" * 20
    assert len(read_tokens(write(tmp_path, f"\n  {token}  \n{SECRET}-second\n", "tokens"))) == 2
    for text, said in (
        ("", "holds no bearer token"),
        ("short\n", "line 1 is not a bearer token of at least 16 characters"),
        (f"{SECRET} with spaces\n", "line 1 is not a bearer token"),
    ):
        with pytest.raises(WebConfigError) as caught:
            read_tokens(write(tmp_path, text, "tokens"))
        assert said in str(caught.value) and caught.value.option == "web_token_file"
        assert SECRET not in str(caught.value) and "short" not in str(caught.value)
    with pytest.raises(WebConfigError, match="cannot read the bearer token file"):
        read_tokens(str(tmp_path / "missing"))
