"""``redis-stats dev-redis``: a throwaway Redis on 127.0.0.1 to try the library against (docs/library.md)."""

from __future__ import annotations

import sys

import click

__all__ = ["dev_redis"]


@click.command("dev-redis")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="Port on 127.0.0.1 (0: any free one).")
def dev_redis(port: int) -> None:
    """A throwaway Redis to try the library against: prints the URL to export; Ctrl-C stops it
    and removes its data (docs/library.md)."""
    from redis_stats.tools.dev_redis import run_dev_redis
    from redis_stats.tools.embedded import NoServerBinary

    try:
        code = run_dev_redis(port)
    except NoServerBinary as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(
            f"cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}: give another --port, or 0 "
            "for a free one"
        ) from None
    sys.exit(code)
