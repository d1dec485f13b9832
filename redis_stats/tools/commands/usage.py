"""``redis-stats usage``: the usage ledger of a namespace (docs/usage.md): a table, JSON or CSV,
grouped by tenant, adapter and/or model, all time or over a window of UTC hours; or one tenant's
totals (``--tenant T`` alone)."""

from __future__ import annotations

import json
import sys

import click

from redis_stats.tools.redis_options import config_of, namespace_option, redis_errors, url_option

__all__ = ["usage"]

_COLUMNS = ("requests", "prompt_tokens", "cached_prompt_tokens", "generation_tokens", "abort", "error")


@click.command()
@url_option
@namespace_option
@click.option(
    "--by", default="tenant", metavar="FIELDS", help="Group by tenant, adapter, model (comma-separated)."
)
@click.option(
    "--since",
    metavar="TIME",
    show_default="all time",
    help="Start: 24h, 7d, 2026-12-07, 2026-12-07T13, a unix time (UTC).",
)
@click.option(
    "--until",
    metavar="TIME",
    show_default="now",
    help="End (default: now); the window is widened to whole UTC hours.",
)
@click.option(
    "--tenant",
    show_default="every tenant",
    help="Only this tenant (alone: its totals all time, today and this hour).",
)
@click.option("--adapter", show_default="every adapter", help="Only this adapter ((base): the base model).")
@click.option("--model", show_default="every model", help="Only this model.")
@click.option(
    "--sort",
    metavar="FIELD",
    show_default="by name",
    help="Largest first by this field (e.g. generation_tokens).",
)
@click.option(
    "--limit",
    type=click.IntRange(0),
    default=None,
    show_default="every row",
    help="At most this many rows (with --sort: top N).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", help="Output format."
)
def usage(
    redis_url: str | None,
    namespace: str | None,
    by: str,
    since: str | None,
    until: str | None,
    tenant: str | None,
    adapter: str | None,
    model: str | None,
    sort: str | None,
    limit: int | None,
    fmt: str,
) -> None:
    """Exact usage per tenant, adapter and model, from the usage ledger."""
    from redis_stats.usage.read import UsageQueryError, UsageReader, parse_time
    from redis_stats.usage.render import answer_csv, answer_document, tenant_document

    config = config_of(redis_url, namespace)
    reader = UsageReader(config)
    alone = tenant is not None and since is None and until is None
    with redis_errors(config):
        if (
            alone
            and click.get_current_context().get_parameter_source("by") == click.core.ParameterSource.DEFAULT
        ):
            doc = tenant_document(reader.tenant(tenant), config.namespace)
            click.echo(json.dumps(doc, indent=1) if fmt == "json" else _tenant_table(doc))
            return
        try:
            now = reader.now()
            answer = reader.query(
                by.split(","),
                since=parse_time(since, now) if since is not None else None,
                until=parse_time(until, now) if until is not None else None,
                tenant=tenant,
                adapter=adapter,
                model=model,
                sort=sort,
                limit=limit,
            )
        except UsageQueryError as exc:
            raise click.UsageError(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps(answer_document(answer, config.namespace, 0, limit), indent=1))
    elif fmt == "csv":
        click.echo(answer_csv(answer), nl=False, color=True)  # data: exact, escape codes too
    else:
        _table(answer)


def _tenant_table(doc: dict[str, object]) -> str:
    lines = [f"tenant {json.dumps(doc['tenant'])}"]
    for when in ("total", "day", "hour"):
        values = doc[when]
        assert isinstance(values, dict)
        lines.append(f"  {when:<6} " + "  ".join(f"{k}={values[k]:,}" for k in _COLUMNS))
    return "\n".join(lines)


def _table(answer: object) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from redis_stats.usage.read import Answer
    from redis_stats.usage.render import iso

    assert isinstance(answer, Answer)
    window = "all time" if answer.since is None else f"{iso(answer.since)} .. {iso(answer.until)}"
    table = Table(title=f"usage, {window} ({answer.count:,} rows)", title_justify="left")
    for name in answer.by:
        table.add_column(name)
    for name in _COLUMNS:
        table.add_column(name.replace("_", " "), justify="right")
    for row in answer.rows:
        # Names came from clients: shown as text (no markup), control characters escaped.
        shown = [escape(json.dumps(n, ensure_ascii=False)[1:-1]) for n in row.names]
        table.add_row(*shown, *(f"{row.totals.get(c):,}" for c in _COLUMNS))
    table.add_row(*(["total"] + [""] * (len(answer.by) - 1)), *(f"{answer.total.get(c):,}" for c in _COLUMNS))
    # Piped (no terminal): wide enough that a row stays one line for grep and the like.
    Console(width=None if sys.stdout.isatty() else 250).print(table)
