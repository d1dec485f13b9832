"""The Redis view for Prometheus, served from inside vLLM on REDIS_STATS_PORT (off by default).

Every API-server process tries to bind the port; the first on a host wins and serves all engines
of the namespace from Redis (``/metrics``, ``/snapshot``, ``/healthz``: the exporter), the others
find the port taken and stay quiet.
"""

from __future__ import annotations

import logging
import os

from ...catalog import Catalog
from ...config import StatsConfig

__all__ = ["maybe_serve"]

log = logging.getLogger("vllm.redis_stats")  # under vLLM's logger: its handlers and format


def maybe_serve(config: StatsConfig, catalog: Catalog) -> bool:
    """Serve /metrics on ``REDIS_STATS_PORT`` (address ``REDIS_STATS_ADDR``) if set and free."""
    port = os.environ.get("REDIS_STATS_PORT")
    if not port:
        return False
    from ...exporter import Exporter
    from ...reader import StatsReader

    addr = os.environ.get("REDIS_STATS_ADDR", "0.0.0.0")
    try:
        exporter = Exporter(StatsReader(config, catalog), host=addr, port=int(port))
    except OSError:
        log.debug("redis_stats: port %s taken; another process on this host serves the Redis view", port)
        return False
    exporter.start()
    log.info("redis_stats: serving every engine of %r on http://%s:%s/metrics", config.namespace, addr, port)
    return True
