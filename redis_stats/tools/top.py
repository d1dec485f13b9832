"""``redis-stats top``: a live per-engine table of the Redis view (rich).

Throughput and latency percentiles are over the last refresh interval (the change between two
snapshots); running, waiting and KV usage are current values. A totals row sums throughput and
requests and averages KV usage over live engines, as vLLM's aggregate line does.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from decimal import ROUND_HALF_UP, Decimal

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from redis_stats.config import StatsConfig, redact
from redis_stats.errors import error_kind
from redis_stats.integrations.vllm.logline import EngineInterval, LogMetrics, aggregate, engine_intervals
from redis_stats.reader import StatsReader
from redis_stats.snapshot import EngineSnapshot, HistogramValue, Snapshot

__all__ = [
    "COLUMNS",
    "DROP_ORDER",
    "ITL",
    "TTFT",
    "columns_for",
    "plain_width",
    "render",
    "render_plain",
    "run_top",
    "seconds",
    "title_of",
]

# The latency histograms of the TTFT and ITL columns (vLLM's, from the integration).
TTFT, ITL = LogMetrics.ttft, LogMetrics.itl
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
# On a narrow terminal these columns go first, in this order: a column is shown whole or not at
# all. Engine, up, generation throughput, running and KV usage stay (they fit in 40 columns), and
# waiting goes last: a growing queue is the first sign of saturation, before any p99 moves.
DROP_ORDER = ("age s", "TTFT p50", "ITL p50", "prompt tok/s", "ITL p99", "TTFT p99", "waiting")


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


def seconds(value: float | None) -> str:
    """A latency as the live page writes it (``sec`` in server/web/index.html, one rule for
    both): seconds to three significant digits (``0.045 s``, ``0.742 s``, ``79.6 s``), whole
    seconds from 1,000 s, ``> last bucket`` past the last finite bucket; ``-`` for none.

    JavaScript's ``String(Number(x.toPrecision(3)))`` exactly: rounded half up on the float's
    exact value, then the shortest digits that read back as that float, positional from 1e-6 to
    1e21 (``tests/server/test_web_page.py`` compares both in Chromium)."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "> last bucket"
    exact = Decimal(value)
    if value >= 1000:
        return f"{_js_number(float(exact.quantize(Decimal(1), ROUND_HALF_UP)))} s"
    if value == 0:
        return "0 s"
    step = Decimal(1).scaleb(exact.adjusted() - 2)  # the third significant digit's place
    return f"{_js_number(float(exact.quantize(step, ROUND_HALF_UP)))} s"


def _js_number(x: float) -> str:
    """JavaScript's ``String(x)`` of a finite float: the digits of ``repr`` (both are the shortest
    that read back), laid out as JavaScript lays them out."""
    digits = Decimal(repr(x))
    if x == 0 or 1e-6 <= abs(x) < 1e21:
        text = format(digits, "f")
        return text[:-2] if text.endswith(".0") else text
    sign, numerals, exponent = digits.normalize().as_tuple()
    head = "".join(map(str, numerals))
    power = int(exponent) + len(head) - 1
    mantissa = head[0] + ("." + head[1:] if len(head) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'+' if power >= 0 else '-'}{abs(power)}"


def _recent(previous: Snapshot, current: Snapshot, engine: int, name: str) -> HistogramValue | None:
    now = _merged(current.engines.get(engine), name)
    if now is None:
        return None
    return now.minus(_merged(previous.engines.get(engine), name))


def _cells(previous: Snapshot, current: Snapshot, metrics: LogMetrics | None) -> list[tuple[str, list[str]]]:
    """(style, cells in COLUMNS order) per engine, then the totals row (style "total")."""
    rows: list[tuple[str, list[str]]] = []
    metrics = metrics or LogMetrics()
    intervals = engine_intervals(previous, current, metrics)
    for engine, snap in sorted(current.engines.items()):
        iv = intervals.get(engine)
        if iv is None:  # stale: no numbers presented as current
            rows.append(("down", [str(engine), "DOWN", f"{snap.age:.1f}", *["-"] * (len(COLUMNS) - 3)]))
            continue
        latencies = (
            _recent(previous, current, engine, metrics.ttft),
            _recent(previous, current, engine, metrics.itl),
        )
        state = "stale" if snap.state == "stale" else "up"  # stale: up, a flush or more behind
        rows.append(
            (state, [str(engine), state, f"{snap.age:.1f}", *_load_cells(iv), *_latency_cells(*latencies)])
        )
    totals = [f"{len(intervals)}/{len(current.engines)}", "", *_load_cells(aggregate(intervals))]
    rows.append(("total", ["total", *totals, "", "", "", ""]))
    return rows


def _load_cells(iv: EngineInterval) -> list[str]:
    """The throughput, request and KV usage cells of one engine's interval (or their totals)."""
    return [
        f"{iv.prompt_throughput:.1f}",
        f"{iv.generation_throughput:.1f}",
        f"{iv.running:.0f}",
        f"{iv.waiting:.0f}",
        f"{iv.kv_usage * 100:.1f}",
    ]


def _latency_cells(ttft: HistogramValue | None, itl: HistogramValue | None) -> list[str]:
    """TTFT p50, p99, ITL p50, p99 over the interval; "-" where nothing was observed."""
    return [seconds(h.quantile(q) if h and h.count else None) for h in (ttft, itl) for q in (0.5, 0.99)]


def title_of(current: Snapshot, namespace: str | None = None, url: str | None = None) -> str:
    """``redis_stats — namespace 'demo' at redis://…:***@host:port/0 — 12:00:01 — 2 engines``."""
    parts = ["redis_stats"]
    if namespace is not None:
        parts.append(f"namespace {namespace!r}" + (f" at {url}" if url else ""))
    parts.append(time.strftime("%H:%M:%S", time.localtime(current.time)))
    parts.append(_plural(len(current.engines), "engine"))
    return " — ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def columns_for(width: int | None, rows: list[list[str]], *, gap: int = 3, edge: int = 1) -> list[int]:
    """Indexes of the COLUMNS that fit in *width* characters, whole (never a cut number).

    Every column is as wide as its widest cell or header, plus *gap* characters (rich's padding
    and border: 3, and *edge* 1 for the last border; plain text: 2 between columns, so edge -2).
    Columns go in DROP_ORDER until the rest fits.
    """
    keep = list(range(len(COLUMNS)))
    if width is None:
        return keep
    widths = [max(len(COLUMNS[i]), *(len(r[i]) for r in rows)) for i in range(len(COLUMNS))]
    for name in (None, *DROP_ORDER):
        if name is not None:
            keep.remove(COLUMNS.index(name))
        if sum(widths[i] + gap for i in keep) + edge <= width:
            break
    return keep


def plain_width(environ: Mapping[str, str] | None = None) -> int:
    """The width of plain output (a pipe, a file): ``COLUMNS`` when it is a whole number > 0,
    else 80, as a terminal would be."""
    raw = (os.environ if environ is None else environ).get("COLUMNS", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 80


def _fit_title(title: str, width: int | None) -> list[str]:
    """The title on as many lines as it needs to fit *width*, broken between its parts."""
    if width is None or len(title) <= width:
        return [title]
    lines = [""]
    for part in title.split(" — "):
        candidate = f"{lines[-1]} — {part}" if lines[-1] else part
        if len(candidate) <= width or not lines[-1]:
            lines[-1] = candidate
        else:
            lines.append(part)
    return lines


def render(
    previous: Snapshot,
    current: Snapshot,
    metrics: LogMetrics | None = None,
    *,
    title: str | None = None,
    width: int | None = None,
) -> Table:
    """The table for the interval between two snapshots, with the columns that fit in *width*."""
    rows = _cells(previous, current, metrics)
    keep = columns_for(width, [cells for _, cells in rows])
    table = Table(title=title or title_of(current), header_style="bold")
    for i in keep:
        name = COLUMNS[i]
        # no_wrap: a number is shown whole or its column is not shown (columns_for chose).
        table.add_column(name, justify="left" if name in ("engine", "up") else "right", no_wrap=True)
    for style, cells in rows:
        shown = [cells[i] for i in keep]
        if style == "total":
            table.add_section()
        elif 1 in keep:  # the "up" column
            j = keep.index(1)
            shown[j] = {"down": "[red]DOWN[/red]", "stale": "[yellow]stale[/yellow]"}.get(
                style, "[green]up[/green]"
            )
        table.add_row(*shown)
    return table


def render_plain(
    previous: Snapshot,
    current: Snapshot,
    metrics: LogMetrics | None = None,
    *,
    title: str | None = None,
    width: int | None = None,
) -> str:
    """Plain aligned text (no box, no colour): for pipes and scripts. With *width*, the columns
    that fit it whole (they go in DROP_ORDER, as on a terminal) and a title broken to fit it;
    without, every column."""
    body = [cells for _, cells in _cells(previous, current, metrics)]
    keep = columns_for(width, body, gap=2, edge=-2)
    rows = [[COLUMNS[i] for i in keep]] + [[cells[i] for i in keep] for cells in body]
    widths = [max(len(r[j]) for r in rows) for j in range(len(keep))]
    lines = _fit_title(title or title_of(current), width)
    lines += [_plain_line(row, widths, keep) for row in rows]
    return "\n".join(lines)


def _plain_line(row: list[str], widths: list[int], keep: list[int]) -> str:
    # Engine and up (COLUMNS 0 and 1) read as words, left-aligned; the figures right-aligned.
    return "  ".join(
        cell.ljust(w) if keep[j] < 2 else cell.rjust(w) for j, (cell, w) in enumerate(zip(row, widths))
    ).rstrip()


def _redis_failures() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.RedisError, redis.exceptions.RedisClusterException, OSError)


def run_top(
    reader: StatsReader, *, interval: float = 2.0, once: bool = False, console: Console | None = None
) -> None:
    """Refresh the table every *interval* seconds until Ctrl-C; with *once*, print one table and return.

    The first two reads must succeed (a failure propagates: the command ends with one line). After
    that a failed read shows "Redis unavailable" and top keeps trying every *interval*: when Redis
    comes back (restarted, failed over), the table returns one interval later.
    On a terminal the table fits its width (columns go in DROP_ORDER); elsewhere (a pipe, a file)
    it is plain aligned text with every column, never wrapped or cut.
    """
    console = console or Console()
    screen = _Screen(console, reader.config)
    previous = reader.snapshot()
    time.sleep(interval)
    current = reader.snapshot()
    if once and not screen.plain:
        console.print(screen.frame(previous, current))
        return
    if screen.plain:
        screen.table(previous, current)
        if once:
            return
    with screen.live_view(previous, current):
        try:
            _follow(reader, screen, current, interval)
        except KeyboardInterrupt:
            pass


class _Screen:
    """Where top draws: a pipe gets one plain table per interval; a terminal one live table,
    redrawn in place (:meth:`live_view`)."""

    def __init__(self, console: Console, config: StatsConfig) -> None:
        self.console = console
        self.config = config
        self.plain = not console.is_terminal
        self.live: Live | None = None

    def frame(self, previous: Snapshot, current: Snapshot) -> Table | str:
        """The table between two snapshots, titled with the namespace and the masked URL."""
        title = title_of(current, self.config.namespace, self.config.safe_url)
        if self.plain:
            return render_plain(previous, current, title=title, width=plain_width())
        return render(previous, current, title=title, width=self.console.width)

    @contextmanager
    def live_view(self, previous: Snapshot, current: Snapshot) -> Iterator[None]:
        """On a terminal, the live table (first showing *previous* to *current*); else nothing."""
        if self.plain:
            yield
            return
        with Live(self.frame(previous, current), console=self.console, refresh_per_second=4) as live:
            self.live = live
            try:
                yield
            finally:
                self.live = None

    def table(self, previous: Snapshot, current: Snapshot) -> None:
        if self.live is None:
            frame = self.frame(previous, current)
            self.console.print(frame, markup=False, highlight=False, soft_wrap=True, crop=False)
        else:
            self.live.update(self.frame(previous, current))

    def note(self, text: str, style: str) -> None:
        """A line in place of the table (Redis lost, Redis back)."""
        if self.live is None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.live.update(Text(text, style=style))


def _follow(reader: StatsReader, screen: _Screen, current: Snapshot, interval: float) -> None:
    """Read and draw every *interval* seconds, forever; through a Redis outage, say so and retry."""
    failures = _redis_failures()
    config = reader.config
    last: Snapshot | None = current
    while True:
        time.sleep(interval)
        try:
            snap = reader.snapshot()
        except failures as exc:
            last = None
            screen.note(_unavailable(config, exc, interval), "bold red")
            continue
        if last is None:  # back after an outage: rates need two reads
            last = snap
            screen.note(f"Redis is back at {config.safe_url}; figures in {interval:g} s", "bold yellow")
            continue
        previous, last = last, snap
        screen.table(previous, last)


def _unavailable(config: StatsConfig, exc: BaseException, interval: float) -> str:
    return (
        f"Redis unavailable at {config.safe_url} ({error_kind(exc)}: "
        f"{redact(str(exc), config.url)}); trying again every {interval:g} s"
    )
