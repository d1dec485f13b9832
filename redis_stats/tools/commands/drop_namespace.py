"""``redis-stats drop-namespace``: remove every key of a namespace; refused while a writer of it is
live (exit code 4)."""

from __future__ import annotations

from typing import Any

import click

from redis_stats.tools.redis_options import (
    EXIT_LIVE_WRITERS,
    RedisFailed,
    config_of,
    namespace_option,
    plural,
    redis_errors,
    require_namespace,
    url_option,
    writers_summary,
)

__all__ = ["drop_namespace"]


class LiveWriters(click.ClickException):
    """drop-namespace refused: a writer of the namespace is live (exit code 4)."""

    exit_code = EXIT_LIVE_WRITERS


@click.command("drop-namespace")
@url_option
@namespace_option
@click.option("--dry-run", is_flag=True, help="Only count the keys and check the writers; remove nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (scripts).")
def drop_namespace(redis_url: str | None, namespace: str | None, dry_run: bool, yes: bool) -> None:
    """Remove a namespace: every key of every shard. Refused while any writer of it is live."""
    from redis_stats.connection import make_client
    from redis_stats.ops.removal import remove_namespace

    if namespace is None:  # never the default by accident
        raise click.UsageError("give the namespace to remove: --namespace NS (or REDIS_STATS_NAMESPACE)")
    config = config_of(redis_url, namespace)
    where = f"namespace {config.namespace!r} at {config.safe_url}"
    with redis_errors(config):
        client = make_client(config)
        require_namespace(config, client, writes=True)
        plan = remove_namespace(config, dry_run=True, client=client)
        _removal_refused(plan, where, config.stale_after)
        shards = f" in {plural(plan.shards, 'shard')}" if plan.shards > 1 else ""
        click.echo(f"{where}: {plural(plan.keys, 'key')}{shards}, no live writer")
        if not plan.scanned:
            click.echo("  (this user may not SCAN: only the keys known by name are counted and removed)")
        if dry_run:
            click.echo("dry run: nothing removed")
            return
        if not yes:
            click.confirm(f"remove {where}?", abort=True)
        done = remove_namespace(config, client=client)
        _removal_refused(done, where, config.stale_after)
    click.echo(f"removed {plural(done.keys, 'key')} of {where}")


def _removal_refused(result: Any, where: str, stale_after: float) -> None:
    """End drop-namespace when the removal was refused (live writers: exit 4; Redis: exit 1)."""
    if result.failed:
        lines = "\n".join(f"  not removed: keys {p}* ({why})" for p, why in result.failed.items())
        raise RedisFailed(
            f"{where}: Redis refused the removal\n{lines}\n  grant the user the stats-admin rules of "
            "docs/acl.md"
        )
    if result.live_writers:
        first = "; the shards before it were removed" if result.partial else "; nothing was removed"
        raise LiveWriters(
            f"{where} has {plural(len(result.live_writers), 'live writer')}{first}: "
            + writers_summary(result.live_writers)
            + f"\n  stop them (a writer stays live {stale_after:g} s after its last flush unless it "
            "closed) and run it again"
        )
