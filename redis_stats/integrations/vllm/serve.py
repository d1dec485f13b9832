"""The Redis view for Prometheus, served from inside vLLM on REDIS_STATS_PORT (off by default).

Every API-server process tries to bind the port; the first on a host wins and serves the Redis
view (``/metrics``, ``/snapshot``, ``/healthz``: the exporter), the others find the port taken and
stay quiet.

``REDIS_STATS_VIEW`` says which engines the view shows (docs/vllm.md, "Scraping: one true total"):

- ``all`` (default): every engine of the namespace. Any one node answers for the whole fleet: scrape
  ONE such view (a Service, a load balancer), never every node, or sums count each engine N times.
- ``local``: only the engines of this instance (its vLLM engine indexes plus
  ``REDIS_STATS_ENGINE_OFFSET``). Scrape EVERY node (a PodMonitor): each engine appears once.

The view is served on loopback unless ``REDIS_STATS_ADDR`` says otherwise: it shows every engine
of the deployment (every node's), so putting it on a network interface is the operator's choice,
made as explicitly as vLLM's own ``--host``. Its access control is the exporter's, off by default:
``REDIS_STATS_WEB_CONFIG_FILE`` (TLS, client certificates, basic auth), ``REDIS_STATS_WEB_TOKEN_FILE``
(bearer tokens) and ``REDIS_STATS_WEB_OPEN`` (paths left open), read when the view starts: a file
that cannot be used stops the plugin with an error naming the variable.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from redis_stats.catalog import Catalog
from redis_stats.config import ConfigError, StatsConfig
from redis_stats.errors import WebConfigError
from redis_stats.integrations.vllm.options import (
    ADDR,
    PORT,
    VIEW,
    WEB_CONFIG_FILE,
    WEB_OPEN,
    WEB_TOKEN_FILE,
)
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY

if TYPE_CHECKING:
    from redis_stats.server import Exporter

__all__ = ["DEFAULT_ADDR", "VIEWS", "maybe_serve", "view_engines"]

DEFAULT_ADDR = ADDR.default
VIEWS = ("all", "local")

log = logging.getLogger("vllm.redis_stats")  # under vLLM's logger: its handlers and format


def view_engines(own: Sequence[int]) -> list[int] | None:
    """The engines the view serves per ``REDIS_STATS_VIEW``: None (all) or *own* (``local``)."""
    view = VIEW.get().strip().lower()
    if view not in VIEWS:
        raise ConfigError(
            f"REDIS_STATS_VIEW={view!r} is not one of {', '.join(VIEWS)}: 'all' when one view is "
            "scraped for the whole fleet, 'local' when every node is scraped (docs/vllm.md)"
        )
    return None if view == "all" else sorted(set(own))


def maybe_serve(config: StatsConfig, catalog: Catalog, own_engines: Sequence[int] = ()) -> Exporter | None:
    """Serve /metrics on ``REDIS_STATS_PORT`` (address ``REDIS_STATS_ADDR``, default loopback) if
    set and free.

    *own_engines* are this instance's engines as stored (offset applied): the ``local`` view's.
    Returns the running exporter, or None (not asked for, or the port is taken).
    """
    raw = PORT.get()
    if not raw:
        return None
    from redis_stats.reader import StatsReader
    from redis_stats.server import Exporter

    port = raw.strip()
    if not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ConfigError(
            f"{PORT.name}={raw!r} is not a port number (0-65535): set it to the port the Redis view "
            f"is served on, e.g. 9400, or unset it to serve no view"
        )
    engines = view_engines(own_engines)
    addr = ADDR.get()
    try:
        exporter = Exporter(
            StatsReader(config, catalog),
            engines=engines,
            host=addr,
            port=int(port),
            summary=VLLM_FLEET_SUMMARY,
            history=VLLM_PAGE_HISTORY,
            roles=VLLM_ROLES,
            self_endpoint=config.endpoint,  # /metrics?endpoint=self: this pod's engines
            web_config_file=WEB_CONFIG_FILE.get().strip() or None,
            web_token_file=WEB_TOKEN_FILE.get().strip() or None,
            web_open=tuple(WEB_OPEN.get().split()),
        )
    except WebConfigError as exc:
        variable = {"web_token_file": WEB_TOKEN_FILE, "web_open": WEB_OPEN}.get(exc.option, WEB_CONFIG_FILE)
        raise ConfigError(f"{variable.name}: {exc}; fix it, or unset {variable.name}") from None
    except ValueError as exc:  # web_open paths that are no paths
        raise ConfigError(f"{WEB_OPEN.name}: {exc}") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            log.debug("redis_stats: port %s taken; another process on this host serves the Redis view", port)
            return None
        # Not a busy port: an address that is no interface of this host or no name at all, a
        # port below 1024 without the right. Said now, rather than no view and no word.
        raise ConfigError(
            f"cannot serve the Redis view on {ADDR.name}={addr} {PORT.name}={port}: "
            f"{exc.strerror or exc}; set {ADDR.name} to an address of this host (127.0.0.1, 0.0.0.0 "
            "or one of its interfaces) and the port to one this process may bind"
        ) from None
    exporter.start()
    which = "every engine" if engines is None else f"engines {engines}"
    log.info(
        "redis_stats: serving %s of %r on %s/metrics (%s)%s",
        which,
        config.namespace,
        exporter.url,
        exporter.app.gate.summary(),
        " (loopback only; set REDIS_STATS_ADDR to serve other hosts)" if addr == DEFAULT_ADDR else "",
    )
    return exporter
