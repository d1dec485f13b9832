"""``redis-stats load-proxy``: answer ``/get_load`` and ``/v1/loads`` in front of vLLM's Rust front
end, which runs no middleware (docs/routers.md)."""

from __future__ import annotations

import click

from redis_stats.config import ConfigError
from redis_stats.tools.redis_options import (
    config_of,
    namespace_option,
    seconds_option,
    url_option,
)
from redis_stats.tools.stopping import stop_on_signals

__all__ = ["load_proxy"]


@click.command("load-proxy")
@url_option
@namespace_option
@click.option(
    "--upstream",
    required=True,
    metavar="HOST:PORT",
    help="The vLLM API server behind the proxy (vLLM's Rust front end), e.g. 127.0.0.1:8000.",
)
@click.option(
    "--listen",
    default="0.0.0.0:8001",
    metavar="HOST:PORT",
    help="Where routers reach the proxy: give them this address as the worker URL, and the same "
    "one as REDIS_STATS_ENDPOINT (as they reach it: the pod's IP, not 0.0.0.0).",
)
@click.option(
    "--rank-list",
    is_flag=True,
    help="Answer /get_load as the rank list sglang-router 0.3.x reads, not vllm-router's {load}.",
)
@click.option(
    "--bridge/--no-bridge",
    default=True,
    help="Also bridge the upstream's /metrics into the store (engine label engine, the vLLM "
    "catalogue and load feed), every REDIS_STATS_FLUSH_INTERVAL: what the answers read.",
)
@seconds_option("--duration", 0.1, show_default="until SIGTERM/Ctrl-C", help="Stop after this many seconds.")
def load_proxy(
    redis_url: str | None,
    namespace: str | None,
    upstream: str,
    listen: str,
    rank_list: bool,
    bridge: bool,
    duration: float | None,
) -> None:
    """Answer /get_load and /v1/loads from Redis in front of vLLM's Rust front end, which runs no
    middleware; pass every other request to it (docs/routers.md, "vLLM's Rust front end")."""
    import logging
    import threading

    from redis_stats.integrations.vllm.load_proxy import Sidecar

    config = config_of(redis_url, namespace)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sidecar = Sidecar(config, upstream, listen, rank_list=rank_list, bridge=bridge)
    except (ValueError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None
    stop = threading.Event()
    click.echo(sidecar.start())
    with stop_on_signals(stop.set):
        stop.wait(duration)
        sidecar.close()
