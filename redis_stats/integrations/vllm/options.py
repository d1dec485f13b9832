"""The environment variables of the vLLM plugin, declared as :class:`~redis_stats.config.EnvVar`
(listed by ``python -m redis_stats.tools.config_table vllm``, documented in docs/vllm.md and
docs/configuration.md), and the :class:`~redis_stats.config.StatsConfig` the plugin builds from
them. Every other option comes from ``REDIS_STATS_*`` through :meth:`StatsConfig.from_env`.

This module does not import vLLM, so the plugin's configuration is tested without it.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Mapping, Sequence

from redis_stats.config import ConfigError, EnvVar, StatsConfig, warn_unknown_variables
from redis_stats.integrations.vllm import namespace_for_model

__all__ = [
    "ADDR",
    "INTERVAL",
    "NAMESPACE",
    "POD_INDEX",
    "POD_IP",
    "PORT",
    "SWITCH",
    "TENANT_HEADER",
    "VARIABLES",
    "VIEW",
    "WEB_CONFIG_FILE",
    "WEB_OPEN",
    "WEB_TOKEN_FILE",
    "default_endpoint",
    "plugin_config",
    "plugin_enabled",
    "tenant_header",
    "warn_mistyped_variables",
]

_PLUGIN = "the vLLM plugin"

SWITCH = EnvVar(
    "REDIS_STATS_URL",
    "",
    _PLUGIN,
    "the Redis URL (option `url`); it also switches the plugin on: unset, the plugin does nothing",
)
NAMESPACE = EnvVar(
    "REDIS_STATS_NAMESPACE",
    "",
    _PLUGIN,
    "option `namespace`; under vLLM unset means the served model name (characters a key may not "
    "hold become `_`)",
)
INTERVAL = EnvVar(
    "VLLM_LOG_STATS_INTERVAL",
    "10",
    _PLUGIN,
    "vLLM's own variable: vLLM calls the plugin's `log()` this often; under vLLM it is the "
    "reporter's `log_interval` (`REDIS_STATS_LOG_INTERVAL` is not read there)",
)
PORT = EnvVar(
    "REDIS_STATS_PORT",
    "",
    _PLUGIN,
    "serve the Redis view (`/metrics` for every engine) on this port from one process per host; unset: off",
)
ADDR = EnvVar(
    "REDIS_STATS_ADDR",
    "127.0.0.1",
    _PLUGIN,
    "address for `REDIS_STATS_PORT` (loopback by default: the view shows every engine of every "
    "node, so serving it to the network is an explicit choice, e.g. `0.0.0.0`)",
)
VIEW = EnvVar(
    "REDIS_STATS_VIEW",
    "all",
    _PLUGIN,
    "which engines the view on `REDIS_STATS_PORT` serves: `all` (every engine of the namespace; "
    "scrape ONE such view) or `local` (this instance's engines; scrape EVERY node), see docs/vllm.md",
)

WEB_CONFIG_FILE = EnvVar(
    "REDIS_STATS_WEB_CONFIG_FILE",
    "",
    _PLUGIN,
    "access control of the view on `REDIS_STATS_PORT`: a Prometheus exporter-toolkit web "
    "configuration file (TLS, client certificates, headers, `basic_auth_users`), as the exporter's "
    "`--web-config-file`; unset: none",
)
WEB_TOKEN_FILE = EnvVar(
    "REDIS_STATS_WEB_TOKEN_FILE",
    "",
    _PLUGIN,
    "access control of the view: a file of bearer tokens, one a line, as the exporter's "
    "`--web-token-file`; unset: none",
)
WEB_OPEN = EnvVar(
    "REDIS_STATS_WEB_OPEN",
    "",
    _PLUGIN,
    "with access control: the paths of the view served without credentials, space-separated "
    "(e.g. `/healthz`), as the exporter's `--web-open`",
)

POD_IP = EnvVar(
    "POD_IP",
    "",
    _PLUGIN,
    "the pod's IP (set it from the downward API, `status.podIP`): the host of the default "
    "`REDIS_STATS_ENDPOINT`, `<POD_IP>:<--port>`; unset: the host name",
)

POD_INDEX = EnvVar(
    "REDIS_STATS_POD_INDEX",
    "",
    _PLUGIN,
    "this pod's index among identical instances (a StatefulSet pod's `apps.kubernetes.io/pod-index` "
    "label, from the downward API): engine `e` of `vllm serve --data-parallel-size N` is recorded as "
    "`index x N + e`, the engine offset derived from vLLM's own data-parallel size (data "
    "parallelism inside each pod); not with `REDIS_STATS_ENGINE_OFFSET`",
)

TENANT_HEADER = EnvVar(
    "REDIS_STATS_TENANT_HEADER",
    "",
    _PLUGIN,
    "record usage per tenant (docs/usage.md): the request header naming a request's tenant, e.g. "
    "`x-tenant-id`, read by `--middleware redis_stats.integrations.vllm.usage_middleware.UsageMiddleware`; "
    "unset: no usage is recorded",
)

VARIABLES = (
    SWITCH,
    NAMESPACE,
    INTERVAL,
    PORT,
    ADDR,
    VIEW,
    WEB_CONFIG_FILE,
    WEB_TOKEN_FILE,
    WEB_OPEN,
    POD_IP,
    POD_INDEX,
    TENANT_HEADER,
)

# StatsConfig's own option (engine_offset), looked at here only to refuse it beside POD_INDEX.
_OFFSET = EnvVar("REDIS_STATS_ENGINE_OFFSET", "", _PLUGIN, "option `engine_offset`")


def plugin_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``REDIS_STATS_URL`` is set: without it the plugin does nothing."""
    return bool(SWITCH.get(environ))


_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def tenant_header(environ: Mapping[str, str] | None = None) -> str | None:
    """The header ``REDIS_STATS_TENANT_HEADER`` names, lower case (None: usage is not recorded);
    :class:`ConfigError` naming the variable for a value that is no HTTP header name."""
    raw = TENANT_HEADER.get(environ).strip()
    if not raw:
        return None
    if not set(raw) <= _TOKEN or len(raw) > 256:
        raise ConfigError(
            f"{TENANT_HEADER.name}={raw!r} is not an HTTP header name (letters, digits and "
            "!#$%&'*+-.^_`|~, at most 256): set it to the header your gateway puts the tenant in, "
            "e.g. x-tenant-id, or unset it to record no usage"
        )
    return raw.lower()


VLLM_PORT = 8000
"""vLLM's default ``--port`` (``vllm serve``'s API server)."""


def _port_of(argv: Sequence[str]) -> int:
    """vLLM's ``--port`` in *argv* (``--port N`` or ``--port=N``; the last one wins, as argparse
    takes it), else :data:`VLLM_PORT`."""
    port = VLLM_PORT
    for i, arg in enumerate(argv):
        text = (
            argv[i + 1]
            if arg == "--port" and i + 1 < len(argv)
            else arg[7:]
            if arg.startswith("--port=")
            else ""
        )
        if text.isascii() and text.isdigit() and int(text) <= 65535:
            port = int(text)
    return port


def default_endpoint(environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> str:
    """The endpoint the plugin's writers record by default: the API server's address as a router
    reaches it, ``<host>:<port>``: the pod's IP (``POD_IP``, set from the downward API's
    ``status.podIP``), else this host's name, and vLLM's ``--port`` (from the command line,
    default 8000). An IPv6 address is bracketed (``[fd00::7]:8000``)."""
    host = POD_IP.get(environ).strip() or socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{_port_of(sys.argv if argv is None else argv)}"


def pod_offset(data_parallel_size: int, environ: Mapping[str, str] | None = None) -> int | None:
    """The engine offset ``REDIS_STATS_POD_INDEX`` derives (``index x data_parallel_size``), None
    when it is unset; :class:`ConfigError` naming the variable for a value that is not an index,
    or when ``REDIS_STATS_ENGINE_OFFSET`` is set too (two offsets: which one?)."""
    raw = POD_INDEX.get(environ).strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise ConfigError(
            f"{POD_INDEX.name}={raw!r} is not a pod index (an integer >= 0): set it from the downward "
            "API, fieldRef metadata.labels['apps.kubernetes.io/pod-index'] (docs/kubernetes.md)"
        )
    if _OFFSET.get(environ):
        raise ConfigError(
            f"{POD_INDEX.name} and REDIS_STATS_ENGINE_OFFSET are both set: the pod index derives the "
            "offset (index x the data-parallel size); unset REDIS_STATS_ENGINE_OFFSET"
        )
    return int(raw) * max(1, data_parallel_size)


def plugin_config(
    model: str,
    environ: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    *,
    data_parallel_size: int = 1,
) -> StatsConfig:
    """The plugin's config for served model *model*: ``REDIS_STATS_*`` options as
    :meth:`StatsConfig.from_env` reads them, but the namespace defaults to the model's,
    ``log_interval`` is vLLM's ``VLLM_LOG_STATS_INTERVAL``, ``endpoint`` defaults to
    :func:`default_endpoint` (``REDIS_STATS_ENDPOINT`` wins), and with ``REDIS_STATS_POD_INDEX``
    the engine offset is that index times *data_parallel_size* (:func:`pod_offset`)."""
    config = StatsConfig.from_env(
        environ,
        namespace=NAMESPACE.get(environ) or namespace_for_model(model),
        log_interval=INTERVAL.number(environ),
    )
    offset = pod_offset(data_parallel_size, environ)
    if offset is not None:
        config = config.replace(engine_offset=offset)
    return config if config.endpoint is not None else config.replace(endpoint=default_endpoint(environ, argv))


def warn_mistyped_variables(
    environ: Mapping[str, str] | None = None,
    vllm_names: tuple[str, ...] | list[str] | None = None,
    emit: Callable[[str], object] | None = None,
) -> list[str]:
    """One warning per process for a ``REDIS_STATS_*`` variable neither redis_stats nor the
    plugin reads, naming the closest one (``REDIS_STATS_NAMESPCE``: did you mean
    ``REDIS_STATS_NAMESPACE``?), and for a ``VLLM_*`` variable vLLM does not know (*vllm_names*:
    ``vllm.envs.environment_variables``) that is close to one the plugin reads (not checked
    when *vllm_names* is None: the ``redis-stats`` command reads no ``VLLM_*`` variable)."""
    ours = [v.name for v in VARIABLES]
    messages = warn_unknown_variables(ours, environ, emit=emit)
    if vllm_names is None:
        return messages
    vllm_read = [name for name in ours if name.startswith("VLLM_")]
    messages += warn_unknown_variables(
        [*vllm_names, *vllm_read], environ, prefix="VLLM_", suggest=vllm_read, emit=emit
    )
    return messages
