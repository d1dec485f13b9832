"""``redis-stats top``: every engine of a namespace in the terminal, refreshed."""

from __future__ import annotations

import click

from redis_stats.tools.redis_options import (
    config_of,
    namespace_option,
    redis_errors,
    require_namespace,
    seconds_option,
    url_option,
)

__all__ = ["top"]


@click.command()
@url_option
@namespace_option
@seconds_option(
    "--interval",
    0.2,
    3600,
    default=2.0,
    help="Seconds between refreshes (rates and percentiles are over this interval).",
)
@click.option(
    "--once", is_flag=True, help="Print one table (over one interval) and exit; plain text when piped."
)
def top(redis_url: str | None, namespace: str | None, interval: float, once: bool) -> None:
    """A live per-engine table: throughput, requests, KV usage, TTFT and ITL percentiles."""
    from redis_stats.connection import make_client
    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.reader import StatsReader
    from redis_stats.tools.top import run_top

    config = config_of(redis_url, namespace)
    with redis_errors(config):
        client = make_client(config)
        require_namespace(config, client)
        run_top(StatsReader(config, vllm_catalog(), client=client), interval=interval, once=once)
