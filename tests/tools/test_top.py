"""``redis-stats top`` at every width: which columns stay, and latencies written as the live page
writes them (the page's own formatter is run in Chromium against :func:`top.seconds` in
tests/server/test_web_page.py)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from redis_stats.tools.top import COLUMNS, render, render_plain
from tests.vllm_shapes import iteration, scheduler, snapshot_pair

P99S = ("TTFT p99", "ITL p99")
# A saturated engine: a queue of 345, a first token after 79.6 s, tokens 42 ms apart.
TTFT, ITL = 79.6, 0.042


@pytest.fixture
def saturated(config, fake_client):
    sched = scheduler(running=256, waiting=345, kv=0.97)
    it = iteration(prompt=1_234_567, generation=234_567, ttft=[TTFT] * 10, itl=[ITL] * 100)
    with snapshot_pair(config, fake_client, sched, it) as pair:
        yield pair


def _rich(before, after, width: int) -> list[list[str]]:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(render(before, after, width=width))
    lines = console.export_text().splitlines()
    assert all(len(line) <= width for line in lines), width
    return [
        [c.strip() for c in line.strip("│┃").split("│" if "│" in line else "┃")]
        for line in lines
        if line[:1] in "│┃"
    ]


def _plain(before, after, width: int) -> list[list[str]]:
    lines = render_plain(before, after, width=width).splitlines()
    assert all(len(line) <= width for line in lines), width
    start = next(i for i, line in enumerate(lines) if line.startswith("engine"))
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start:]]


def _header(rows: list[list[str]]) -> list[str]:
    return next(r for r in rows if r and r[0] == "engine")


@pytest.mark.parametrize("draw", [_rich, _plain], ids=["terminal", "plain"])
@pytest.mark.parametrize("width", [50, 60, 80, 100, 120, 160])
def test_top_keeps_waiting_before_any_p99_and_writes_latencies_as_the_page(saturated, draw, width):
    before, after = saturated
    rows = draw(before, after, width)
    shown = _header(rows)
    assert set(shown) <= set(COLUMNS)
    assert {"engine", "up", "gen tok/s", "running", "KV %"} <= set(shown), (width, shown)
    if any(c in shown for c in P99S) or width >= 60:
        # Before: "waiting" went fourth, so 80 columns kept both p99s and no queue.
        assert "waiting" in shown, (width, shown)
    if "waiting" in shown:
        row0 = next(r for r in rows if r[0] == "0")
        assert row0[shown.index("waiting")] == "345", row0
    row0 = next(r for r in rows if r[0] == "0")
    for column in ("TTFT p50", "TTFT p99", "ITL p50", "ITL p99"):
        if column in shown:  # before: "60000 ms", "79600 ms" (the page: "60 s", "79.6 s")
            want = _quantile(before, after, column)
            cell = row0[shown.index(column)]
            assert re.fullmatch(r"\d+(\.\d+)? s", cell) and float(cell[:-2]) == float(f"{want:.3g}"), (
                width,
                column,
                cell,
                want,
            )


def _quantile(before, after, column: str) -> float:
    """Engine 0's quantile of the interval, in seconds, from the snapshots themselves."""
    name = (
        "vllm:time_to_first_token_seconds"
        if column.startswith("TTFT")
        else "vllm:inter_token_latency_seconds"
    )
    hist = after.engines[0].histogram(name, "m").minus(before.engines[0].histogram(name, "m"))
    return hist.quantile(0.5 if column.endswith("p50") else 0.99)


def test_top_at_80_columns_shows_the_queue_and_a_p99(saturated):
    before, after = saturated
    for draw in (_rich, _plain):
        shown = _header(draw(before, after, 80))
        assert "waiting" in shown and "TTFT p99" in shown, shown
