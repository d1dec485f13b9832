"""StatsConfig: every setting of redis_stats, from arguments or ``REDIS_STATS_*`` variables.

One place lists the options, their defaults, their environment variables and how each is
checked, so that ``docs/configuration.md`` and the code cannot drift apart (a test compares them).
A variable read outside :class:`StatsConfig` (by an integration: the vLLM plugin's) is declared as
an :class:`EnvVar` and read through it, never with ``os.environ`` directly, so that it is listed
and documented the same way (``python -m redis_stats.tools.config_table`` prints both tables).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import unquote, unquote_plus

from redis_stats.errors import ConfigError  # defined in errors.py; importable from here as it always was

__all__ = [
    "DEFAULT_STALE_AFTER",
    "ENV_PREFIX",
    "MAX_SHARDS",
    "MAX_STALE_AFTER",
    "MIN_STALE_AFTER",
    "RETENTION_FACTOR",
    "SCHEMES",
    "SECRET_QUERY_WORDS",
    "ConfigError",
    "EnvVar",
    "StatsConfig",
    "env_markdown",
    "is_endpoint",
    "is_namespace",
    "mask_url",
    "redact",
    "url_problem",
    "url_secrets",
    "warn_unknown_variables",
]

ENV_PREFIX = "REDIS_STATS_"
LEADER_MODES = ("rank0", "lease", "none")
# The most shards a namespace may be split into (each is one script call per flush round of a
# writer that touches it, and one read per scrape).
MAX_SHARDS = 64

# A namespace becomes part of every key (`rs:{NS}:...`). Braces would break the Cluster hash tag
# and glob characters would widen ACL key patterns, so only a conservative alphabet is allowed.
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._\-/:]{1,128}")  # fullmatch: "$" takes a final newline
# An endpoint id: what a router knows an API server by ("10.0.0.7:8000", "pod-a:8000",
# "[fd00::7]:8000"). Shown as a label value and given back in ?endpoint=: no spaces, quotes,
# backslashes or URL delimiters (& ? # %), so it needs no escaping anywhere.
_ENDPOINT_RE = re.compile(r"[A-Za-z0-9._\-/:\[\]@]{1,128}")


# A query parameter holds a secret when its name (lower-cased, percent-decoded) contains one of
# these: ``password``, ``sentinel_password``, ``ssl_password``, ``passwd``, ``passphrase``, ``pwd``,
# ``secret``, ``token``, ``auth``, ``credential(s)``, ``apikey``/``api_key``. Over-masking a value
# costs a less helpful log line; under-masking leaks a credential, so the list errs wide.
SECRET_QUERY_WORDS = ("pass", "pwd", "secret", "token", "auth", "cred", "apikey", "api_key")

# The URL schemes redis_stats connects to (redis_stats.connection builds the client for each).
SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster")

_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")
_MASK = "***"


@dataclasses.dataclass(frozen=True)
class _UrlParts:
    """A URL cut where RFC 3986 cuts it, without decoding anything (no ``urlsplit``: it raises
    on some inputs, and its messages quote the URL)."""

    prefix: str  # "scheme://", or "" when there is none
    userinfo: str | None  # before the last "@" of the authority
    hosts: str  # the rest of the authority: host[:port][,host[:port]...]
    path: str
    query: str | None  # after the first "?", without it
    fragment: str | None  # after the first "#", without it
    at_after_hosts: bool  # an "@" beyond the authority: a password with a raw / ? or #


def _cut(url: str) -> _UrlParts:
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME_RE.match(scheme):
        scheme, sep, rest = "", "", url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo = None
    if "@" in authority:
        userinfo, authority = authority.rsplit("@", 1)
    tail, hash_sign, fragment = tail.partition("#")
    path, qmark, query = tail.partition("?")
    return _UrlParts(
        prefix=scheme + sep,
        userinfo=userinfo,
        hosts=authority,
        path=path,
        query=query if qmark else None,
        fragment=fragment if hash_sign else None,
        at_after_hosts="@" in rest[end:],
    )


def _is_secret_name(name: str) -> bool:
    lowered = unquote_plus(name).lower()
    return any(word in lowered for word in SECRET_QUERY_WORDS)


def _mask_hosts(hosts: str) -> str:
    # "redis://host:secret" (a forgotten "user@") puts the password where the port goes: a port
    # that is not a number is never shown.
    out = []
    for part in hosts.split(","):
        host, colon, port = part.rpartition(":")
        if colon and port and not port.isdigit() and not part.endswith("]"):
            part = f"{host}:{_MASK}"
        out.append(part)
    return ",".join(out)


def mask_url(url: object) -> str:
    """Return *url* with every credential replaced by ``***``; never raises.

    Masked: the password of the user part (``user:***@``; a lone ``secret@`` becomes ``***@``),
    the value of every query parameter named in :data:`SECRET_QUERY_WORDS` (``password=``,
    ``sentinel_password=``, ...), a query piece without ``=`` and a ``#fragment`` (both are what
    is left of a password holding a raw ``&`` or ``#``), and a port that is not a number. A URL
    with an ``@`` after its host part (a password holding a raw ``/``, ``?`` or ``#``) cannot be
    cut safely: only its scheme is shown. User names, hosts, ports, paths and other parameters
    stay readable. Works for every scheme redis_stats accepts, including comma-separated
    Sentinel/Cluster hosts.
    """
    try:
        return _mask(url)
    except Exception:  # a mask that raises would turn a log line into a traceback quoting the URL
        return "<URL not shown>"


def _mask(url: object) -> str:
    if not isinstance(url, str):
        return f"<not a URL: {type(url).__name__}>"
    parts = _cut(url)
    if parts.at_after_hosts:
        return f"{parts.prefix}<not shown: '@' after the host part>"
    text = parts.prefix
    if parts.userinfo is not None:
        text += _mask_userinfo(parts.userinfo)
    text += _mask_hosts(parts.hosts) + parts.path
    if parts.query is not None:
        text += "?" + "&".join(_mask_query_piece(piece) for piece in parts.query.split("&"))
    if parts.fragment is not None:
        text += "#" + _MASK
    return text


def _mask_userinfo(userinfo: str) -> str:
    user, colon, _password = userinfo.partition(":")
    # A lone "secret@" is a password for Sentinel/Cluster URLs and a user name for redis-py:
    # masked either way.
    return f"{user}:{_MASK}@" if colon else f"{_MASK}@"


def _mask_query_piece(piece: str) -> str:
    name, eq, _value = piece.partition("=")
    if not eq:
        return _MASK if piece else piece
    return f"{name}={_MASK}" if _is_secret_name(name) else piece


def url_secrets(url: str) -> list[str]:
    """Every credential in *url*, as written and decoded (for :func:`redact`)."""
    try:
        parts = _cut(url)
    except Exception:
        return []
    found = _query_secrets(parts.query or "")
    if parts.userinfo is not None:
        user, colon, password = parts.userinfo.partition(":")
        found.append(password if colon else user)
    secrets = {spelling for raw in found for spelling in (raw, unquote(raw), unquote_plus(raw))}
    # Longest first, so that a secret containing another one is replaced whole.
    return sorted((s for s in secrets if s), key=len, reverse=True)


def _query_secrets(query: str) -> list[str]:
    """The values of the query parameters whose names say they hold a secret, as written."""
    found = []
    for piece in query.split("&"):
        name, eq, value = piece.partition("=")
        if eq and _is_secret_name(name):
            found.append(value)
    return found


def redact(text: str, url: str) -> str:
    """*text* with every credential of *url* replaced by ``***``.

    For messages that come from elsewhere (redis-py's exceptions) and could quote a password:
    the last line of defence before a message is logged or served.
    """
    for secret in url_secrets(url):
        text = text.replace(secret, _MASK)
    return text


def url_problem(url: object) -> str | None:
    """Why *url* cannot be used as a Redis URL, without quoting any part of a secret; or None.

    A password or query value must percent-encode ``/ ? # @ &`` (``%2F %3F %23 %40 %26``):
    a raw one makes the URL ambiguous, and a wrong guess would send part of the password to
    a DNS lookup or an error message.
    """
    if not isinstance(url, str):
        return f"the Redis URL is a {type(url).__name__}, not a string"
    parts = _cut(url)
    return (
        _scheme_problem(parts.prefix)
        or _ambiguity_problem(parts)
        or _port_problem(parts.hosts)
        or _database_problem(parts)
    )


def _database_problem(parts: _UrlParts) -> str | None:
    """A ``redis://`` or ``rediss://`` path that is no database number: redis-py reads
    ``/abc`` (and ``/0/x``) as database 0, so a typo would write to another database in silence."""
    if parts.prefix.lower() not in ("redis://", "rediss://"):
        return None  # unix: the path is the socket's; Sentinel's is checked with its service
    db = parts.path[1:] if parts.path.startswith("/") else parts.path
    if db == "" or (db.isascii() and db.isdigit()):
        return None
    shown = repr(db[:20]) + ("..." if len(db) > 20 else "")
    return (
        f"its path {shown} is not a database number: write a number >= 0 after the host "
        "(redis://host:6379/0, /1, ...), or no path for database 0"
    )


def _scheme_problem(prefix: str) -> str | None:
    if not prefix:
        return "it has no scheme:// (use e.g. redis://127.0.0.1:6379/0)"
    scheme = prefix[:-3].lower()
    if scheme not in SCHEMES:
        return f"scheme {scheme!r} is not supported; use one of {', '.join(SCHEMES)}"
    return None


def _ambiguity_problem(parts: _UrlParts) -> str | None:
    """A raw ``@ # &`` where a password may hold one: where the URL would have to be guessed."""
    if parts.at_after_hosts:
        return (
            "it has an '@' after its host part: a password (or query value) holding '/', '?', "
            "'#' or '@' must percent-encode them as %2F, %3F, %23, %40"
        )
    if parts.fragment is not None:
        return "it has a '#' (Redis URLs have no fragment): write a '#' in a password as %23"
    if any(piece and "=" not in piece for piece in (parts.query or "").split("&")):
        return (
            "a query parameter has no '=' (a raw '&' in a password?): write parameters as "
            "name=value and a '&' inside a value as %26"
        )
    return None


def _port_problem(hosts: str) -> str | None:
    for i, part in enumerate(hosts.split(",") if hosts else (), 1):
        _host, colon, port = part.rpartition(":")
        if colon and port and not part.endswith("]") and not _is_port(port):
            return f"the port of host {i} is not a number from 1 to 65535 (a password without 'user:...@'?)"
    return None


def _is_port(text: str) -> bool:
    return text.isdigit() and 0 < int(text) < 65536


@dataclasses.dataclass(frozen=True)
class _Option:
    name: str
    env: str
    kind: Callable[[str], Any]
    help: str


_FLAGS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def flag(text: str) -> bool:
    """A yes/no setting's text (``1 true yes on``, ``0 false no off``, any case) as a bool."""
    try:
        return _FLAGS[text.strip().lower()]
    except KeyError:
        raise ValueError(f"{text!r} is not one of {' '.join(_FLAGS)}") from None


flag.__name__ = "flag (1/0, true/false, yes/no, on/off)"


def _opt(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


MIN_STALE_AFTER = 0.1
"""The shortest ``stale_after`` (s) a config accepts, and the smallest stored ``stale_ms`` readers
and gc use (``_core/read/liveness.py``; a stored value below the writer's own stored ``flush_ms`` is not
used either). No flush cadence keeps a heartbeat younger than this through a busy host's stalls
(a thread's wake-up, a round trip, a collection), so a smaller value only flaps."""

MAX_STALE_AFTER = 3600.0
"""The longest ``stale_after`` (s) a config accepts, and the largest stored ``stale_ms`` readers and
gc use: a dead engine is shown up for at most this long, whatever a writer stored."""

DEFAULT_STALE_AFTER = 30.0
"""``stale_after``'s default, and what readers and gc judge a writer by when the ``stale_ms`` it
stored is missing or unusable (not a number, or outside MIN..MAX): one value, never another
writer's."""

RETENTION_FACTOR = 2
"""``retention`` must be at least this many times ``max(stale_after, flush_interval)``: gc must
never remove a writer or an engine that a reader still counts as live."""


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    """Settings shared by writers, readers, the collector, the reporter and the exporter.

    Build one with keyword arguments, or with :meth:`from_env` to read ``REDIS_STATS_*``
    variables (arguments given to ``from_env`` win over the environment). ``repr()`` and
    :attr:`safe_url` never show the password.
    """

    url: str = _opt(
        "redis://127.0.0.1:6379/0",
        "Redis URL: ``redis://``, ``rediss://`` (TLS), ``unix://``, ``redis+sentinel://``, "
        "``redis+cluster://`` (``rediss+sentinel://``, ``rediss+cluster://``: with TLS).",
    )
    namespace: str = _opt(
        "default",
        "One deployment (one served model). All keys live under ``rs:{namespace}:``.",
    )
    flush_interval: float = _opt(
        1.0,
        "Seconds between two flushes of a writer (each flush is one script call per shard written).",
    )
    stale_after: float = _opt(
        DEFAULT_STALE_AFTER,
        "A writer's: seconds without its heartbeat after which it and its engines are DOWN (gauges "
        "hidden). Stored in Redis: every reader judges each writer by its own value. 0.1 to 3600; "
        "a writer whose stored value is unusable is judged by 30.",
    )
    retention: float = _opt(
        86400.0,
        "Seconds after which ``gc`` removes an engine or writer that stopped heartbeating.",
    )
    connect_timeout_ms: int = _opt(
        1000,
        "TCP connect timeout of every Redis connection, in milliseconds.",
    )
    socket_timeout_ms: int = _opt(
        1000,
        "Read/write timeout of every Redis command, in milliseconds.",
    )
    max_label_length: int = _opt(
        1024,
        "A label set with a value longer than this many characters is dropped and counted, never stored.",
    )
    max_series_per_metric: int = _opt(
        10000,
        "Label sets per metric and engine beyond this are dropped and counted, never stored.",
    )
    wait_replicas: int = _opt(
        0,
        "Opt-in durability: a flush counts as done only once this many replicas acknowledged it "
        "(WAIT); until then it is retried (exactly once). 0: done when the master applied it. "
        "With `leader=lease`, a take or renewal of the log lease extends the holder's validity only "
        "once acknowledged too: set it with replicas and failover, or two processes can print across "
        "a failover (docs/logging.md).",
    )
    wait_timeout_ms: int = _opt(
        500, "How long a flush (or a lease renewal) waits for ``wait_replicas`` acknowledgements."
    )
    leader: str = _opt(
        "rank0",
        "Who prints the periodic log: ``rank0`` (the process managing engine ``leader_rank``), "
        "``lease`` (the holder of a Redis lease that fails over), or ``none``.",
    )
    leader_rank: int = _opt(0, "The engine whose process prints when ``leader`` is ``rank0``.")
    lease_ttl: float = _opt(
        10.0,
        "Seconds a log lease lives without renewal; another process takes over within about "
        "4/3 of it when the holder dies.",
    )
    log_interval: float = _opt(
        10.0,
        "Seconds between two periodic log reports (under vLLM: ``VLLM_LOG_STATS_INTERVAL``).",
    )
    engine_offset: int = _opt(
        0,
        "Added to every engine index a writer records (independent instances that each call their engine 0).",
    )
    shards: int = _opt(
        1,
        "Shards of the namespace: engine ``e`` lives in shard ``e % shards``, each shard its own "
        "Cluster hash tag, so a deployment spreads over that many Cluster masters (1: one slot, "
        "the unsharded keys). Give every writer of a namespace the same value; readers and gc "
        "also read every K the writers used (listed in shard 0's catalogue).",
    )
    close_timeout: float = _opt(
        1.0,
        "Seconds a writer's ``close()`` (also run at interpreter exit) waits for Redis to confirm its "
        "last flush; then it logs what was lost and returns, so a dead Redis never holds a shutdown.",
    )

    endpoint: str | None = _opt(
        None,
        "The endpoint this writer's engines are served behind, as a router reaches it (e.g. "
        "``10.0.0.7:8000``: host or IP and the API port); stored with the writer, so readers group "
        "engines by endpoint (``GET /endpoints``, ``/metrics?endpoint=``). 1-128 of ``A-Z a-z 0-9 . "
        "_ - / : [ ] @``. The vLLM plugin's default: the pod's IP (``POD_IP``) or host name and "
        "vLLM's ``--port``. None: no endpoint.",
    )
    atomic_scripts: bool = _opt(
        False,
        "Say that the server runs scripts atomically although it cannot say so itself: Garnet "
        "started with ``--lua --lua-transaction-mode`` (without that mode Garnet runs a script as "
        "separate commands, and redis_stats refuses it). Only Garnet asks for it.",
    )
    load_interval: float = _opt(
        0.08,
        "The load lane: seconds between two stores of a writer's load entries alone (the ``/load`` "
        "feed's fields: requests, KV usage, ...) between its flushes. The writer looks at its "
        "router numbers every 10 ms and stores those that changed at once, or this long after "
        'its last such store: a change is in Redis within it (docs/load.md, "The load lane"). '
        "0: only with each flush; not shorter than ``flush_interval``: the flushes are as quick, "
        "no lane. Only for writers given a load map (the vLLM plugin's, the bridge's).",
    )

    @property
    def lane_interval(self) -> float:
        """The load lane's interval in effect: :attr:`load_interval` when shorter than the flush
        interval, else 0 (no lane: every flush stores the entries anyway)."""
        return self.load_interval if self.load_interval < self.flush_interval else 0.0

    def __post_init__(self) -> None:
        # The checks run in order and the first problem is raised: each setting's own rule before
        # any comparison that relies on it being a number (see _CHECKS).
        for check in _CHECKS:
            problem = check(self)
            if problem is not None:
                raise ConfigError(problem)

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{f.name}={mask_url(self.url)!r}" if f.name == "url" else f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
        )
        return f"StatsConfig({fields})"

    @property
    def safe_url(self) -> str:
        """The URL with its password masked: the only form of it that may be printed or logged."""
        return mask_url(self.url)

    def replace(self, **changes: Any) -> StatsConfig:
        """Return a copy with *changes* applied (and checked)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def options(cls) -> list[_Option]:
        """Every option: its field name, environment variable, type and one-line help."""
        return list(_options().values())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> StatsConfig:
        """Build a config from ``REDIS_STATS_*`` variables; keyword *overrides* win.

        A variable that does not parse raises :class:`ConfigError` naming the variable; one that
        no part of redis_stats reads (a misspelt name: ``REDIS_STATS_NAMESPCE``) is warned about
        once per process, naming the closest one (:func:`warn_unknown_variables`), never ignored
        in silence.
        """
        env = os.environ if environ is None else environ
        warn_unknown_variables(environ=env)
        values: dict[str, Any] = {}
        for opt in _options().values():
            raw = env.get(opt.env)
            if raw is None or raw == "":
                continue
            try:
                values[opt.name] = opt.kind(raw)
            except ValueError:
                raise ConfigError(
                    f"{opt.env}={raw!r} is not a valid {opt.kind.__name__} ({opt.help})"
                ) from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - set(_options())
        if unknown:
            raise ConfigError(f"unknown option(s) {sorted(unknown)}; known: {sorted(_options())}")
        return cls(**values)


def _url_check(config: StatsConfig) -> str | None:
    problem = url_problem(config.url)
    if problem is None:
        return None
    # Never quote the URL itself: only its masked form (the mask never shows a secret).
    return (
        f"url {mask_url(config.url)} is not a usable Redis URL: {problem} "
        f"(set it with url=..., {ENV_PREFIX}URL or --redis-url-file)"
    )


def _is_namespace(value: object) -> bool:
    return isinstance(value, str) and _NAMESPACE_RE.fullmatch(value) is not None


def is_namespace(value: object) -> bool:
    """Whether *value* is a namespace name a config accepts (1-128 of ``A-Z a-z 0-9 . _ - / :``)."""
    return _is_namespace(value)


def _is_positive_seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and value > 0 and value != float("inf")


def _is_endpoint(value: object) -> bool:
    return value is None or (isinstance(value, str) and _ENDPOINT_RE.fullmatch(value) is not None)


def is_endpoint(value: object) -> bool:
    """Whether *value* is an endpoint id a config accepts (1-128 of ``A-Z a-z 0-9 . _ - / : [ ] @``)."""
    return value is not None and _is_endpoint(value)


def _is_seconds_or_zero(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and value >= 0


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_leader_mode(value: object) -> bool:
    return value in LEADER_MODES


def _is_shard_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_SHARDS


@dataclasses.dataclass(frozen=True)
class _Rule:
    """A check of settings on their own: each of *names* must satisfy *valid*, or the problem
    is ``name=value`` followed by *must*."""

    names: tuple[str, ...]
    valid: Callable[[object], bool]
    must: str

    def __call__(self, config: StatsConfig) -> str | None:
        for name in self.names:
            value = getattr(config, name)
            if not self.valid(value):
                return f"{name}={value!r} {self.must}"
        return None


def _stale_after_check(config: StatsConfig) -> str | None:
    sa = config.stale_after
    if not MIN_STALE_AFTER <= sa <= MAX_STALE_AFTER:
        bound, which = (MIN_STALE_AFTER, "least") if sa < MIN_STALE_AFTER else (MAX_STALE_AFTER, "most")
        return (
            f"stale_after={sa:g} is outside {MIN_STALE_AFTER:g}..{MAX_STALE_AFTER:g} s: {bound:g} s is the "
            f"{which} that readers and gc take from a writer (a stored value beyond it is not used, and "
            f"the writer is judged by the default {DEFAULT_STALE_AFTER:g} s instead); make stale_after "
            f"{'at least' if which == 'least' else 'at most'} {bound:g} s"
        )
    if config.stale_after < config.flush_interval:
        return (
            f"stale_after={config.stale_after} is shorter than flush_interval="
            f"{config.flush_interval}: every engine would look stale between two flushes; "
            "make stale_after several flush intervals long"
        )
    return None


def _retention_check(config: StatsConfig) -> str | None:
    safe = RETENTION_FACTOR * max(config.stale_after, config.flush_interval)
    if config.retention < safe:
        return (
            f"retention={config.retention:g} is shorter than {RETENTION_FACTOR} x max(stale_after="
            f"{config.stale_after:g}, flush_interval={config.flush_interval:g}) = {safe:g} s: gc would "
            "remove writers and engines that readers still count as live, and their data with "
            f"them; make retention at least {safe:g} s (or shorten stale_after)"
        )
    return None


# What StatsConfig checks, in this order (the first problem is raised). The rules of the times
# come before the comparisons between them, which need numbers.
_CHECKS: tuple[Callable[[StatsConfig], str | None], ...] = (
    _url_check,
    _Rule(
        ("namespace",),
        _is_namespace,
        "is not allowed: use 1-128 characters from A-Z a-z 0-9 . _ - / : (no braces, spaces or glob "
        "characters, which would break the key prefix rs:{NS}: and its ACL pattern)",
    ),
    _Rule(
        ("endpoint",),
        _is_endpoint,
        "is not an endpoint id: use 1-128 characters from A-Z a-z 0-9 . _ - / : [ ] @ (no spaces, "
        "quotes or URL delimiters), e.g. 10.0.0.7:8000, the address a router reaches the API server at",
    ),
    _Rule(
        ("flush_interval", "stale_after", "retention", "lease_ttl", "log_interval"),
        _is_positive_seconds,
        "must be a positive number of seconds",
    ),
    _Rule(("close_timeout",), _is_seconds_or_zero, "must be a number of seconds >= 0 (0: do not wait)"),
    _Rule(("load_interval",), _is_seconds_or_zero, "must be a number of seconds >= 0 (0: no load lane)"),
    _stale_after_check,
    _retention_check,
    _Rule(("wait_replicas",), _is_count, "must be an integer >= 0"),
    _Rule(("atomic_scripts",), lambda v: isinstance(v, bool), "must be True or False"),
    _Rule(
        (
            "connect_timeout_ms",
            "socket_timeout_ms",
            "max_label_length",
            "max_series_per_metric",
            "wait_timeout_ms",
        ),
        _is_positive_int,
        "must be a positive integer",
    ),
    _Rule(("leader",), _is_leader_mode, f"must be one of {', '.join(LEADER_MODES)}"),
    _Rule(("leader_rank", "engine_offset"), _is_count, "must be an integer >= 0"),
    _Rule(
        ("shards",),
        _is_shard_count,
        f"must be an integer from 1 to {MAX_SHARDS} (1: the whole namespace in one Cluster slot; the "
        "number of Cluster masters to spread a deployment over them)",
    ),
)


def options_markdown() -> str:
    """The options table of docs/configuration.md (``python -m redis_stats.tools.config_table`` prints it)."""
    defaults = {f.name: f.default for f in dataclasses.fields(StatsConfig)}
    rows = ["| option | environment variable | default | meaning |", "|---|---|---|---|"]
    for o in _options().values():
        rows.append(f"| `{o.name}` | `{o.env}` | `{defaults[o.name]}` | {o.help} |")
    return "\n".join(rows)


def _options() -> dict[str, _Option]:
    kinds: dict[str, Callable[[str], Any]] = {"str": str, "str | None": str, "float": float, "int": int}
    kinds["bool"] = flag
    return {
        f.name: _Option(f.name, ENV_PREFIX + f.name.upper(), kinds[str(f.type)], f.metadata["help"])
        for f in dataclasses.fields(StatsConfig)
    }


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """An environment variable read outside :class:`StatsConfig`'s options (by an integration):
    its *name*, its *default* as text (``""``: unset means off), who reads it and what it means."""

    name: str
    default: str
    used_by: str
    help: str

    def get(self, environ: Mapping[str, str] | None = None) -> str:
        """The variable's value as set; its default when unset or empty."""
        env = os.environ if environ is None else environ
        return env.get(self.name) or self.default

    def number(self, environ: Mapping[str, str] | None = None) -> float:
        """The value as a number; :class:`ConfigError` naming the variable if it is not one."""
        raw = self.get(environ)
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{self.name}={raw!r} is not a number ({self.help})") from None


def env_markdown(variables: list[EnvVar] | tuple[EnvVar, ...]) -> str:
    """A table of *variables* as docs/configuration.md lists them."""
    rows = ["| variable | used by | default | meaning |", "|---|---|---|---|"]
    for v in variables:
        rows.append(f"| `{v.name}` | {v.used_by} | {f'`{v.default}`' if v.default else 'unset'} | {v.help} |")
    return "\n".join(rows)


READ_ELSEWHERE = frozenset(
    {
        "REDIS_STATS_PORT",
        "REDIS_STATS_ADDR",
        "REDIS_STATS_VIEW",
        "REDIS_STATS_POD_INDEX",
        "REDIS_STATS_SERVER_BINARY",
        "REDIS_STATS_WEB_CONFIG_FILE",
        "REDIS_STATS_WEB_TOKEN_FILE",
        "REDIS_STATS_WEB_OPEN",
        "REDIS_STATS_TENANT_HEADER",
        "REDIS_STATS_LITELLM_TENANT",
    }
)
"""The ``REDIS_STATS_*`` variables read outside :class:`StatsConfig`'s options by other parts of
this distribution (the vLLM plugin's view, its access control, pod index and tenant header, the
LiteLLM callback's tenant, the private server's binary), by name
only: so that :func:`warn_unknown_variables` knows them in a process that imported none of those
parts (the library's :meth:`StatsConfig.from_env`). ``tests/unit/test_misconfiguration.py`` keeps
it equal to the :class:`EnvVar` declarations."""

PREFIX_CUTOFF = 0.88
"""How alike (``difflib`` ratio) a variable without our prefix must be to one of our names to be
warned about as a mistyped prefix: ``REDIS_STAT_URL`` (0.97) and ``REDIS_STATUS_URL`` (0.94) are;
``REDIS_URL`` (0.75) and ``REDIS_TLS_URL`` (0.86), other programs' names, are not."""

_log = logging.getLogger("redis_stats.config")
_warned_variables: set[str] = set()  # each unknown name is warned about once per process


def unknown_variables(
    known: Iterable[str],
    environ: Mapping[str, str] | None = None,
    *,
    prefix: str = ENV_PREFIX,
    suggest: Iterable[str] | None = None,
) -> dict[str, str | None]:
    """Each variable set in *environ* whose name starts with *prefix* but is neither a
    :class:`StatsConfig` option's nor in *known*, with the closest name of *suggest* (default:
    the known ones; ``difflib``), or None when none is close. With *suggest* given, a name close
    to none of them is not reported (another program's variable sharing the prefix). Without
    *suggest*, a name that does not start with *prefix* but is nearly one of ours (the prefix
    mistyped: ``REDIS_STAT_URL``) is reported with it (:data:`PREFIX_CUTOFF`)."""
    env = os.environ if environ is None else environ
    names = {o.env for o in _options().values()} | READ_ELSEWHERE | set(known)
    candidates = _unprefixed(names if suggest is None else suggest, prefix)
    found: dict[str, str | None] = {}
    if suggest is None:
        found.update(_mistyped_prefixes(env, names, prefix))
    for name in sorted(env):
        if not name.startswith(prefix) or name in names:
            continue
        close = _closest(name[len(prefix) :], candidates)
        if close is not None or suggest is None:
            found[name] = close
    return dict(sorted(found.items()))


def _mistyped_prefixes(env: Mapping[str, str], names: set[str], prefix: str) -> dict[str, str | None]:
    """Variables whose prefix itself is mistyped (``REDIS_STAT_URL``, ``REDISSTATS_URL``), each
    with the name of ours it nearly is: only when the whole name is that close (``REDIS_URL``,
    another program's, is not: :data:`PREFIX_CUTOFF`)."""
    ours = sorted(n for n in names if n.startswith(prefix))
    found: dict[str, str | None] = {}
    for name in env:
        if not name.startswith(prefix):
            near = difflib.get_close_matches(name, ours, n=1, cutoff=PREFIX_CUTOFF)
            if near:
                found[name] = near[0]
    return found


def _unprefixed(names: Iterable[str], prefix: str) -> dict[str, str]:
    # Compared without the prefix they share, which would make every pair look alike.
    return {n[len(prefix) :]: n for n in names if n.startswith(prefix)}


def _closest(name: str, candidates: Mapping[str, str]) -> str | None:
    """The full name of the candidate closest to *name* (both without the prefix), or None."""
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return candidates[close[0]] if close else None


def warn_unknown_variables(
    known: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    *,
    prefix: str = ENV_PREFIX,
    suggest: Iterable[str] | None = None,
    emit: Callable[[str], object] | None = None,
) -> list[str]:
    """Log ONE warning per process for each variable :func:`unknown_variables` finds (a
    mistyped name is otherwise ignored in silence: the setting it meant keeps its default).
    Returns the messages logged by this call. Every entry point that reads the environment calls
    it: :meth:`StatsConfig.from_env` (the library, and through it the plugin), the
    ``redis-stats`` command (at its start, before any option is read) and the vLLM plugin (with
    vLLM's names too). *known*: names read besides the options and :data:`READ_ELSEWHERE`.
    *emit* replaces the logger (the command prints to stderr)."""
    messages = []
    for name, close in unknown_variables(known, environ, prefix=prefix, suggest=suggest).items():
        if name in _warned_variables:
            continue
        _warned_variables.add(name)
        hint = f"did you mean {close}?" if close else "no variable of that name is read"
        messages.append(f"{name} is not a variable redis_stats reads ({hint}); it is ignored")
        if emit is None:
            _log.warning("%s", messages[-1])
        else:
            emit(messages[-1])
    return messages
