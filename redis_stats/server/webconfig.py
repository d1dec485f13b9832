"""The web configuration file of Prometheus exporters, and the bearer token file, as read here.

The file is the one node_exporter and every exporter built on prometheus/exporter-toolkit read with
``--web.config.file`` (the toolkit's docs/web-configuration.md), so one file, checked by
``promtool check web-config``, configures them all::

    tls_server_config:            # TLS (HTTPS) when present
      cert_file: server.pem       # paths relative to this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
      client_ca_file: clients-ca.pem                 # or client_ca: <PEM text>
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12          # TLS10 .. TLS13 (default TLS12); max_version (default TLS13)
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go's names, TLS 1.2 and below
      prefer_server_cipher_suites: true
    http_server_config:
      http2: true                 # accepted; this server speaks HTTP/1.1
      headers: {X-Frame-Options: deny, X-Content-Type-Options: nosniff}
    basic_auth_users:             # user: bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')
      prometheus: $2y$10$...

What Python's :mod:`ssl` cannot do is refused by name, never ignored: ``cert`` and ``key`` given
inline (it loads a certificate chain from files only: mount them as files), ``curve_preferences``
(it sets no list of curves), ``client_auth_type`` ``RequestClientCert`` and
``RequireAnyClientCert`` (it cannot ask for a certificate without verifying it). ``rate_limit`` is
refused too (this server bounds connections instead: ``--max-connections``). Stricter than the
toolkit, on purpose: a client certificate is verified against ``client_ca_file``/``client_ca`` only
(never the system's CAs, which would admit any publicly issued certificate), and
``client_allowed_sans`` needs ``RequireAndVerifyClientCert``.

A file the toolkit accepts and this module reads is read the same way (keys, defaults, relative
paths, duplicate keys refused as Go's strict YAML refuses them); what this module accepts,
``promtool check web-config`` accepts (tests/e2e/test_web_access.py checks it with Debian's).

Reading it needs PyYAML, and ``basic_auth_users`` needs bcrypt (the toolkit's hash; the standard
library cannot check one): both come with ``pip install 'redis_stats[web]'``, and their absence is
said when the file is read, naming the extra.

A bearer token file (the toolkit has none; Prometheus' ``authorization`` and KEDA's
``authModes: bearer`` send ``Authorization: Bearer <token>``) holds one token a line (several:
rotate by adding the new one, moving the clients, removing the old); only their SHA-256 digests
are kept. Errors name the file, the key and the fix, and never a secret (a hash, a token, a key,
a line of the file).
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis_stats.errors import WebConfigError

__all__ = [
    "CLIENT_AUTH_TYPES",
    "HEADERS",
    "TLS_VERSIONS",
    "TLSServerConfig",
    "WebConfig",
    "read_tokens",
    "read_web_config",
]

EXTRA = "pip install 'redis_stats[web]'"

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
"""``min_version`` / ``max_version``: the toolkit's names."""

CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
"""The ``client_auth_type`` values served (Go's ``tls.ClientAuthType`` names)."""

_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
"""The headers ``http_server_config.headers`` may set, and their allowed values (none listed: any);
the toolkit's list, kept short on purpose so every exporter sets the same ones."""

# Go's cipher suite names (tls.CipherSuites(): what the toolkit accepts) -> OpenSSL's. TLS 1.3's
# suites are not configurable in Go either: accepted, and left to the TLS library.
_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
_TLS13_CIPHERS = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")

# A bcrypt hash as the toolkit takes it (Go's bcrypt.Cost: $2a$/$2b$/$2y$, cost 4..31, 53 chars).
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
# A bearer token as RFC 6750 spells one (b64token), long enough not to be guessed.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MIN_TOKEN = 16

_TOP = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_ca",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
)
_HTTP_KEYS = ("http2", "headers")
# Keys of the format this server refuses, and why (each message says what to do instead).
_REFUSED = {
    "rate_limit": "is not served here: this server bounds the connections it serves at once "
    "instead (--max-connections); remove it",
    "tls_server_config.cert": "(a certificate given inline) cannot be loaded by Python's ssl module, "
    "which reads a certificate chain from files only: mount it as a file and give cert_file",
    "tls_server_config.key": "(a key given inline) cannot be loaded by Python's ssl module, which "
    "reads a key from files only: mount it as a file (mode 0600) and give key_file",
    "tls_server_config.curve_preferences": "cannot be served: Python's ssl module sets no list of "
    "curves (OpenSSL's defaults apply: X25519, P-256, P-384, ...); remove it",
}


@dataclass(frozen=True)
class TLSServerConfig:
    """``tls_server_config``: the server's certificate, and how clients' certificates are checked.
    Paths are absolute (a relative one in the file is taken from the file's directory)."""

    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str | None = None
    client_ca: str | None = field(default=None, repr=False)
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    @property
    def verifies_clients(self) -> bool:
        """Whether a client's certificate, when given, is verified against the client CA."""
        return self.client_auth_type != "NoClientCert"

    @property
    def requires_clients(self) -> bool:
        """Whether every connection must present a certificate the client CA signed."""
        return self.client_auth_type == "RequireAndVerifyClientCert"

    def files(self) -> tuple[str, ...]:
        """The files it reads (a change of one reloads the configuration)."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)

    def context(self, where: str) -> ssl.SSLContext:
        """A server :class:`ssl.SSLContext` of this configuration, its files read now (*where*:
        the configuration file, named in errors)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version]
        ctx.maximum_version = TLS_VERSIONS[self.max_version]
        ctx.set_alpn_protocols(["http/1.1"])  # http2: this server speaks HTTP/1.1 only
        if self.prefer_server_cipher_suites:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
        suites = [_CIPHERS[s] for s in self.cipher_suites if s in _CIPHERS]
        if suites:
            _load(where, "cipher_suites", lambda: ctx.set_ciphers(":".join(suites)))
        asked = []

        def no_passphrase() -> bytes:
            # OpenSSL would prompt on the terminal for an encrypted key's passphrase: a server must
            # never wait for one. The toolkit reads no encrypted key either.
            asked.append(True)
            return b""

        try:
            ctx.load_cert_chain(self.cert_file, self.key_file, password=no_passphrase)
        except (ssl.SSLError, OSError) as exc:
            if asked:
                raise WebConfigError(
                    "web_config_file",
                    f"{where}: tls_server_config.key_file {self.key_file} is encrypted (it asks for a "
                    "passphrase): give it unencrypted, readable by the exporter only "
                    "(openssl pkey -in KEY -out KEY.plain)",
                ) from None
            raise WebConfigError(
                "web_config_file",
                f"{where}: tls_server_config cert_file {self.cert_file} and key_file {self.key_file} "
                f"cannot be loaded ({_reason(exc)}): give a PEM certificate (chain) and its PEM key",
            ) from None
        if self.verifies_clients:
            ctx.verify_mode = CLIENT_AUTH_TYPES[self.client_auth_type]
            what = "client_ca_file" if self.client_ca_file else "client_ca"
            _load(
                where,
                what,
                lambda: ctx.load_verify_locations(cafile=self.client_ca_file, cadata=self.client_ca),
            )
        return ctx

    def allows(self, peer: Mapping[str, Any] | None) -> bool:
        """Whether a verified client certificate (``getpeercert()``) holds a subject alternative
        name of ``client_allowed_sans`` (always, when the list is empty)."""
        if not self.client_allowed_sans:
            return True
        allowed = {_san(name) for name in self.client_allowed_sans}
        return any(_san(value) in allowed for _kind, value in (peer or {}).get("subjectAltName", ()))


@dataclass(frozen=True)
class WebConfig:
    """One read of a web configuration file: TLS (None: plain HTTP), the headers every answer
    carries, and the basic-auth users with their bcrypt hashes (never shown by ``repr``)."""

    path: str
    tls: TLSServerConfig | None = None
    headers: tuple[tuple[str, str], ...] = ()
    users: Mapping[str, bytes] = field(default_factory=dict, repr=False)

    def files(self) -> tuple[str, ...]:
        """Every file this configuration reads, itself first."""
        return (self.path, *(self.tls.files() if self.tls else ()))


def read_web_config(path: str) -> WebConfig:
    """The web configuration file at *path*, checked whole (:class:`WebConfigError` naming the key
    and the fix, never a secret); its TLS files are read too (:meth:`TLSServerConfig.context`)."""
    doc = _yaml(path)
    if doc is None:
        doc = {}
    _mapping(path, "the file", doc)
    _known(path, "", doc, _TOP)
    tls = _tls(path, doc.get("tls_server_config"))
    if tls is not None:
        tls.context(path)  # the certificate, key and CA read now: a broken one said at once
    return WebConfig(
        path=os.path.abspath(path),
        tls=tls,
        headers=_headers(path, doc.get("http_server_config")),
        users=_users(path, doc.get("basic_auth_users")),
    )


def read_tokens(path: str) -> tuple[bytes, ...]:
    """The SHA-256 digests of the bearer tokens in the file at *path*, one token a line (blank
    lines and surrounding whitespace ignored); :class:`WebConfigError` for a file without one or a
    line that is no token (never quoting it)."""
    text = _text(path, "web_token_file", "the bearer token file")
    digests = []
    for number, line in enumerate(text.splitlines(), 1):
        token = line.strip()
        if not token:
            continue
        if not _TOKEN.fullmatch(token) or len(token) < MIN_TOKEN:
            raise WebConfigError(
                "web_token_file",
                f"{path}: line {number} is not a bearer token of at least {MIN_TOKEN} characters of "
                "A-Z a-z 0-9 - . _ ~ + / (then =): make one with `openssl rand -hex 32` (the line is "
                "not shown)",
            )
        digests.append(hashlib.sha256(token.encode()).digest())
    if not digests:
        raise WebConfigError(
            "web_token_file", f"{path} holds no bearer token: write one a line (`openssl rand -hex 32`)"
        )
    return tuple(digests)


# -- reading ------------------------------------------------------------------------------------


def _text(path: str, option: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise WebConfigError(option, f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise WebConfigError(option, f"{what} {path} is not UTF-8 text") from None


def _yaml(path: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise WebConfigError(
            "web_config_file", f"reading the web configuration file {path} needs PyYAML: {EXTRA}"
        ) from None

    # libyaml's parser when the wheel has it (PyYAML's do): the pure-Python one took 3 s of CPU on
    # a 10 kB file nested 5,000 deep before it gave up; libyaml refuses such nesting at once.
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc,valid-type]
        """Refuses a key given twice, as Go's strict YAML does (the later one would win in silence:
        two hashes for one user)."""

    def mapping(loader: Any, node: Any) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise _bad(
                    path, f"line {key_node.start_mark.line + 1}: a key must be a name, not a {_kind(key)}"
                )
            if key in seen:
                raise _bad(
                    path,
                    f"line {key_node.start_mark.line + 1}: key {key!r} is given twice; keep one",
                )
            seen.add(key)
        return dict(loader.construct_mapping(node))

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    text = _text(path, "web_config_file", "the web configuration file")
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        # PyYAML's own message quotes the lines around the error: a hash or a key would be in it.
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise _bad(path, f"{at}not YAML ({problem}); the text is not shown") from None
    except RecursionError:  # nesting deeper than the parser's stack: no configuration is
        raise _bad(path, "nested too deep to be a web configuration; the text is not shown") from None


def _bad(path: str, problem: str) -> WebConfigError:
    """The error of the web configuration file at *path*: *problem* (a key, what is wrong, the fix)."""
    return WebConfigError("web_config_file", f"{path}: {problem}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc.strerror or type(exc).__name__)
    if isinstance(exc, OSError):
        return str(exc.strerror or exc)
    return type(exc).__name__


def _load(where: str, key: str, load: Any) -> None:
    try:
        load()
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise WebConfigError(
            "web_config_file", f"{where}: tls_server_config.{key} cannot be loaded ({_reason(exc)})"
        ) from None


def _san(name: str) -> str:
    """A subject alternative name as compared (an IP address in one spelling)."""
    try:
        return str(ipaddress.ip_address(name.strip()))
    except ValueError:
        return name


def _mapping(path: str, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(path, f"{where} must be a mapping (key: value), not a {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return "list" if isinstance(value, list) else type(value).__name__


def _known(path: str, prefix: str, doc: Mapping[Any, Any], keys: tuple[str, ...]) -> None:
    for key in doc:
        name = f"{prefix}{key}"
        if name in _REFUSED:
            raise _bad(path, f"{name} {_REFUSED[name]}")
        if not isinstance(key, str) or key not in keys:
            near = difflib.get_close_matches(str(key), keys, n=1)
            hint = f" (did you mean {prefix}{near[0]}?)" if near else f"; known: {', '.join(keys)}"
            raise _bad(path, f"unknown key {name}{hint}")


def _string(path: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(path, f"{key} must be a non-empty string, not a {_kind(value)}")
    return value


def _strings(path: str, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad(path, f"{key} must be a list of strings, not a {_kind(value)}")
    return tuple(_string(path, f"{key}[{i}]", v) for i, v in enumerate(value))


def _choice(path: str, key: str, value: Any, allowed: Mapping[str, Any], default: str) -> str:
    if value is None:
        return default
    if value not in allowed:
        raise _bad(path, f"{key} {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _file(path: str, value: str) -> str:
    """A path of the file, as the toolkit takes it: relative to the file's directory."""
    return os.path.join(os.path.dirname(os.path.abspath(path)), value)


def _tls(path: str, value: Any) -> TLSServerConfig | None:
    if value is None:
        return None
    doc = _mapping(path, "tls_server_config", value)
    _known(path, "tls_server_config.", doc, _TLS_KEYS)
    if not doc:
        return None
    key = "tls_server_config"
    if "cert_file" not in doc or "key_file" not in doc:
        raise _bad(path, f"{key} needs cert_file and key_file (the server's certificate and key)")
    auth = doc.get("client_auth_type")
    if auth in _UNVERIFIED_CLIENT_AUTH:
        raise _bad(
            path,
            f"{key}.client_auth_type {auth} cannot be served: Python's ssl module cannot ask "
            "for a client certificate without verifying it; use RequireAndVerifyClientCert (or "
            "VerifyClientCertIfGiven) with client_ca_file",
        )
    tls = TLSServerConfig(
        cert_file=_file(path, _string(path, f"{key}.cert_file", doc["cert_file"])),
        key_file=_file(path, _string(path, f"{key}.key_file", doc["key_file"])),
        client_auth_type=_choice(path, f"{key}.client_auth_type", auth, CLIENT_AUTH_TYPES, "NoClientCert"),
        client_ca_file=(
            _file(path, _string(path, f"{key}.client_ca_file", doc["client_ca_file"]))
            if doc.get("client_ca_file") is not None
            else None
        ),
        client_ca=_string(path, f"{key}.client_ca", doc["client_ca"]) if doc.get("client_ca") else None,
        client_allowed_sans=_strings(path, f"{key}.client_allowed_sans", doc.get("client_allowed_sans")),
        min_version=_choice(path, f"{key}.min_version", doc.get("min_version"), TLS_VERSIONS, "TLS12"),
        max_version=_choice(path, f"{key}.max_version", doc.get("max_version"), TLS_VERSIONS, "TLS13"),
        cipher_suites=_ciphers(path, doc.get("cipher_suites")),
        prefer_server_cipher_suites=_bool(
            path, f"{key}.prefer_server_cipher_suites", doc.get("prefer_server_cipher_suites", True)
        ),
    )
    _check_tls(path, tls)
    return tls


def _check_tls(path: str, tls: TLSServerConfig) -> None:
    key = "tls_server_config"
    has_ca = tls.client_ca_file is not None or tls.client_ca is not None
    if tls.client_ca_file is not None and tls.client_ca is not None:
        raise _bad(path, f"{key}: give client_ca_file or client_ca, not both")
    if has_ca and not tls.verifies_clients:
        raise _bad(
            path,
            f"{key}: a client CA is given but client_auth_type is NoClientCert: set "
            "client_auth_type: RequireAndVerifyClientCert (or remove the CA)",
        )
    if tls.verifies_clients and not has_ca:
        raise _bad(
            path,
            f"{key}.client_auth_type {tls.client_auth_type} needs client_ca_file (or "
            "client_ca): the CA that signs your clients' certificates (the system's CAs would admit "
            "any publicly issued certificate)",
        )
    if tls.client_allowed_sans and not tls.requires_clients:
        raise _bad(
            path,
            f"{key}.client_allowed_sans needs client_auth_type: RequireAndVerifyClientCert "
            "(a client without a certificate has no name to match)",
        )
    if TLS_VERSIONS[tls.min_version] > TLS_VERSIONS[tls.max_version]:
        raise _bad(path, f"{key}.min_version {tls.min_version} is above max_version {tls.max_version}")


def _ciphers(path: str, value: Any) -> tuple[str, ...]:
    names = _strings(path, "tls_server_config.cipher_suites", value)
    for name in names:
        if name not in _CIPHERS and name not in _TLS13_CIPHERS:
            near = difflib.get_close_matches(name, [*_CIPHERS, *_TLS13_CIPHERS], n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise _bad(path, f"tls_server_config.cipher_suites: unknown cipher {name!r}{hint}")
    return names


def _bool(path: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(path, f"{key} must be true or false, not a {_kind(value)}")
    return value


def _headers(path: str, value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    doc = _mapping(path, "http_server_config", value)
    _known(path, "http_server_config.", doc, _HTTP_KEYS)
    if "http2" in doc:
        _bool(path, "http_server_config.http2", doc["http2"])  # HTTP/1.1 is served either way
    headers = _mapping(path, "http_server_config.headers", doc.get("headers") or {})
    found = []
    for name, text in headers.items():
        if name not in HEADERS:
            raise _bad(
                path,
                f"http_server_config.headers: {name!r} cannot be configured (only {', '.join(HEADERS)})",
            )
        if not isinstance(text, str) or any(c in text for c in "\r\n\0"):
            raise _bad(path, f"http_server_config.headers.{name} must be one line of text")
        allowed = HEADERS[name]
        if allowed and text not in allowed:
            raise _bad(
                path,
                f"http_server_config.headers.{name} {text!r} is not one of {', '.join(allowed)}",
            )
        if text:  # blank: unset, as the toolkit says
            found.append((name, text))
    return tuple(found)


def _users(path: str, value: Any) -> dict[str, bytes]:
    if value is None:
        return {}
    doc = _mapping(path, "basic_auth_users", value)
    users = {}
    for user, hashed in doc.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise _bad(
                path,
                "basic_auth_users: a user name must be a non-empty string without ':' (quote "
                "names YAML reads otherwise, e.g. 'no', '123')",
            )
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise _bad(
                path,
                f"basic_auth_users: the password of {user!r} is not a bcrypt hash ($2y$, a cost "
                "of 04 to 31, 53 more characters): make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'` "
                "(the value is not shown)",
            )
        users[user] = hashed.encode()
    if users:
        try:
            import bcrypt  # noqa: F401  (checked now: a missing package said at start, not at a request)
        except ImportError:
            raise _bad(path, f"basic_auth_users needs the bcrypt package: {EXTRA}") from None
    return users
