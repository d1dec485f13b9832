"""``redis-stats exporter``: serve the views of one or several namespaces over HTTP
(:mod:`redis_stats.server`)."""

from __future__ import annotations

import errno
import threading
from typing import Any

import click

from redis_stats.tools.redis_options import (
    HOST_HINT,
    Finite,
    config_of,
    seconds_option,
    url_option,
)
from redis_stats.tools.stopping import on_sighup, stop_on_signals

__all__ = ["exporter"]


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


@click.command()
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
    "--max-streams",
    default=256,
    type=click.IntRange(1, 100_000),
    help="Streams and long polls (/watch subscribers) open at once, a thread each, apart from "
    "--max-connections: subscribers at their limit get 503, and never keep /metrics, /load or "
    "/healthz from answering.",
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
@click.option(
    "--bookings",
    is_flag=True,
    help="Take routers' bookings over HTTP (POST /bookings, for routers not in Python; "
    "docs/routers.md): it writes Redis, so it is a private route (credentials, or "
    "--insecure-private-views).",
)
@click.option(
    "--usage",
    is_flag=True,
    help="Serve the usage ledger (docs/usage.md): GET /usage, and the top tenants in /metrics. "
    "Business data: needs access control (--web-config-file or --web-token-file) or "
    "--insecure-private-views.",
)
@click.option(
    "--usage-top",
    default=10,
    type=click.IntRange(0, 1000),
    show_default=True,
    metavar="N",
    help="With --usage: the N tenants with the most tokens in /metrics, one (other) series for the rest.",
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
