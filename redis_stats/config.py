"""StatsConfig: every setting of redis_stats, from arguments or ``REDIS_STATS_*`` variables.

One place lists the options, their defaults, their environment variables and how each is
checked, so that ``docs/configuration.md`` and the code cannot drift apart (a test compares them).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["ENV_PREFIX", "ConfigError", "StatsConfig", "mask_url"]

ENV_PREFIX = "REDIS_STATS_"
LEADER_MODES = ("rank0", "lease", "none")

# A namespace becomes part of every key (`rs:{NS}:...`). Braces would break the Cluster hash tag
# and glob characters would widen ACL key patterns, so only a conservative alphabet is allowed.
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9._\-/:]{1,128}$")


class ConfigError(ValueError):
    """A setting has a value redis_stats cannot use; the message names it and says what to do."""


def mask_url(url: str) -> str:
    """Return *url* with its password replaced by ``***`` (user names are kept).

    Works for every scheme redis_stats accepts, including comma-separated Sentinel/Cluster hosts.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" not in netloc:
        return url
    userinfo, hosts = netloc.rsplit("@", 1)
    if ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        userinfo = f"{user}:***"
    elif parts.password is None and userinfo:
        # redis://secret@host is the legacy password-only form: mask it too.
        userinfo = "***"
    return urlunsplit((parts.scheme, f"{userinfo}@{hosts}", parts.path, parts.query, parts.fragment))


@dataclasses.dataclass(frozen=True)
class _Option:
    name: str
    env: str
    kind: type
    help: str


def _opt(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


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
        "``redis+cluster://``.",
    )
    namespace: str = _opt(
        "default",
        "One deployment (one served model). All keys live under ``rs:{namespace}:``.",
    )
    flush_interval: float = _opt(
        1.0,
        "Seconds between two flushes of a writer (each flush is one script call).",
    )
    stale_after: float = _opt(
        30.0,
        "Seconds without a heartbeat after which an engine or writer is stale: its gauges are hidden.",
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
        "(WAIT); until then it is retried (exactly once). 0: done when the master applied it.",
    )
    wait_timeout_ms: int = _opt(500, "How long a flush waits for ``wait_replicas`` acknowledgements.")
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
    close_timeout: float = _opt(
        1.0,
        "Seconds a writer's ``close()`` (also run at interpreter exit) waits for Redis to confirm its "
        "last flush; then it logs what was lost and returns, so a dead Redis never holds a shutdown.",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or "://" not in self.url:
            raise ConfigError(
                f"url={self.url!r} is not a Redis URL; use e.g. redis://127.0.0.1:6379/0 "
                f"(or set {ENV_PREFIX}URL)"
            )
        if not isinstance(self.namespace, str) or not _NAMESPACE_RE.match(self.namespace):
            raise ConfigError(
                f"namespace={self.namespace!r} is not allowed: use 1-128 characters from "
                "A-Z a-z 0-9 . _ - / : (no braces, spaces or glob characters, which would break "
                "the key prefix rs:{NS}: and its ACL pattern)"
            )
        for name in ("flush_interval", "stale_after", "retention", "lease_ttl", "log_interval"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
                raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
        ct = self.close_timeout
        if not isinstance(ct, (int, float)) or isinstance(ct, bool) or not 0 <= ct < float("inf"):
            raise ConfigError(f"close_timeout={ct!r} must be a number of seconds >= 0 (0: do not wait)")
        if self.stale_after < self.flush_interval:
            raise ConfigError(
                f"stale_after={self.stale_after} is shorter than flush_interval="
                f"{self.flush_interval}: every engine would look stale between two flushes; "
                "make stale_after several flush intervals long"
            )
        if not isinstance(self.wait_replicas, int) or self.wait_replicas < 0:
            raise ConfigError(f"wait_replicas={self.wait_replicas!r} must be an integer >= 0")
        for name in (
            "connect_timeout_ms",
            "socket_timeout_ms",
            "max_label_length",
            "max_series_per_metric",
            "wait_timeout_ms",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if self.leader not in LEADER_MODES:
            raise ConfigError(f"leader={self.leader!r} must be one of {', '.join(LEADER_MODES)}")
        if not isinstance(self.leader_rank, int) or self.leader_rank < 0:
            raise ConfigError(f"leader_rank={self.leader_rank!r} must be an integer >= 0")
        if not isinstance(self.engine_offset, int) or self.engine_offset < 0:
            raise ConfigError(f"engine_offset={self.engine_offset!r} must be an integer >= 0")

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

        A variable that does not parse raises :class:`ConfigError` naming the variable.
        """
        env = os.environ if environ is None else environ
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


def options_markdown() -> str:
    """The options table of docs/configuration.md (regenerate it with ``python -m redis_stats.config``)."""
    defaults = {f.name: f.default for f in dataclasses.fields(StatsConfig)}
    rows = ["| option | environment variable | default | meaning |", "|---|---|---|---|"]
    for o in _options().values():
        rows.append(f"| `{o.name}` | `{o.env}` | `{defaults[o.name]}` | {o.help} |")
    return "\n".join(rows)


def _options() -> dict[str, _Option]:
    kinds = {"str": str, "float": float, "int": int}
    return {
        f.name: _Option(f.name, ENV_PREFIX + f.name.upper(), kinds[str(f.type)], f.metadata["help"])
        for f in dataclasses.fields(StatsConfig)
    }


if __name__ == "__main__":
    print(options_markdown())
