"""``redis-stats demo``: a simulated vLLM fleet on an embedded (or given) Redis, an exporter and
its live page, in one command."""

from __future__ import annotations

import errno
import sys
from typing import Any

import click

from redis_stats.config import ConfigError, StatsConfig
from redis_stats.tools.redis_options import (
    HOST_HINT,
    URL_FILE_HELP,
    resolve_url,
    seconds_option,
)

__all__ = ["demo"]


@click.command()
@click.option(
    "--redis-url",
    help="Use this Redis instead of starting a private one (its password shows in `ps`: "
    "prefer --redis-url-file).",
)
@click.option("--redis-url-file", type=click.Path(dir_okay=False), help=URL_FILE_HELP)
@click.option("--nodes", default=2, type=click.IntRange(1, 64), help="Simulated nodes.")
@click.option(
    "--first-engine",
    default=0,
    type=click.IntRange(0),
    help="Engine rank of the first node (one node per host: --nodes 1 --first-engine R).",
)
@click.option("--api-servers", default=2, type=click.IntRange(1, 16), help="API-server processes per node.")
@click.option("--host", default="127.0.0.1", help="Address of the Redis view.")
@click.option(
    "--port", default=9400, type=click.IntRange(0, 65535), help="Port of the Redis view (0: any free port)."
)
@click.option("--namespace", default="demo", help="Namespace the fleet writes to.")
@seconds_option("--log-interval", 0.5, 3600, default=5.0, help="Seconds between periodic log reports.")
@click.option(
    "--leader",
    type=click.Choice(["rank0", "lease"]),
    default="rank0",
    help="Who prints the log: API server 0 of node 0 (as vLLM), or the holder of a lease in Redis "
    "(kill it and another process takes over).",
)
@seconds_option(
    "--restart-after",
    0,
    default=20.0,
    help="Seconds after a node process dies (kill it to see the DOWN line) before the demo starts "
    "it again; 0: never.",
)
@click.option(
    "--engines-per-endpoint",
    default=2,
    type=click.IntRange(0, 64),
    help="Engines served behind one endpoint (demo-<i>:8000), which the routers' views "
    "(/get_load, /v1/loads) answer by; 0: no endpoint stored.",
)
@seconds_option("--duration", 1, show_default="until Ctrl-C", help="Stop after this many seconds.")
def demo(redis_url: str | None, redis_url_file: str | None, **options: Any) -> None:
    """Simulate a multi-node vLLM fleet writing to one Redis; print the rank-0 log; serve /metrics."""
    from redis_stats.tools.demo import DemoOptions, run_demo
    from redis_stats.tools.embedded import NoServerBinary

    # The other options are DemoOptions' fields, by the same names.
    opts = DemoOptions(redis_url=resolve_url(redis_url, redis_url_file), **options)
    if opts.redis_url is not None:
        try:  # a bad URL is a usage error, before anything starts
            from redis_stats.connection import check_url

            check_url(StatsConfig(url=opts.redis_url, namespace=opts.namespace))
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
    try:
        code = run_demo(opts)
    except NoServerBinary as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:  # what happened, and nothing else: the port is in use
            raise click.ClickException(
                f"port {opts.port} on {opts.host} is in use by another program, so the demo started "
                'nothing: give another --port, or --port 0 for a free one (make demo DEMO_ARGS="--port 0")'
            ) from None
        raise click.ClickException(
            f"cannot serve on {opts.host}:{opts.port}: {exc.strerror or exc}\n  {HOST_HINT}"
        ) from None
    sys.exit(code)
