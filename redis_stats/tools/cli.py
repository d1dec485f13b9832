"""The ``redis-stats`` command: the group, and the commands it adds (one module each, in
:mod:`redis_stats.tools.commands`): demo, dev-redis, simulate, exporter, top, inspect, gc,
drop-namespace, namespaces, bridge, usage, load-proxy (retired). What they share (which Redis and
namespace, how its failures end a command) is :mod:`redis_stats.tools.redis_options`."""

from __future__ import annotations

import sys
from typing import Any

import click

from redis_stats import __version__
from redis_stats.tools.commands.bridge import bridge
from redis_stats.tools.commands.demo import demo
from redis_stats.tools.commands.dev_redis import dev_redis
from redis_stats.tools.commands.drop_namespace import drop_namespace
from redis_stats.tools.commands.exporter import exporter
from redis_stats.tools.commands.gc import gc
from redis_stats.tools.commands.inspect import inspect
from redis_stats.tools.commands.load_proxy import load_proxy
from redis_stats.tools.commands.namespaces import namespaces
from redis_stats.tools.commands.simulate import simulate
from redis_stats.tools.commands.top import top
from redis_stats.tools.commands.usage import usage

__all__ = ["main"]


class _Main(click.Group):
    """The command group; a reader of its output that goes away ends the command quietly."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # `redis-stats inspect | head -2`: the reader has what it wanted. Exit 0 without a
            # message, and with stdout pointed at /dev/null so the flush at exit cannot fail too.
            import os

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(0)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="redis-stats")
def main() -> None:
    """redis_stats: a Redis-backed distributed stats store for LLM serving fleets."""
    from redis_stats.integrations.vllm.options import warn_mistyped_variables

    # A mistyped REDIS_STATS_* name is otherwise ignored in silence (its setting keeps its default).
    warn_mistyped_variables(emit=lambda message: click.echo(f"warning: {message}", err=True))


for command in (
    demo,
    dev_redis,
    simulate,
    exporter,
    top,
    inspect,
    gc,
    drop_namespace,
    namespaces,
    bridge,
    load_proxy,
    usage,
):
    main.add_command(command)
