"""The Redis view for Prometheus, served from inside vLLM on REDIS_STATS_PORT (off by default).

Every API-server process tries to bind the port; the first on a host wins and serves all engines
of the namespace from Redis (``/metrics``, ``/snapshot``, ``/healthz``: the exporter), the others
find the port taken and stay quiet.

The view is served on loopback unless ``REDIS_STATS_ADDR`` says otherwise: it shows every engine
of the deployment (every node's), so putting it on a network interface is the operator's choice,
made as explicitly as vLLM's own ``--host``.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from ...catalog import Catalog
from ...config import StatsConfig

if TYPE_CHECKING:
    from ...exporter import Exporter

__all__ = ["DEFAULT_ADDR", "maybe_serve"]

DEFAULT_ADDR = "127.0.0.1"

log = logging.getLogger("vllm.redis_stats")  # under vLLM's logger: its handlers and format


def maybe_serve(config: StatsConfig, catalog: Catalog) -> Exporter | None:
    """Serve /metrics on ``REDIS_STATS_PORT`` (address ``REDIS_STATS_ADDR``, default loopback) if
    set and free; the running exporter, or None."""
    port = os.environ.get("REDIS_STATS_PORT")
    if not port:
        return None
    from ...exporter import Exporter
    from ...reader import StatsReader

    addr = os.environ.get("REDIS_STATS_ADDR") or DEFAULT_ADDR
    try:
        exporter = Exporter(StatsReader(config, catalog), host=addr, port=int(port))
    except OSError:
        log.debug("redis_stats: port %s taken; another process on this host serves the Redis view", port)
        return None
    exporter.start()
    log.info(
        "redis_stats: serving every engine of %r on %s/metrics%s",
        config.namespace,
        exporter.url,
        " (loopback only; set REDIS_STATS_ADDR to serve other hosts)" if addr == DEFAULT_ADDR else "",
    )
    return exporter
