"""The ``redis-stats`` command: demo, simulate, exporter, top, inspect, gc, namespaces, bridge."""

from __future__ import annotations

import errno
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import click

from redis_stats import __version__
from redis_stats.config import ConfigError, StatsConfig
from redis_stats.tools.redis_options import (
    EXIT_FOREIGN_WRITERS,
    EXIT_LIVE_WRITERS,
    HOST_HINT,
    URL_FILE_HELP,
    Finite,
    RedisFailed,
    config_of,
    namespace_option,
    redis_errors,
    require_namespace,
    resolve_url,
    seconds_option,
    url_option,
)
from redis_stats.tools.stopping import on_sighup, stop_on_signals

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _several_namespaces(
    names: tuple[str, ...], every: bool, most: int, engines: str | None, slice_text: str | None
) -> list[str] | None:
    """The namespaces an exporter of several serves (None: one, or --all-namespaces), or a usage
    error for options that cannot go together."""
    from redis_stats.config import is_namespace

    if every and names:
        raise click.UsageError("--all-namespaces and --namespace both choose the namespaces: give one")
    if not every and len(names) <= 1:
        return None
    if engines or slice_text:
        option = "--engines" if engines else "--slice"
        raise click.UsageError(
            f"{option} serves part of one namespace: not with several (scrape ?namespace=NS&slice=I/N)"
        )
    bad = [n for n in names if not is_namespace(n)]
    if bad:
        raise click.BadParameter(
            f"{bad[0]!r} is not a namespace name (1-128 of A-Z a-z 0-9 . _ - / :)", param_hint="--namespace"
        )
    if len(set(names)) > most:
        raise click.BadParameter(
            f"{len(set(names))} namespaces given, more than --max-namespaces {most}", param_hint="--namespace"
        )
    return None if every else sorted(set(names))


def _engines(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        engines = [int(e) for e in text.split(",") if e.strip()]
    except ValueError:
        engines = [-1]
    if any(e < 0 for e in engines):
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of engine indexes (integers >= 0), e.g. 0,1",
            param_hint="--engines",
        )
    return engines


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


@main.command()
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


@main.command("dev-redis")
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


@main.command()
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
            f"namespace {config.namespace!r} at {config.safe_url} holds {_plural(len(foreign), 'writer')} "
            f"that simulate did not start ({_writers_summary(foreign)}): a real deployment's, by the "
            "look of it, and the simulated counters would stay in its totals for good\n  write to "
            "another --namespace (the default, 'simulate', is meant for it), or give --share-namespace "
            "to write there anyway"
        )
    sys.exit(run_simulation(config, opts))


class ForeignWriters(click.ClickException):
    """simulate refused: the namespace holds writers it did not start (exit code 5)."""

    exit_code = EXIT_FOREIGN_WRITERS


@main.command()
@url_option
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    envvar="REDIS_STATS_NAMESPACE",
    show_default="default",
    help="Namespace (one deployment; `redis-stats namespaces` lists them) [env: REDIS_STATS_NAMESPACE]. "
    "Give it several times (or several names in the variable, space-separated) to serve each on this "
    "port: ?namespace=NS, every series labelled redis_stats_namespace.",
)
@click.option(
    "--all-namespaces",
    is_flag=True,
    help="Serve every namespace this Redis holds (found again every 30 s; needs +scan), as "
    "several --namespace.",
)
@click.option(
    "--max-namespaces",
    default=64,
    type=click.IntRange(1, 10_000),
    help="The most namespaces served (--all-namespaces: the first in sorted order; the others are "
    "logged and counted).",
)
@click.option("--engines", show_default="all", help="Only these engines, e.g. 0,1.")
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option(
    "--port", default=9400, type=click.IntRange(0, 65535), help="Port to listen on (0: any free port)."
)
@seconds_option(
    "--gc-interval", 0, default=300.0, help="Seconds between retention runs (gc); 0 turns it off."
)
@seconds_option(
    "--request-timeout",
    0.1,
    3600,
    default=10.0,
    help="Seconds an HTTP connection may stay silent (or take to send a response) before it is "
    "closed, freeing its thread.",
)
@seconds_option(
    "--window", 1, 3600, default=30.0, help="Seconds of recent load behind /snapshot's rates and quantiles."
)
@click.option(
    "--max-connections",
    default=64,
    type=click.IntRange(1, 100_000),
    help="HTTP connections served at once (a thread each); more are answered 503 with Retry-After.",
)
@click.option(
    "--slice",
    "slice_text",
    default=None,
    show_default="every engine",
    metavar="I/N",
    help="Serve only the engines e with e % N == I (one of N exporters, each its own Prometheus "
    "target; the writers' self-metrics in slice 0). Or scrape one exporter with ?slice=I/N.",
)
@click.option(
    "--window-budget",
    default=64.0,
    type=Finite(0, 1_000_000),
    metavar="MB",
    help="Megabytes (MiB) the snapshots behind /snapshot's window may keep (about 5 per snapshot at "
    "1,024 vLLM engines); past it the oldest go and the window is the span that fits.",
)
@seconds_option(
    "--load-refresh",
    0.01,
    60,
    default=0.25,
    help="Seconds between two reads of the load feed (/load), shared by every request.",
)
@click.option(
    "--view-budget",
    default=256.0,
    type=click.FloatRange(0, 1_000_000),
    metavar="MB",
    help="Megabytes (MiB) the exporter may keep for requests' parameters (each ?slice= and ?endpoint= "
    "asked: a reader and renderer; /snapshot windows); past it the least recently used go, and "
    "whatever is unused for a minute.",
)
@click.option(
    "--history-budget",
    default=16.0,
    type=Finite(0, 1_000_000),
    metavar="MB",
    help="Megabytes (MiB) the live page's history of one namespace may keep (the fleet's figures and "
    "each engine's: 3.7 MB for 10 minutes of 1,024 vLLM engines); past it the oldest points go.",
)
@click.option(
    "--page-threshold",
    "page_threshold",
    multiple=True,
    metavar="NAME=VALUE,...",
    help="The live page's warning thresholds: queue (requests waiting), kv (0 to 1, or 90%), ttft_p99 "
    "and itl_p99 (2s, 500ms), each a value or 'relative' (twice the fleet's median, at least the "
    "default); e.g. queue=10,ttft_p99=2s,kv=0.9. Defaults: queue=10,kv=0.9,ttft_p99=1s,itl_p99=100ms.",
)
@click.option(
    "--web-config-file",
    type=click.Path(dir_okay=False),
    envvar="REDIS_STATS_WEB_CONFIG_FILE",
    help="Access control: a Prometheus exporter-toolkit web configuration file (TLS, client "
    "certificates, headers, basic_auth_users with bcrypt hashes), as node_exporter's "
    "--web.config.file; read again when it changes or on SIGHUP (docs/configuration.md, "
    '"Access control") [env: REDIS_STATS_WEB_CONFIG_FILE].',
)
@click.option(
    "--web-token-file",
    type=click.Path(dir_okay=False),
    envvar="REDIS_STATS_WEB_TOKEN_FILE",
    help="Access control: a file of bearer tokens, one a line (Authorization: Bearer <token>, as "
    "Prometheus' authorization and KEDA's authModes: bearer send) [env: REDIS_STATS_WEB_TOKEN_FILE].",
)
@click.option(
    "--web-open",
    multiple=True,
    metavar="PATH",
    help="A path served without credentials when access control is on (repeat: --web-open /healthz "
    "--web-open /metrics); every other path needs them.",
)
@click.option(
    "--insecure-private-views",
    is_flag=True,
    help="Serve private views (per-tenant usage: business data) without credentials: anyone who "
    "reaches the port reads them. Without it, an exporter asked to serve them with no access "
    "control refuses to start.",
)
def exporter(
    redis_url: str | None,
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    max_namespaces: int,
    engines: str | None,
    slice_text: str | None,
    window_budget: float,
    view_budget: float,
    history_budget: float,
    page_threshold: tuple[str, ...],
    **serving: Any,
) -> None:
    """Serve /metrics (every engine), /snapshot (JSON), /load (routers) and /healthz from Redis:
    of one namespace, of several (--namespace A --namespace B) or of all (--all-namespaces)."""
    from redis_stats.errors import WebConfigError
    from redis_stats.integrations.bridge.roles import BRIDGE_ROLES
    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.integrations.vllm.roles import VLLM_ROLES
    from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY
    from redis_stats.reader import EngineSlice, StatsReader
    from redis_stats.server import Exporter
    from redis_stats.server.thresholds import parse_thresholds
    from redis_stats.tools.allocator import bound_arenas

    try:
        thresholds = parse_thresholds(page_threshold)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--page-threshold") from None
    bound_arenas()  # before any thread: a thread per connection spread freed memory over 16 arenas
    if all_namespaces and click.get_current_context().get_parameter_source("namespaces") in (
        click.core.ParameterSource.ENVIRONMENT,
        click.core.ParameterSource.DEFAULT,
    ):
        namespaces = ()  # REDIS_STATS_NAMESPACE set for the other commands: --all-namespaces wins
    several = _several_namespaces(namespaces, all_namespaces, max_namespaces, engines, slice_text)
    # The reader's namespace: the one served, or the first (its client and catalogue serve all).
    config = config_of(redis_url, namespaces[0] if namespaces else "default" if all_namespaces else None)
    engine_list = _engines(engines)
    part = None
    if slice_text is not None:
        try:
            part = EngineSlice.parse(slice_text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--slice") from None
        if engine_list is not None:
            raise click.UsageError("--slice and --engines both limit the view: give one")
    # No I/O (a Cluster client too is built at first use): with Redis down the exporter starts
    # and serves redis_stats_up 0, then the data once Redis answers.
    reader = StatsReader(config, vllm_catalog())
    # The other options (host, port, gc_interval, window, ...) are Exporter's, by the same names.
    try:
        server = Exporter(
            reader,
            engines=engine_list,
            summary=VLLM_FLEET_SUMMARY,
            history=VLLM_PAGE_HISTORY,
            roles=VLLM_ROLES + BRIDGE_ROLES,  # the endpoint views' one series per family
            self_metrics=True,
            slice=part,
            window_budget=int(window_budget * 2**20),
            view_budget=int(view_budget * 2**20),
            history_budget=int(history_budget * 2**20),
            page_thresholds=thresholds,
            namespaces=several,
            all_namespaces=all_namespaces,
            max_namespaces=max_namespaces,
            **serving,
        )
    except WebConfigError as exc:
        raise click.BadParameter(str(exc), param_hint=f"--{exc.option.replace('_', '-')}") from None
    except OSError as exc:
        raise click.ClickException(
            f"cannot listen on {serving['host']}:{serving['port']}: {exc.strerror or exc}\n  "
            + (
                "is another exporter (or the demo) running? Pick another --port, or --port 0 for any free one"
                if exc.errno == errno.EADDRINUSE
                else HOST_HINT
            )
        ) from None
    stop, reload = threading.Event(), threading.Event()
    with stop_on_signals(stop.set), on_sighup(reload.set):
        server.start()
        served = (
            "every namespace"
            if all_namespaces
            else f"namespaces {', '.join(several)}"
            if several is not None
            else repr(config.namespace)
        )
        click.echo(
            f"serving {served} from {config.safe_url} on {server.url}/metrics ({server.app.gate.summary()})"
        )
        try:
            while not stop.wait(0.25):
                if reload.is_set():
                    reload.clear()
                    server.reload_web_config()  # logged either way; a broken file keeps the old
        finally:
            server.close()


@main.command()
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


@main.command()
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


@main.command()
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
        f"{verb} {_plural(len(result.engines), 'engine')} {sorted(result.engines)} and "
        f"{_plural(len(result.writers), 'writer')} (retention {config.retention:g} s)"
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
            f"{_plural(len(result.failed), 'shard')} (above): delete or rename the key named, or "
            "grant the user the stats-admin rules of docs/acl.md"
        )


class LiveWriters(click.ClickException):
    """drop-namespace refused: a writer of the namespace is live (exit code 4)."""

    exit_code = EXIT_LIVE_WRITERS


@main.command("drop-namespace")
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
        shards = f" in {_plural(plan.shards, 'shard')}" if plan.shards > 1 else ""
        click.echo(f"{where}: {_plural(plan.keys, 'key')}{shards}, no live writer")
        if not plan.scanned:
            click.echo("  (this user may not SCAN: only the keys known by name are counted and removed)")
        if dry_run:
            click.echo("dry run: nothing removed")
            return
        if not yes:
            click.confirm(f"remove {where}?", abort=True)
        done = remove_namespace(config, client=client)
        _removal_refused(done, where, config.stale_after)
    click.echo(f"removed {_plural(done.keys, 'key')} of {where}")


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
            f"{where} has {_plural(len(result.live_writers), 'live writer')}{first}: "
            + _writers_summary(result.live_writers)
            + f"\n  stop them (a writer stays live {stale_after:g} s after its last flush unless it "
            "closed) and run it again"
        )


WRITERS_SHOWN = 5
"""Writer ids a message names before it counts the rest (2,048 of them were 50 KB on one line)."""


def _writers_summary(writers: Any) -> str:
    """*writers* (ids ``host:pid[:role]:random``) in a line: how many on how many hosts, and the
    first :data:`WRITERS_SHOWN` ids (``redis-stats inspect`` lists them all)."""
    ids = sorted(writers)
    hosts = {w.split(":", 1)[0] for w in ids}
    shown = ", ".join(ids[:WRITERS_SHOWN])
    rest = len(ids) - WRITERS_SHOWN
    more = f" and {rest:,} more (redis-stats inspect lists them)" if rest > 0 else ""
    on = f" on {_plural(len(hosts), 'host')}" if len(ids) > 1 else ""
    return f"{shown}{more}{on}"


@main.command()
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


@main.command()
@url_option
@namespace_option
@click.option(
    "--source",
    "sources",
    multiple=True,
    metavar="URL",
    help="A metrics endpoint to bridge, e.g. http://127.0.0.1:8000/metrics (repeat for several; "
    "user:password@ is sent as Basic auth and never printed).",
)
@click.option(
    "--source-file",
    "source_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Read source URLs from this file, one a line (keeps a password out of `ps`).",
)
@click.option(
    "--engine-label",
    default=None,
    show_default="none: every series is engine 0",
    help="The label holding a series' engine index (vLLM: engine); series without it are engine 0.",
)
@click.option(
    "--engine-offset",
    "offsets",
    multiple=True,
    type=click.IntRange(0),
    show_default="REDIS_STATS_ENGINE_OFFSET, 0",
    help="Added to the engine indexes of a source: once per --source (in order), or once for all "
    "(source i then gets OFFSET + i x --engine-stride).",
)
@click.option(
    "--engine-stride",
    default=1,
    type=click.IntRange(1),
    help="With one --engine-offset and several sources: engines per source.",
)
@seconds_option(
    "--interval",
    0.05,
    3600,
    show_default="REDIS_STATS_FLUSH_INTERVAL, 1",
    help="Seconds between two scrapes of a source (each scrape is one flush).",
)
@seconds_option(
    "--timeout",
    0.05,
    600,
    default=5.0,
    help="Seconds a scrape may take in all (connect, TLS handshake, headers, body: one deadline).",
)
@click.option(
    "--max-body-bytes",
    "max_bytes",
    default=16 * 1024 * 1024,
    type=click.IntRange(1024),
    help="A body larger than this is refused (and counted).",
)
@click.option(
    "--format",
    "accept",
    type=click.Choice(["any", "text", "openmetrics"]),
    default="any",
    help="What to ask for: OpenMetrics or the 0.0.4 text (any), or only one. The body is parsed "
    "by the Content-Type it comes with.",
)
@click.option(
    "--family",
    "include",
    multiple=True,
    metavar="PATTERN",
    help="Store only families matching this shell pattern, e.g. 'vllm:*' (repeatable). Default: "
    "every family but those of the source's own process (process_*, python_*, go_*, promhttp_*), "
    "which a pattern that matches them stores.",
)
@seconds_option("--duration", 0.1, show_default="until SIGTERM/Ctrl-C", help="Stop after this many seconds.")
def bridge(
    redis_url: str | None,
    namespace: str | None,
    sources: tuple[str, ...],
    source_files: tuple[str, ...],
    offsets: tuple[int, ...],
    engine_stride: int,
    interval: float | None,
    duration: float | None,
    **scrape: Any,
) -> None:
    """Scrape LLM servers' own /metrics (vLLM, SGLang, TensorRT-LLM, llama.cpp) into the store,
    each source one writer (docs/bridge.md)."""
    import logging

    from redis_stats.integrations.bridge import Bridge, BridgedSource
    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.integrations.vllm.load import VLLM_LOAD

    config = config_of(redis_url, namespace)
    urls = _source_urls(sources, source_files)
    starts = _engine_starts(offsets, engine_stride, len(urls), default=config.engine_offset)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    known = vllm_catalog()
    try:
        bridged = [
            # The scrape options (engine_label, include, accept, timeout, max_bytes) are
            # BridgedSource's, by the same names.
            # load=: vLLM's families feed the load feed (/load, /get_load, /v1/loads); a source
            # without them (SGLang, ...) stores no load entry
            BridgedSource(url, config.replace(engine_offset=start), known=known, load=VLLM_LOAD, **scrape)
            for url, start in zip(urls, starts)
        ]
    except (ValueError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None
    _refuse_unsupported_store(config)
    runner = Bridge(bridged, interval=interval)
    for source, start in zip(bridged, starts):
        click.echo(
            f"bridging {source.safe_url} -> {config.namespace!r} at {config.safe_url} (engine offset {start})"
        )
    with stop_on_signals(runner.stop):  # also while it closes: a second Ctrl-C cannot cut that short
        runner.start()
        runner.wait(duration)
        runner.close()


LOAD_PROXY_RETIRED = """\
redis-stats load-proxy was retired: it sat in the path of every inference request and parsed
HTTP by hand (a body on GET /get_load became a second request to vLLM: request smuggling; one new
connection to vLLM per request). The address routers poll is now a proxy operators already run,
configured by a file this project ships and tests with the real binaries:

  nginx:   deploy/nginx/vllm-rs.conf    (HAProxy: deploy/haproxy/vllm-rs.cfg; Kubernetes:
           deploy/kubernetes/vllm-rs, the same nginx as a sidecar)
           GET /get_load and /v1/loads -> redis-stats exporter's view of the pod's endpoint,
           everything else -> vLLM's Rust front end
  numbers: redis-stats bridge --source http://127.0.0.1:8000/metrics --engine-label engine \\
             --family 'vllm:*'    with REDIS_STATS_ENDPOINT=<the proxy's address, as routers reach it>
  views:   redis-stats exporter   (the fleet's, or one on loopback)

What to run, and what it costs in the data path: docs/vllm-rs.md."""


@main.command(
    "load-proxy",
    hidden=True,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
)
@click.pass_context
def load_proxy(ctx: click.Context) -> None:
    """Retired (docs/vllm-rs.md): exits 2 saying what runs instead."""
    click.echo(LOAD_PROXY_RETIRED, err=True)
    ctx.exit(2)


def _refuse_unsupported_store(config: StatsConfig) -> None:
    """End the bridge (exit 1) when the server answers and cannot hold the store (the capability
    check). One that does not answer yet is not refused: the bridge starts, as its writers do,
    and flushes once it answers (they check it again then, and log a refusal)."""
    import redis

    from redis_stats.capability import check_store
    from redis_stats.connection import make_client
    from redis_stats.errors import error_kind

    with redis_errors(config):
        client = make_client(config)
        try:
            check_store(client, config, writes=True)
        except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
            if error_kind(exc) == "unsupported":
                raise
        finally:
            client.close()


def _source_urls(sources: tuple[str, ...], source_files: tuple[str, ...]) -> list[str]:
    """The --source URLs, then those of each --source-file; a usage error when there are none."""
    urls = [*sources, *(url for path in source_files for url in _read_sources(path))]
    if not urls:
        raise click.UsageError("give at least one --source URL (or --source-file)")
    return urls


def _engine_starts(offsets: tuple[int, ...], stride: int, sources: int, *, default: int) -> list[int]:
    """Each source's engine offset: one --engine-offset per source, or one (else *default*) for
    the first source and *stride* more for each next one."""
    if len(offsets) > 1 and len(offsets) != sources:
        raise click.UsageError(
            f"{len(offsets)} --engine-offset values for {sources} sources: give one per source, "
            "or one for all (with --engine-stride)"
        )
    if len(offsets) > 1:
        return list(offsets)
    base = offsets[0] if offsets else default
    return [base + i * stride for i in range(sources)]


def _read_sources(path: str) -> list[str]:
    """The URLs of a --source-file (one a line; blank lines and # comments skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise click.BadParameter(f"cannot read {path}: {reason}", param_hint="--source-file") from None
    return [line for line in lines if line and not line.startswith("#")]
