"""``redis-stats inspect``: what a namespace holds, in words (or ``/snapshot``'s JSON document)."""

from __future__ import annotations

import click

from redis_stats.config import StatsConfig
from redis_stats.tools.redis_options import (
    config_of,
    namespace_option,
    redis_errors,
    require_namespace,
    seconds_option,
    url_option,
)

__all__ = ["inspect"]


@click.command()
@url_option
@namespace_option
@click.option("--json", "as_json", is_flag=True, help="Print /snapshot's JSON document instead.")
@seconds_option(
    "--window",
    0,
    3600,
    default=0.0,
    help="With --json: read twice, this many seconds apart, for rates and recent quantiles.",
)
def inspect(redis_url: str | None, namespace: str | None, as_json: bool, window: float) -> None:
    """The keys, engines, writers and series of a namespace."""
    from redis_stats.connection import make_client
    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.ops.inspection import inspect_namespace

    config = config_of(redis_url, namespace)
    with redis_errors(config):
        require_namespace(config, make_client(config))
        if as_json:
            _print_snapshot_json(config, window)
            return
        for line in inspect_namespace(config, vllm_catalog()):
            click.echo(line)


def _print_snapshot_json(config: StatsConfig, window: float) -> None:
    import json
    import time

    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY
    from redis_stats.reader import StatsReader
    from redis_stats.server.states.window import snapshot_document

    reader = StatsReader(config, vllm_catalog())
    earlier = None
    if window > 0:
        earlier = reader.snapshot()
        time.sleep(window)
    doc = snapshot_document(reader.snapshot(), earlier, requested=window, summary=VLLM_FLEET_SUMMARY)
    click.echo(json.dumps(doc, allow_nan=False, indent=1))
