"""``redis-stats namespaces``: every namespace a Redis holds, and whether it can be served."""

from __future__ import annotations

import click

from redis_stats.tools.redis_options import (
    config_of,
    redis_errors,
    url_option,
)

__all__ = ["namespaces"]


@click.command()
@url_option
def namespaces(redis_url: str | None) -> None:
    """Every namespace in this Redis: engines (up), writers (live), newest heartbeat."""
    from redis_stats.capability import check_store
    from redis_stats.connection import make_client
    from redis_stats.ops.namespaces import describe_namespaces, scan_namespaces, summary, unusable_line

    config = config_of(redis_url, None)
    with redis_errors(config):
        client = make_client(config)
        check_store(client, config, writes=False)  # a server without scripts holds no store
        scan = scan_namespaces(client)
        infos = describe_namespaces(client, config.stale_after, scan=scan)
    if not infos and not scan.unusable:
        click.echo(f"no redis_stats namespace at {config.safe_url}: nothing has written there yet")
        return
    for info in infos:
        click.echo(summary(info))
    for prefix in sorted(scan.unusable):
        click.echo(unusable_line(prefix))
