"""``redis-stats top``: a live per-engine table of the Redis view (rich).

Throughput and latency percentiles are over the last refresh interval (the change between two
snapshots); running, waiting and KV usage are current values. A totals row sums throughput and
requests and averages KV usage over live engines, as vLLM's aggregate line does.
"""

from __future__ import annotations

import math
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from .reader import StatsReader
from .reporter import LogMetrics, StatsReporter, engine_intervals
from .snapshot import EngineSnapshot, HistogramValue, Snapshot

__all__ = ["COLUMNS", "ITL", "TTFT", "render", "run_top"]

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
COLUMNS = (
    "engine",
    "up",
    "age s",
    "prompt tok/s",
    "gen tok/s",
    "running",
    "waiting",
    "KV %",
    "TTFT p50",
    "TTFT p99",
    "ITL p50",
    "ITL p99",
)


def _merged(engine: EngineSnapshot | None, name: str) -> HistogramValue | None:
    """One histogram per engine: the series of every label set (model_name, ...) added up."""
    if engine is None:
        return None
    found = [h for (n, _), h in engine.histograms.items() if n == name]
    if not found:
        return None
    bounds = found[0].bounds
    if any(h.bounds != bounds for h in found):
        return found[0]
    cumulative = tuple(map(sum, zip(*(h.cumulative for h in found))))
    return HistogramValue(bounds, cumulative, sum(h.sum for h in found))


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.0f} ms"


def _recent(previous: Snapshot, current: Snapshot, engine: int, name: str) -> HistogramValue | None:
    now = _merged(current.engines.get(engine), name)
    if now is None:
        return None
    return now.minus(_merged(previous.engines.get(engine), name))


def render(previous: Snapshot, current: Snapshot, metrics: LogMetrics | None = None) -> Table:
    """The table for the interval between two snapshots."""
    table = Table(title=f"redis_stats — {len(current.engines)} engines", header_style="bold")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("engine", "up") else "right")
    intervals = engine_intervals(previous, current, metrics)
    for engine, snap in sorted(current.engines.items()):
        iv = intervals.get(engine)
        if iv is None:  # stale: no numbers presented as current
            table.add_row(str(engine), "[red]DOWN[/red]", f"{snap.age:.1f}", *["-"] * (len(COLUMNS) - 3))
            continue
        ttft, itl = _recent(previous, current, engine, TTFT), _recent(previous, current, engine, ITL)
        table.add_row(
            str(engine),
            "[green]up[/green]",
            f"{snap.age:.1f}",
            f"{iv.prompt_throughput:.1f}",
            f"{iv.generation_throughput:.1f}",
            f"{iv.running:.0f}",
            f"{iv.waiting:.0f}",
            f"{iv.kv_usage * 100:.1f}",
            _ms(ttft.quantile(0.5) if ttft and ttft.count else None),
            _ms(ttft.quantile(0.99) if ttft and ttft.count else None),
            _ms(itl.quantile(0.5) if itl and itl.count else None),
            _ms(itl.quantile(0.99) if itl and itl.count else None),
        )
    agg = StatsReporter.aggregate(intervals)
    table.add_section()
    table.add_row(
        "total",
        f"{len(intervals)}/{len(current.engines)}",
        "",
        f"{agg.prompt_throughput:.1f}",
        f"{agg.generation_throughput:.1f}",
        f"{agg.running:.0f}",
        f"{agg.waiting:.0f}",
        f"{agg.kv_usage * 100:.1f}",
        "",
        "",
        "",
        "",
    )
    return table


def run_top(
    reader: StatsReader, *, interval: float = 2.0, once: bool = False, console: Console | None = None
) -> None:
    """Refresh the table every *interval* seconds until Ctrl-C; with *once*, print one table and return."""
    console = console or Console()
    previous = reader.snapshot()
    time.sleep(interval)
    current = reader.snapshot()
    if once:
        console.print(render(previous, current))
        return
    with Live(render(previous, current), console=console, refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(interval)
                previous, current = current, reader.snapshot()
                live.update(render(previous, current))
        except KeyboardInterrupt:
            pass
