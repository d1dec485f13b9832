"""What every ``redis-stats`` command shares: which Redis and namespace (the options, the file a
URL may come from, the config they make), how Redis' failures end a command (one or two lines, a
masked URL, what to do, the exit codes of docs/cli.md), and how a refusal names writers."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from redis_stats.config import ConfigError, StatsConfig, redact

__all__ = [
    "EXIT_EMPTY_NAMESPACE",
    "EXIT_FOREIGN_WRITERS",
    "EXIT_LIVE_WRITERS",
    "EXIT_REDIS",
    "HOST_HINT",
    "URL_FILE_HELP",
    "WRITERS_SHOWN",
    "EmptyNamespace",
    "Finite",
    "RedisFailed",
    "config_of",
    "namespace_option",
    "plural",
    "redis_errors",
    "require_namespace",
    "resolve_url",
    "seconds_option",
    "url_option",
    "writers_summary",
]

F = TypeVar("F", bound=Callable[..., Any])


def read_url_file(path: str) -> str:
    """The URL held in *path* (stripped). Errors name the file, never its content."""
    try:
        with open(path, encoding="utf-8") as f:
            url = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise click.BadParameter(f"cannot read {path}: {reason}", param_hint="--redis-url-file") from None
    if not url:
        raise click.BadParameter(
            f"{path} is empty: it should hold the Redis URL", param_hint="--redis-url-file"
        )
    return url


def resolve_url(redis_url: str | None, redis_url_file: str | None) -> str | None:
    """--redis-url-file wins over REDIS_STATS_URL; giving it with --redis-url is an error."""
    if redis_url_file is None:
        return redis_url
    source = click.get_current_context().get_parameter_source("redis_url")
    if redis_url is not None and source is ParameterSource.COMMANDLINE:
        raise click.UsageError("give either --redis-url or --redis-url-file, not both")
    return read_url_file(redis_url_file)


def config_of(redis_url: str | None, namespace: str | None) -> StatsConfig:
    """The config of the options given (and REDIS_STATS_* for the rest); a bad value is a usage
    error naming it."""
    from redis_stats.connection import check_url

    try:
        config = StatsConfig.from_env(url=redis_url, namespace=namespace)
        check_url(config)  # e.g. a misspelt query parameter: a usage error, not a traceback
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    return config


# Exit codes (docs/cli.md): 0 done; 1 Redis failed (unreachable, refused the password, a
# command refused), or the exporter's port is taken; 2 a usage error (a bad option or URL: click's
# own code); 3 the namespace holds nothing (the message lists the ones that do).
EXIT_REDIS = 1
EXIT_EMPTY_NAMESPACE = 3
EXIT_LIVE_WRITERS = 4  # drop-namespace refused: a writer of the namespace is live
EXIT_FOREIGN_WRITERS = 5  # simulate refused: the namespace holds writers it did not start

# What to do, by error_kind: the second line of a failed command's message.
_HINTS = {
    "connection": "is Redis running there? Check the host and port of --redis-url / REDIS_STATS_URL",
    "timeout": "Redis did not answer in time: check the address, or raise "
    "REDIS_STATS_CONNECT_TIMEOUT_MS / REDIS_STATS_SOCKET_TIMEOUT_MS",
    "auth": "check the user and password in the URL (special characters percent-encoded, "
    "docs/configuration.md)",
    "noperm": "the Redis user lacks a command or key: see the ACL users in docs/acl.md",
    "readonly": "this is a replica: point the URL at the master (or use redis+sentinel://)",
}


# A bind that fails for another reason than a taken port: the address (an unknown name, an
# address of no interface here) or a port below 1024 without the right.
HOST_HINT = (
    "check --host: it must be an address of this host (127.0.0.1, 0.0.0.0 or one of its "
    "interfaces), and --port one this user may bind (1024 and above, or 0 for any free one)"
)


class RedisFailed(click.ClickException):
    """Redis failed the command: unreachable, refused the password, refused a command (exit code 1)."""

    exit_code = EXIT_REDIS


class EmptyNamespace(click.ClickException):
    """The namespace given holds nothing in this Redis (exit code 3)."""

    exit_code = EXIT_EMPTY_NAMESPACE


@contextmanager
def redis_errors(config: StatsConfig) -> Iterator[None]:
    """A Redis failure ends the command with one line (masked URL, redacted message), no traceback,
    and a second line saying what to do when the kind of failure says it."""
    import redis

    from redis_stats.connection import tls_mismatch
    from redis_stats.errors import StoreUnsupported
    from redis_stats.writer import error_kind

    try:
        yield
    except BrokenPipeError:
        raise  # our stdout was closed (`| head`), not Redis' socket (redis-py wraps those)
    except StoreUnsupported as exc:  # its message names the server, what is missing, the fix
        raise RedisFailed(redact(str(exc), config.url)) from None
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        kind = error_kind(exc)
        # A TLS mismatch fails as a timeout (rediss:// to a plain server) or a closed connection
        # (redis:// to a TLS one): the server is asked which it speaks before a hint is given.
        hint = (tls_mismatch(config) if kind in ("timeout", "connection") else None) or _HINTS.get(kind)
        raise RedisFailed(
            f"reading {config.safe_url} failed ({kind}: {redact(str(exc), config.url)})"
            + (f"\n  {hint}" if hint else "")
        ) from None


def require_namespace(config: StatsConfig, client: object, *, writes: bool = False) -> None:
    """End the command when the server cannot hold the store (exit 1: the capability check,
    redis_stats/capability.py; *writes*: the command writes, as gc does) or the namespace holds
    nothing (exit 3, naming the ones that do)."""
    import redis

    from redis_stats.capability import check_store
    from redis_stats.errors import error_kind
    from redis_stats.ops.namespaces import closest_live, describe_namespaces, namespace_holds_data, summary

    # First: a server without scripts holds nothing of the store, which is not "empty".
    check_store(client, config, writes=writes)
    if namespace_holds_data(client, config.namespace):
        return
    where = f"namespace {config.namespace!r} holds nothing at {config.safe_url}"
    try:
        others = describe_namespaces(client, config.stale_after)
    except redis.RedisError as exc:
        if error_kind(exc) != "noperm":
            raise
        # A least-privilege user (one namespace, no SCAN) cannot see the others: say so.
        raise EmptyNamespace(
            f"{where}; this Redis user may not list the others (noperm): ask for the namespace, "
            "or run `redis-stats namespaces` as a user with +scan"
        ) from None
    if not others:
        raise EmptyNamespace(
            f"{where}, and no namespace does: nothing has written there yet (check the URL's database number)"
        )
    lines = "\n".join(f"  {summary(info)}" for info in others)
    closest = closest_live(config.namespace, others) or others[0]
    raise EmptyNamespace(
        f"{where}; it has:\n{lines}\npass --namespace {closest.namespace} (or set REDIS_STATS_NAMESPACE)"
    )


URL_FILE_HELP = (
    "Read the Redis URL from this file (content stripped): keeps the password out of the process "
    "table and shell history."
)


def url_option(func: F) -> F:
    """--redis-url / --redis-url-file / REDIS_STATS_URL, resolved into one ``redis_url`` argument."""

    @click.option(
        "--redis-url",
        envvar="REDIS_STATS_URL",
        show_default="redis://127.0.0.1:6379/0",
        help="Redis URL [env: REDIS_STATS_URL]. On a command line the password shows in `ps`: "
        "prefer the variable or --redis-url-file.",
    )
    @click.option("--redis-url-file", type=click.Path(dir_okay=False), help=URL_FILE_HELP)
    @functools.wraps(func)
    def wrapper(*args: Any, redis_url: str | None, redis_url_file: str | None, **kwargs: Any) -> Any:
        return func(*args, redis_url=resolve_url(redis_url, redis_url_file), **kwargs)

    return wrapper  # type: ignore[return-value]


namespace_option = click.option(
    "--namespace",
    envvar="REDIS_STATS_NAMESPACE",
    show_default="default",
    help="Namespace (one deployment; `redis-stats namespaces` lists them) [env: REDIS_STATS_NAMESPACE].",
)


class Finite(click.FloatRange):
    """A number in a range that is also finite: ``nan`` compares false to both bounds, so
    ``FloatRange`` let it through (``--period nan`` ended in a traceback), and ``inf`` passes a
    range without an upper bound."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The number given, or a usage error when it is out of range or not finite."""
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def seconds_option(name: str, low: float, high: float | None = None, **settings: Any) -> Callable[[F], F]:
    """A duration option: a number of seconds from *low* to *high* (None: no upper limit)."""
    return click.option(name, type=Finite(low, high), **settings)


def plural(n: int, word: str, many: str | None = None) -> str:
    """*n* *word*, plural (*many*, else *word* + s) when *n* is not 1."""
    return f"{n} {word}" if n == 1 else f"{n} {many or word + 's'}"


WRITERS_SHOWN = 5
"""Writer ids a message names before it counts the rest (2,048 of them were 50 KB on one line)."""


def writers_summary(writers: Any) -> str:
    """*writers* (ids ``host:pid[:role]:random``) in a line: how many on how many hosts, and the
    first :data:`WRITERS_SHOWN` ids (``redis-stats inspect`` lists them all)."""
    ids = sorted(writers)
    hosts = {w.split(":", 1)[0] for w in ids}
    shown = ", ".join(ids[:WRITERS_SHOWN])
    rest = len(ids) - WRITERS_SHOWN
    more = f" and {rest:,} more (redis-stats inspect lists them)" if rest > 0 else ""
    on = f" on {plural(len(hosts), 'host')}" if len(ids) > 1 else ""
    return f"{shown}{more}{on}"
