"""``redis-stats gc``: remove the engines and writers of a namespace past the retention."""

from __future__ import annotations

import click

from redis_stats.config import ConfigError
from redis_stats.tools.redis_options import (
    Finite,
    RedisFailed,
    config_of,
    namespace_option,
    plural,
    redis_errors,
    require_namespace,
    url_option,
)

__all__ = ["gc"]


@click.command()
@url_option
@namespace_option
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option(
    "--retention",
    type=Finite(min=0, min_open=True),
    show_default="REDIS_STATS_RETENTION, 86400",
    help="Seconds of silence after which engines and writers go.",
)
def gc(redis_url: str | None, namespace: str | None, dry_run: bool, retention: float | None) -> None:
    """Remove engines and writers that stopped heartbeating longer than the retention ago."""
    from redis_stats.connection import make_client
    from redis_stats.ops.retention import collect_garbage

    config = config_of(redis_url, namespace)
    if retention is not None:
        try:  # a retention that would remove live data is refused where it enters: exit 2
            config = config.replace(retention=retention)
        except ConfigError as exc:
            raise click.UsageError(f"--retention: {exc}") from None
    with redis_errors(config):
        client = make_client(config)
        require_namespace(config, client, writes=True)
        result = collect_garbage(config, dry_run=dry_run, client=client)
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{verb} {plural(len(result.engines), 'engine')} {sorted(result.engines)} and "
        f"{plural(len(result.writers), 'writer')} (retention {config.retention:g} s)"
    )
    for w in sorted(result.writers):
        click.echo(f"  writer {w}")
    for prefix, why in result.failed.items():
        click.echo(f"  not collected: keys {prefix}* ({why})", err=True)
    if result.failed:
        # Redis refused gc there (a key of the wrong type, a right the user lacks): exit code 1,
        # as for any refused command, so a cron job learns that part was not collected.
        raise RedisFailed(
            f"gc of namespace {config.namespace!r} at {config.safe_url} did not collect "
            f"{plural(len(result.failed), 'shard')} (above): delete or rename the key named, or "
            "grant the user the stats-admin rules of docs/acl.md"
        )
