"""``redis-stats simulate``: write a simulated vLLM fleet into a Redis, to try the exporter, the
live page, Prometheus or a router at size; refused on a namespace holding writers it did not start."""

from __future__ import annotations

import sys
from typing import Any

import click

from redis_stats.tools.redis_options import (
    EXIT_FOREIGN_WRITERS,
    Finite,
    config_of,
    plural,
    redis_errors,
    seconds_option,
    url_option,
    writers_summary,
)

__all__ = ["simulate"]


@click.command()
@url_option
@click.option(
    "--namespace",
    envvar="REDIS_STATS_NAMESPACE",
    default="simulate",
    help="Namespace written to (not a real deployment's!) [env: REDIS_STATS_NAMESPACE].",
)
@click.option("--engines", default=64, type=click.IntRange(1, 100_000), help="Simulated engines.")
@click.option(
    "--api-servers", default=2, type=click.IntRange(1, 64), help="API servers (writers) per engine."
)
@click.option(
    "--processes",
    default=0,
    type=click.IntRange(0, 256),
    show_default="one per CPU core",
    help="Processes the engines are split into (each flushes its writers in turn).",
)
@seconds_option(
    "--period", 2, 86400, default=60.0, help="Seconds of a hot engine's cycle: its queue rises, then drains."
)
@click.option(
    "--scale",
    default=1.0,
    type=Finite(0.001, 100, min_open=False),
    help="Multiplies every engine's arrival rate (below 1: fewer tokens to simulate per engine).",
)
@click.option(
    "--hot-every",
    default=0,
    type=click.IntRange(0),
    show_default="from the fleet's size",
    help="One engine in this many is hot (1: every engine).",
)
@seconds_option("--report-interval", 1, 3600, default=10.0, help="Seconds between two progress lines.")
@click.option("--model", default="meta-llama/Llama-3.1-8B-Instruct", help="The model_name label.")
@click.option("--seed", default=0, type=int, help="Seed of the simulated requests.")
@seconds_option("--duration", 1, show_default="until Ctrl-C", help="Stop after this many seconds.")
@click.option(
    "--engines-per-endpoint",
    default=0,
    type=click.IntRange(0, 1024),
    show_default="no endpoints",
    help="Engines behind each endpoint (simulate-<i>:8000), as data-parallel engines behind one API "
    "server's address: the endpoint views (/endpoints, /metrics?endpoint=) then have endpoints to show.",
)
@click.option(
    "--share-namespace",
    is_flag=True,
    help="Write into a namespace that holds writers simulate did not start (a real deployment's: "
    "the simulated counters then stay in its totals for good). Refused without it.",
)
def simulate(redis_url: str | None, namespace: str, share_namespace: bool, **options: Any) -> None:
    """Write a simulated vLLM fleet (N engines x M API servers, the full vLLM catalogue, a few
    hot engines) into a Redis, to try the exporter, the live page, Prometheus or a router at size."""
    from redis_stats.tools.fleet_sim import MAX_WRITERS, SimulateOptions, foreign_writers, run_simulation

    opts = SimulateOptions(**options)
    writers = opts.engines * opts.api_servers
    if writers > MAX_WRITERS:
        raise click.UsageError(
            f"--engines {opts.engines:,} x --api-servers {opts.api_servers} = {writers:,} writers, more "
            f"than the {MAX_WRITERS:,} one simulation runs (each holds the full vLLM catalogue in memory "
            "and flushes every flush interval); lower --engines or --api-servers, or run several "
            "simulations, each into its own --namespace"
        )
    config = config_of(redis_url, namespace)
    with redis_errors(config):  # unreachable, a wrong password, a replica: said before anything starts
        from redis_stats.connection import make_client

        client = make_client(config)
        client.ping()
        client.close()
        foreign = [] if share_namespace else foreign_writers(config)
    if foreign:
        raise ForeignWriters(
            f"namespace {config.namespace!r} at {config.safe_url} holds {plural(len(foreign), 'writer')} "
            f"that simulate did not start ({writers_summary(foreign)}): a real deployment's, by the "
            "look of it, and the simulated counters would stay in its totals for good\n  write to "
            "another --namespace (the default, 'simulate', is meant for it), or give --share-namespace "
            "to write there anyway"
        )
    sys.exit(run_simulation(config, opts))


class ForeignWriters(click.ClickException):
    """simulate refused: the namespace holds writers it did not start (exit code 5)."""

    exit_code = EXIT_FOREIGN_WRITERS
