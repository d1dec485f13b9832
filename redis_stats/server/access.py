"""Who may read what: the exporter's access control, off until the operator configures it.

Configured the way Prometheus exporters are: a web configuration file (``--web-config-file``,
prometheus/exporter-toolkit's format, :mod:`redis_stats.server.webconfig`: TLS, client
certificates, headers, basic-auth users with bcrypt hashes), and a bearer token file
(``--web-token-file``: Prometheus' ``authorization`` and KEDA's ``authModes: bearer`` send
``Authorization: Bearer <token>``). The :class:`Gate` holds what was read and applies it at two
places:

- **the connection** (:meth:`Gate.secure`, called by :mod:`redis_stats.server.http` on the
  connection's own thread, its slot taken): TLS, its handshake inside the request's deadline; a
  plain-HTTP request to the TLS port is answered ``400`` saying so; ``client_allowed_sans``
  checked on the verified certificate;
- **the request** (:meth:`Gate.check`, called by :class:`~redis_stats.server.app.App` for every path
  the operator did not open with ``--web-open``): with basic-auth users or tokens, a valid
  ``Authorization: Basic`` or ``Bearer`` (``401`` with ``WWW-Authenticate`` otherwise, the body
  never quoting what was sent); with only ``VerifyClientCertIfGiven``, a verified client
  certificate (``403`` otherwise: a client without one reaches the open paths only). With
  ``RequireAndVerifyClientCert`` every connection is authenticated by its certificate already; with
  both a certificate requirement and users or tokens, both are needed, as in the toolkit.

Comparisons are constant-time (``hmac.compare_digest`` over SHA-256 digests; bcrypt's own check);
an unknown user costs a bcrypt check like a known one (no user enumeration by timing). A bcrypt
check costs tens of milliseconds by design, so its result is cached per (user, hash, password)
digest (the toolkit does too), one check at a time.

**Reloads.** The files are looked at (``stat``) once a second by a thread of their own (never on a
request's: no request waits for a file to be read), and read again when one changed: a certificate
renewed by cert-manager, a Secret updated by Kubernetes (a new symlink target), a user added.
``SIGHUP`` to ``redis-stats exporter`` reloads at once; a refused file is tried again every 10 s
(a file it names may appear). A file that does not read is refused with an error in the log and
the last good one is kept (``redis_stats_exporter_web_config_last_reload_successful 0``), as is one
that would turn TLS on or off (set at start) or drop every credential while private views are
served. The toolkit reads its file on every request and answers ``500`` while it is broken; here a
broken file never takes the server down.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from redis_stats.background import survive
from redis_stats.errors import WebConfigError
from redis_stats.server.http import Request, Response, json_response, refuse_plain_http
from redis_stats.server.webconfig import WebConfig, read_tokens, read_web_config

__all__ = ["CHECK_EVERY", "RETRY_BROKEN", "Gate"]

log = logging.getLogger("redis_stats.exporter")

CHECK_EVERY = 1.0
"""Seconds between two looks at the files (a ``stat`` each) for a change."""

RETRY_BROKEN = 10.0
"""Seconds between two reads of files whose last read was refused, when none changed since."""

REALM = "redis_stats"
# bcrypt results kept (per (user, hash, password) digest), right and wrong apart: a spray of wrong
# passwords must not push out the right ones of the scrapers.
_CACHED = 256
_TLS_RECORD_HANDSHAKE = b"\x16"  # the first byte of every TLS connection (a ClientHello record)


@dataclass(frozen=True)
class _Loaded:
    """One read of the files: the web configuration, the tokens' digests, the TLS context, and
    the ``stat`` of every file read, taken before reading it."""

    web: WebConfig | None = None
    tokens: tuple[bytes, ...] = field(default=(), repr=False)
    context: ssl.SSLContext | None = None
    stats: dict[str, tuple[int, ...] | None] = field(default_factory=dict)

    @property
    def users(self) -> dict[str, bytes]:
        return dict(self.web.users) if self.web is not None else {}

    @property
    def http_auth(self) -> bool:
        """Whether a request needs an ``Authorization`` header (basic users or tokens given)."""
        return bool(self.tokens) or bool(self.web is not None and self.web.users)

    @property
    def certificates(self) -> str:
        """``required``, ``if given`` or ``""``: how TLS verifies client certificates."""
        tls = self.web.tls if self.web is not None else None
        if tls is None or not tls.verifies_clients:
            return ""
        return "required" if tls.requires_clients else "if given"

    @property
    def authenticates(self) -> bool:
        """Whether a request to a protected path must say who it is, one way or another."""
        return self.http_auth or bool(self.certificates)


def _stat(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)  # follows symlinks: a Kubernetes Secret's update swaps one
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Verdicts:
    """bcrypt verdicts kept, right and wrong apart, each bounded (oldest out)."""

    def __init__(self) -> None:
        self._kept: dict[bool, dict[bytes, None]] = {True: {}, False: {}}
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bool | None:
        with self._lock:
            for verdict, kept in self._kept.items():
                if key in kept:
                    return verdict
        return None

    def put(self, key: bytes, verdict: bool) -> None:
        with self._lock:
            kept = self._kept[verdict]
            kept[key] = None
            if len(kept) > _CACHED:
                del kept[next(iter(kept))]


class Gate:
    """The access control of one exporter (module docstring): *web_config_file* and
    *web_token_file* read now (:class:`WebConfigError` when one cannot be used), and again when they
    change. No file: nothing is checked (every call is a no-op)."""

    def __init__(self, web_config_file: str | None = None, web_token_file: str | None = None) -> None:
        self._config_file = web_config_file
        self._token_file = web_token_file
        self.enabled = bool(web_config_file or web_token_file)
        self.keep_authenticating = False
        """Set when private views are served without --insecure-private-views: a reload that
        would leave every request unauthenticated is then refused."""
        self._loaded = self._load() if self.enabled else _Loaded()
        self.tls = self._loaded.context is not None
        """Whether connections are TLS (set at start: a reload cannot turn it on or off)."""
        self._check(self._loaded)
        self._checked = time.monotonic()
        self._refused_stats: dict[str, tuple[int, ...] | None] = {}
        self._checking = threading.Lock()
        self._error = ""  # the last reload's error ("" once one succeeds)
        self._verdicts = _Verdicts()
        self._bcrypt = threading.Lock()  # one bcrypt check at a time: each is CPU for tens of ms
        self._counts: dict[tuple[str, str], int] = {}
        self._count_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"Gate(web_config_file={self._config_file!r}, web_token_file={self._token_file!r}, "
            f"tls={self.tls}, authenticates={self.authenticates})"
        )

    @property
    def authenticates(self) -> bool:
        """Whether requests to protected paths must say who they are (users, tokens or client
        certificates configured)."""
        return self._loaded.authenticates

    # -- loading --------------------------------------------------------------------------------

    def _load(self) -> _Loaded:
        stats: dict[str, tuple[int, ...] | None] = {}
        web, context = None, None
        tokens: tuple[bytes, ...] = ()
        if self._config_file:
            stats[self._config_file] = _stat(self._config_file)
            web = read_web_config(self._config_file)
            if web.tls is not None:
                stats.update((f, _stat(f)) for f in web.tls.files())
                context = web.tls.context(self._config_file)
        if self._token_file:
            stats[self._token_file] = _stat(self._token_file)
            tokens = read_tokens(self._token_file)
        return _Loaded(web, tokens, context, stats)

    def _check(self, loaded: _Loaded) -> None:
        """Refuse what a reload may not change."""
        if self.enabled and (loaded.context is not None) != self.tls:
            raise WebConfigError(
                "web_config_file",
                f"{self._config_file}: TLS is {'on' if self.tls else 'off'} since the exporter started; "
                f"a reload cannot turn it {'off' if self.tls else 'on'}: restart the exporter",
            )
        if self.keep_authenticating and not loaded.authenticates:
            raise WebConfigError(
                "web_config_file",
                f"{self._config_file or self._token_file}: no credential left (basic_auth_users, "
                "tokens or verified client certificates), but this exporter serves private views "
                "(per-tenant usage): keep one",
            )

    def current(self) -> _Loaded:
        """What is in force (no I/O: the files are looked at by :meth:`watch`'s thread)."""
        return self._loaded

    def look(self) -> bool:
        """Read the files again when one changed since they were read, or, while the last read was
        refused, every :data:`RETRY_BROKEN` seconds (a file it names may appear since); True when
        a new configuration was taken. One look: a ``stat`` of each file."""
        if not self.enabled:
            return False
        with self._checking:
            loaded = self._loaded
            stats = {f: _stat(f) for f in loaded.stats}
            changed = stats != loaded.stats and stats != self._refused_stats
            retry = bool(self._error) and time.monotonic() - self._checked >= RETRY_BROKEN
            if not (changed or retry):
                return False
            self._checked = time.monotonic()
            self._refused_stats = stats
            return self._reload()

    def watch(self, stop: threading.Event) -> None:
        """Look at the files every :data:`CHECK_EVERY` seconds until *stop* is set (the
        exporter's thread ``redis_stats-web-config``): a reload never runs on a request's thread,
        so no request waits for a file to be read, however large or broken."""
        while not stop.wait(CHECK_EVERY):
            with survive("web_config", log):
                self.look()

    def reload(self) -> bool:
        """Read the files again now (``SIGHUP``): True when they were taken, False when refused (the
        error logged, the configuration in force kept)."""
        if not self.enabled:
            return True
        with self._checking:
            self._checked = time.monotonic()
            return self._reload()

    def _reload(self) -> bool:
        try:
            loaded = self._load()
            self._check(loaded)
        except Exception as exc:  # whatever a file does, it costs the reload, never a request
            if not isinstance(exc, WebConfigError):  # a bug of the reading: its kind, not its text
                exc = WebConfigError("web_config_file", f"could not be read ({type(exc).__name__})")
            if str(exc) != self._error:  # said once per distinct error, not at every look
                self._error = str(exc)
                self._count("reload", "failure")
                log.error("access control not reloaded, the configuration in force is kept: %s", exc)
            return False
        self._loaded = loaded
        self._error = ""
        self._count("reload", "success")
        log.info("access control reloaded (%s)", self._describe(loaded))
        return True

    def _describe(self, loaded: _Loaded) -> str:
        parts = [
            "TLS" if loaded.context is not None else "plain HTTP",
            f"{len(loaded.users)} basic-auth users" if loaded.users else "",
            f"{len(loaded.tokens)} bearer tokens" if loaded.tokens else "",
            f"client certificates {loaded.certificates}" if loaded.certificates else "",
        ]
        return ", ".join(p for p in parts if p)

    def summary(self) -> str:
        """What is in force, in words, for the start-up line (never a secret)."""
        return self._describe(self._loaded) if self.enabled else "no access control"

    # -- the connection -------------------------------------------------------------------------

    def headers(self) -> tuple[tuple[str, str], ...]:
        """The headers every answer carries (``http_server_config.headers``)."""
        web = self._loaded.web
        return web.headers if web is not None else ()

    def secure(self, sock: socket.socket, deadline: float) -> socket.socket:
        """*sock* as TLS when TLS is on, its handshake done by *deadline* (:class:`http.Guard`)."""
        loaded = self.current()
        if loaded.context is None:
            return sock
        try:
            first = _peek(sock, deadline)
        except TimeoutError:
            self._count("tls", "timeout")
            raise
        if first != _TLS_RECORD_HANDSHAKE:
            self._count("tls", "plain_http" if first else "closed")
            if first:
                refuse_plain_http(sock)
            raise ConnectionAbortedError("not a TLS client")
        conn = loaded.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        try:
            conn.settimeout(_left(deadline))
            conn.do_handshake()  # one deadline for the whole call (CPython's _ssl), not per read
        except TimeoutError:
            self._count("tls", "timeout")
            conn.close()
            raise
        except ssl.SSLError:
            self._count("tls", "handshake")
            conn.close()
            raise
        except BaseException:
            conn.close()
            raise
        tls = loaded.web.tls if loaded.web is not None else None
        if tls is not None and not tls.allows(conn.getpeercert()):
            self._count("tls", "client_name")
            conn.close()
            raise ConnectionAbortedError("the client certificate holds no name of client_allowed_sans")
        return conn

    # -- the request ----------------------------------------------------------------------------

    def check(self, request: Request) -> Response | None:
        """None when *request* may be served a protected path; otherwise its ``401`` (or ``403``)."""
        loaded = self.current()
        if loaded.http_auth:
            scheme, _, credentials = request.header("Authorization").strip().partition(" ")
            scheme, credentials = scheme.lower(), credentials.strip()
            if scheme == "basic" and loaded.users and self._basic(loaded.users, credentials):
                return None
            if scheme == "bearer" and loaded.tokens and _bearer(loaded.tokens, credentials):
                return None
            self._count("denied", "wrong_credentials" if scheme else "no_credentials")
            return _challenge(loaded, wrong_token=scheme == "bearer")
        if loaded.certificates and not request.client_cert:
            self._count("denied", "no_client_certificate")
            return json_response(
                403, {"error": "forbidden: this path needs a client certificate (TLS) this server verifies"}
            )
        return None

    def _basic(self, users: dict[str, bytes], credentials: str) -> bool:
        try:
            decoded = base64.b64decode(credentials, validate=True)
        except (binascii.Error, ValueError):
            return False
        name, colon, password = decoded.partition(b":")
        if not colon:
            return False
        try:
            hashed = users.get(name.decode())
        except UnicodeDecodeError:
            hashed = None
        known = hashed is not None
        # An unknown user is checked against a real hash all the same: the same bcrypt cost, so
        # the time of a refusal does not say whether the user exists.
        hashed = hashed if hashed is not None else next(iter(users.values()))
        key = hashlib.sha256(b"\0".join((name, hashed, password))).digest()
        verdict = self._verdicts.get(key)
        if verdict is None:
            with self._bcrypt:
                verdict = _bcrypt_ok(password, hashed)
            self._verdicts.put(key, verdict)
        return verdict and known

    # -- its own metrics --------------------------------------------------------------------------

    def _count(self, what: str, reason: str) -> None:
        with self._count_lock:
            self._counts[what, reason] = self._counts.get((what, reason), 0) + 1

    def describe(self) -> list[Metric]:
        """Nothing: registering never reads (prometheus_client's ``describe``)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """``redis_stats_exporter_web_config_*``, ``..._unauthorized_requests_total{reason}``,
        ``..._tls_handshake_failures_total{reason}`` (docs/self-metrics.md); nothing without access
        control."""
        if not self.enabled:
            return
        with self._count_lock:
            counts = dict(self._counts)
        families = (
            ("reload", "redis_stats_exporter_web_config_reloads", "result", ("success", "failure"),
             "Reloads of the web configuration and token files after a change or SIGHUP, by result "
             "(a failure keeps the configuration in force and is logged)."),
            ("denied", "redis_stats_exporter_unauthorized_requests", "reason",
             ("no_credentials", "wrong_credentials", "no_client_certificate"),
             "Requests to a protected path refused (401 or 403), by reason."),
            ("tls", "redis_stats_exporter_tls_handshake_failures", "reason",
             ("timeout", "plain_http", "closed", "handshake", "client_name"),
             "Connections closed before a request for their TLS: no hello within the request "
             "timeout, plain HTTP (answered 400), closed, a failed handshake (a client "
             "certificate missing, expired or not signed by the client CA...), or a certificate "
             "without a name of client_allowed_sans."),
        )  # fmt: skip
        for what, name, label, reasons, doc in families:
            fam = CounterMetricFamily(name, doc, labels=[label])
            for reason in reasons:
                fam.add_metric([reason], float(counts.get((what, reason), 0)))
            yield fam
        yield GaugeMetricFamily(
            "redis_stats_exporter_web_config_last_reload_successful",
            "1 when the web configuration and token files in force are the ones on disk, 0 when the "
            "last change could not be read (the previous configuration is kept).",
            value=0.0 if self._error else 1.0,
        )


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no TLS handshake within the request timeout")
    return left


def _peek(sock: socket.socket, deadline: float) -> bytes:
    """The connection's first byte, left in the socket (``b""``: closed), waiting until *deadline*."""
    sock.settimeout(_left(deadline))
    return sock.recv(1, socket.MSG_PEEK)


def _bearer(tokens: tuple[bytes, ...], credentials: str) -> bool:
    digest = hashlib.sha256(credentials.encode("utf-8", "surrogateescape")).digest()
    found = False
    for token in tokens:  # every one compared: the time does not say which matched
        found |= hmac.compare_digest(token, digest)
    return found


def _bcrypt_ok(password: bytes, hashed: bytes) -> bool:
    import bcrypt  # an optional dependency (redis_stats[web]), checked when the file was read

    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:  # longer than bcrypt's 72 bytes, a NUL byte: refused, as Go's bcrypt does
        return False


def _challenge(loaded: _Loaded, wrong_token: bool) -> Response:
    challenges = []
    if loaded.users:
        challenges.append(("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"'))
    if loaded.tokens:
        error = ', error="invalid_token"' if wrong_token else ""
        challenges.append(("WWW-Authenticate", f'Bearer realm="{REALM}"{error}'))
    ways = " or ".join(w for w, on in (("basic auth", loaded.users), ("a bearer token", loaded.tokens)) if on)
    doc = {"error": f"unauthorized: this path needs credentials ({ways})"}
    return json_response(401, doc, tuple(challenges))
