"""Every exception redis_stats raises, and :func:`error_kind`, the name of a Redis failure.

Catch :class:`RedisStatsError` for anything redis_stats itself refuses. Each class also keeps the
base class it always had (``ConfigError`` and ``CatalogError`` are ``ValueError``\\s,
``ReplicationLag`` is a ``redis.RedisError``, ``NoServerBinary`` a ``RuntimeError``), so code that
caught those goes on working. The old import paths (``redis_stats.config.ConfigError`` ...) still
work.
"""

from __future__ import annotations

import builtins
import re
from typing import Any

import redis
from redis import exceptions as _rx

__all__ = [
    "ERROR_KINDS",
    "CatalogError",
    "ConfigError",
    "NoServerBinary",
    "RedisStatsError",
    "ReplicationLag",
    "SchemaMismatch",
    "StoreUnsupported",
    "WebConfigError",
    "error_kind",
]


class RedisStatsError(Exception):
    """Base of every exception redis_stats defines."""


class ConfigError(RedisStatsError, ValueError):
    """A setting has a value redis_stats cannot use; the message names it and says what to do."""


class WebConfigError(ConfigError):
    """The exporter's access control cannot be set up as given: its web configuration file
    (``--web-config-file``), its bearer token file (``--web-token-file``) or its open paths
    (``--web-open``). The message names the file, the key and the fix, and never a secret (a
    password hash, a token, a key); :attr:`option` names the setting (``web_config_file``,
    ``web_token_file``, ``web_open``), so a command or the vLLM plugin can name its own flag or
    variable."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.option, str(self)))


class CatalogError(RedisStatsError, ValueError):
    """A metric definition or use that can never work (a programming mistake)."""


class ReplicationLag(RedisStatsError, redis.RedisError):
    """A flush was applied on the master but fewer replicas than ``wait_replicas`` acknowledged it."""


class NoServerBinary(RedisStatsError, RuntimeError):
    """Neither redis-server nor valkey-server could be found."""


class SchemaMismatch(RedisStatsError, ValueError):
    """A namespace in Redis holds data in another format (schema version) than this reader's;
    the message says which, and what to do. Nothing of it is read."""


class StoreUnsupported(RedisStatsError, redis.RedisError):
    """The server cannot hold the store as redis_stats needs it: no Lua scripting (Valkey 9.1
    with its ``lua`` module unloaded, Garnet without ``--lua``), scripts that are not atomic
    (Garnet without ``--lua-transaction-mode``), or a command the store needs that it lacks.

    Raised by the capability check a writer, reader or command runs when it first talks to a
    server (:mod:`redis_stats.capability`), instead of a view that is empty or torn. The message
    names the server, what is missing and how to fix it; :attr:`server` and :attr:`missing` hold
    the first two. A ``redis.RedisError``, so code that catches Redis failures catches it too.
    """

    def __init__(self, server: str, missing: str, fix: str) -> None:
        self.server = server
        self.missing = missing
        self.fix = fix
        super().__init__(f"{server} cannot hold the redis_stats store: {missing}; {fix}")

    def __reduce__(self) -> tuple[Any, ...]:  # an exception crossing a process (multiprocessing)
        return (type(self), (self.server, self.missing, self.fix))


# The values of the ``kind`` label of ``redis_stats_writer_flush_errors_total`` and
# ``redis_stats_read_errors_total`` (docs/self-metrics.md lists them; docs/runbooks.md says what to do).
ERROR_KINDS = (
    "auth",
    "noperm",
    "oom",
    "readonly",
    "timeout",
    "connection",
    "replication",
    "response",
    "schema",
    "unsupported",
    "other",
)

#: What a server answers a script call with when it runs no scripts at all: Valkey 9.1 without its
#: Lua module, Garnet without ``--lua``, a server whose scripting commands are missing or renamed.
SCRIPTING_MISSING = (
    r"Could not find scripting engine|Lua scripting support disabled"
    r"|(?i:unknown command ['`]?(?:evalsha|eval|script)\b)"
)

# redis-py picks the class from the error code at the start of the reply (``OOM``, ``READONLY``...)
# and strips the code from the message. A script that catches an error (``redis.pcall``) and
# returns its own ``error_reply`` keeps the code only inside its text, behind a prefix, and the
# class is a plain ResponseError: so the text is searched too, for the code or for the server's
# own sentence (which stays when the code is stripped).
_AUTH_CLASSES = (
    _rx.AuthenticationError,
    _rx.AuthenticationWrongNumberOfArgsError,
    _rx.AuthorizationError,
    _rx.ExternalAuthProviderError,
)
_BY_TEXT = (
    (
        "auth",
        re.compile(
            r"\b(?:WRONGPASS|NOAUTH)\b|invalid username-password pair|Authentication required"
            # Redis closes an unauthenticated connection that sends a long command (a flush) with
            # "Protocol error: unauthenticated multibulk length": a missing password, not a bug.
            r"|\bunauthenticated (?:multi)?bulk\b"
        ),
    ),
    # A command a script runs that the ACL user may not: Redis 7 says "The user executing the
    # script can't run this command or subcommand", Valkey "ACL failure in script: User ... has
    # no permissions to run ..." (one kind on every server, whatever its wording).
    (
        "noperm",
        re.compile(
            r"\bNOPERM\b|has no permissions to|No permissions to access"
            r"|can't run this command or subcommand|ACL failure in script"
        ),
    ),
    ("oom", re.compile(r"\bOOM\b|used memory > 'maxmemory'")),
    ("readonly", re.compile(r"\b(?:READONLY|MASTERDOWN)\b|against a read only replica")),
    # A server that lost its scripting while a process ran (Valkey 9.1's MODULE UNLOAD lua,
    # Garnet restarted without --lua): the capability check runs again and says what to do.
    ("unsupported", re.compile(SCRIPTING_MISSING)),
)


# In order: redis-py makes a refused password a ConnectionError subclass, so auth comes first.
_BY_CLASS: tuple[tuple[Any, str], ...] = (
    (ReplicationLag, "replication"),
    (SchemaMismatch, "schema"),
    (StoreUnsupported, "unsupported"),
    (_AUTH_CLASSES, "auth"),
    (_rx.NoPermissionError, "noperm"),
    (_rx.OutOfMemoryError, "oom"),
    ((_rx.ReadOnlyError, _rx.MasterDownError), "readonly"),
    ((redis.TimeoutError, builtins.TimeoutError), "timeout"),
    ((redis.ConnectionError, builtins.ConnectionError), "connection"),
)


def error_kind(exc: BaseException) -> str:
    """A short, stable name for a failed flush or read (the ``kind`` label of the error counters).

    One of :data:`ERROR_KINDS`: ``auth`` (wrong or missing password, unknown user), ``noperm``
    (an ACL user without the command or key), ``oom`` (``maxmemory`` reached with
    ``noeviction``), ``readonly`` (a replica, or one cut from its master), ``timeout``,
    ``connection``, ``replication`` (:class:`ReplicationLag`), ``response`` (any other error
    reply), ``schema`` (:class:`SchemaMismatch`: the namespace holds another version's format),
    ``unsupported`` (:class:`StoreUnsupported`, or a script call answered as by a server without
    scripting),
    ``other`` (not a Redis error).
    """
    for classes, kind in _BY_CLASS:
        if isinstance(exc, classes):
            return kind
    if isinstance(exc, _rx.RedisClusterException) and "cannot be connected" in str(exc):
        # redis-py's Cluster client when no startup node answers (not a RedisError subclass).
        return "connection"
    if isinstance(exc, redis.ResponseError):
        text = str(exc)
        for kind, pattern in _BY_TEXT:
            if pattern.search(text):
                return kind
        return "response"
    return "other"


def refused_for_memory(exc: BaseException) -> bool:
    """True when Redis refused a command for being over ``maxmemory`` (``OOM ...``)."""
    return isinstance(exc, _rx.OutOfMemoryError) or "maxmemory" in str(exc)
