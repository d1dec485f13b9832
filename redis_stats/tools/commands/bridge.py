"""``redis-stats bridge``: store any server's own ``/metrics`` as writers (docs/bridge.md)."""

from __future__ import annotations

from typing import Any

import click

from redis_stats.config import ConfigError, StatsConfig
from redis_stats.tools.redis_options import (
    config_of,
    namespace_option,
    redis_errors,
    seconds_option,
    url_option,
)
from redis_stats.tools.stopping import stop_on_signals

__all__ = ["bridge"]


@click.command()
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
