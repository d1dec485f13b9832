"""The exporter's live page (``/``): self-contained, and in a real headless Chromium it reads at 2,
10 and 1,024 simulated engines: the header names what it shows, the cards fill from the first poll,
the fleet charts have a time axis, the engines that need attention come first in colours that do
not repeat, the full table is sorted and paged, and a poll of 1,024 engines renders in under a
second of browser time (``performance.now()`` in the page: parse, render and layout).

``LIVE_PAGE_SCREENSHOTS=docs/img`` writes the screenshots of docs/img/ (live-page*.png), after
``LIVE_PAGE_SECONDS`` (120 for the docs) of history. Not ``REDIS_STATS_*`` names: the suite clears
those (tests/conftest.py), and the package warns of one it does not know."""

from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_stats import Catalog, Keys, StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY
from redis_stats.server import Exporter
from redis_stats.tools.top import seconds
from tests import browser, page_fleet
from tests.server import states
from tests.server.set_fleet import GROWING, growing
from tests.vllm_shapes import iteration, scheduler

DASH = "\u2013"  # the page's "no value"
CARDS = ["c-engines", "c-gen", "c-prompt", "c-running", "c-kv", "c-ttft", "c-itl"]
FLEET_CHARTS = ["ch-tput", "ch-kv", "ch-wait", "ch-ttft", "ch-itl"]


def test_the_page_is_served_at_root_and_loads_nothing_from_elsewhere(config, fake_client):
    exporter = Exporter(StatsReader(config, vllm_catalog(), client=fake_client()), port=0).start()
    try:
        with urllib.request.urlopen(exporter.url + "/", timeout=10) as resp:
            content_type, page = resp.headers["Content-Type"], resp.read().decode()
    finally:
        exporter.close()
    assert content_type == "text/html; charset=utf-8"
    assert '"snapshot?buckets=0&"' in page and "name[]=" in page
    # Self-contained: no external script, stylesheet, font or image.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page and "@font-face" not in page


def test_ci_fails_rather_than_skips_when_no_browser_can_run(monkeypatch):
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.delenv("CI_REQUIRE_BROWSER", raising=False)
    assert "make test-browser installs it" in (browser.missing() or "")  # a developer's machine: skip
    monkeypatch.setenv("CI_REQUIRE_BROWSER", "1")  # .ci/run
    with pytest.raises(RuntimeError, match="CI_REQUIRE_BROWSER=1 but no chromium"):
        browser.missing()


@pytest.mark.slow
def test_top_writes_every_latency_exactly_as_the_page_does(config, fake_client):
    """One rule for both: the page's own ``sec`` (run here in Chromium) and top's ``seconds`` give
    the same text for every value, ties, rounding up to 1,000 s and tiny values included."""
    if why := browser.missing():
        pytest.skip(why)
    rng = random.Random(7)
    values = [0.0, 1e-7, 1.234e-7, 1.5e-6, 1.234e-5, 0.0005, 0.001, 0.0175, 0.02493, 0.045, 0.125]
    values += [0.7424, 1.125, 2.45, 12.34, 45.55, 79.6, 99.95, 999.4, 999.6, 1000.0, 1000.5, 1234.4]
    values += [86400.5, 2.5e21, math.inf] + [10 ** rng.uniform(-7, 5) for _ in range(300)]
    exporter = Exporter(StatsReader(config, vllm_catalog(), client=fake_client()), port=0).start()
    b = browser.Browser()
    try:
        b.get(exporter.url + "/")
        texts = json.dumps([repr(v).replace("inf", "Infinity") for v in values])
        page = b.js(f"return {texts}.map(v => sec(Number(v)))")
    finally:
        b.close()
        exporter.close()
    mismatches = [(v, p, seconds(v)) for v, p in zip(values, page) if p != seconds(v)]
    assert not mismatches, mismatches[:10]
    assert page[values.index(79.6)] == "79.6 s"  # top wrote "79600 ms"


def _fleet_doc(engines: int, hot: set[int], full: set[int]) -> dict[str, Any]:
    """A /snapshot document of *engines* engines as a busy simulated fleet gives it: every TTFT p99
    past 1 s (1.2 to 1.5 s), queues of 0 to 4; the *hot* ones queued (40 waiting, TTFT p99 6 s),
    the *full* ones' KV cache at 99 %."""
    ttft, itl = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"
    doc: dict[str, Any] = {"window": {"seconds": 30, "requested_seconds": 30, "engines": {}}, "engines": {}}
    for e in range(engines):
        waiting = 40 if e in hot else e % 5
        kv = 0.99 if e in full else 0.3 + 0.4 * (e % 11) / 11
        gauges = {
            "vllm:num_requests_running": [{"labels": {}, "value": 12}],
            "vllm:num_requests_waiting": [{"labels": {}, "value": waiting}],
            "vllm:kv_cache_usage_perc": [{"labels": {}, "value": kv}],
        }
        doc["engines"][str(e)] = {"up": True, "state": "up", "age_seconds": 0.5, "gauges": gauges}
        p99 = 6.0 if e in hot else 1.2 + 0.3 * (e % 7) / 7
        doc["window"]["engines"][str(e)] = {
            "rates": {},
            "histograms": {
                ttft: [{"p50": p99 / 3, "p99": p99}],
                itl: [{"p50": 0.02, "p99": 0.05 + 0.01 * (e % 3)}],
            },
        }
    return doc


RELATIVE_ALL = dict.fromkeys(("queue", "kv", "ttft_p99", "itl_p99"), "relative")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("query", "thresholds", "flagged"),
    [
        ("", {}, "every engine"),  # the defaults, fixed: 1 s of TTFT p99 flags this slow fleet whole
        ("", RELATIVE_ALL, "the standouts"),  # --page-threshold NAME=relative: relative to the fleet
        ("?warn_ttft=1", RELATIVE_ALL, "every engine"),  # a viewer's own on the URL, used as set
        ("", {"ttft_p99": 5.0, "queue": 30.0, "kv": 0.95, "itl_p99": 1.0}, "the standouts"),  # the operator's
    ],
)
def test_needs_attention_at_1024_engines_flags_past_the_thresholds_set(
    config, fake_client, query, thresholds, flagged
):
    """At 1,024 simulated engines whose every TTFT p99 is past 1 s: the default thresholds are
    fixed, so all are flagged; the operator's own (``--page-threshold``) flag what passes them;
    ``relative`` ones (twice the fleet's median; KV halfway from its median to full; never below
    the default) flag the ten queued engines and the two with a full KV cache, nothing else, ranked
    worst first. A threshold set on the page's URL is used as set."""
    if why := browser.missing():
        pytest.skip(why)
    hot, full = {3, 100, 200, 300, 400, 517, 600, 700, 800, 1000}, {5, 900}
    doc = _fleet_doc(1024, hot, full)
    exporter = Exporter(
        StatsReader(config, vllm_catalog(), client=fake_client()), port=0, page_thresholds=thresholds
    ).start()
    b = browser.Browser()
    try:
        b.get(exporter.url + "/" + query)
        got = b.js(
            f"const rows = engineRows({json.dumps(doc)});"
            "return [rows.filter(r => r.warns.length).map(r => r.id),"
            " rows.slice().sort((a, b) => b.attention - a.attention).slice(0, 12).map(r => r.id),"
            " Object.assign({}, WARN)]"
        )
    finally:
        b.close()
        exporter.close()
    warned, top, shown = set(got[0]), got[1], got[2]
    if flagged == "every engine":
        assert len(warned) == 1024 and shown["ttft99"] == 1, shown
        return
    assert warned == hot | full, (sorted(warned - hot - full), sorted((hot | full) - warned), shown)
    assert set(top) == hot | full  # ranked first: what stands out
    if thresholds == RELATIVE_ALL:
        assert 2.4 <= shown["ttft99"] <= 3.0 and shown["waiting"] == 10, shown


def _itl_doc(p99: float) -> dict[str, Any]:
    """Ten up engines whose ITL p99 is *p99* (the fleet's median)."""
    doc: dict[str, Any] = {
        "time": time.time(),
        "window": {"seconds": 30, "requested_seconds": 30, "engines": {}},
        "engines": {},
        "fleet": {"gauges": {"vllm:num_requests_running": {}}, "rates": {}},
    }
    for e in range(10):
        doc["engines"][str(e)] = {"up": True, "state": "up", "age_seconds": 0.5, "gauges": {}}
        itl = [{"p50": p99 / 2, "p99": p99}]
        doc["window"]["engines"][str(e)] = {"seconds": 30, "rates": {}, "histograms": {
            "vllm:inter_token_latency_seconds": itl}}  # fmt: skip
    return doc


@pytest.mark.slow
@pytest.mark.parametrize(
    ("thresholds", "shown"),
    [
        ({}, ["ITL p99 ≥ 0.1 s (default)", "ITL p99 ≥ 0.1 s (default)"]),
        ({"itl_p99": 0.25}, ["ITL p99 ≥ 0.25 s (--page-threshold)"] * 2),
        (
            {"itl_p99": "relative"},
            [
                "ITL p99 ≥ 0.1 s (relative: 2 \u00d7 the fleet median, at least 0.1 s; --page-threshold)",
                "ITL p99 ≥ 0.12 s (relative: 2 \u00d7 the fleet median, at least 0.1 s; --page-threshold)",
            ],
        ),
    ],
)
def test_the_thresholds_the_operator_sets_are_shown_and_do_not_move_with_the_fleet(
    config, fake_client, thresholds, shown
):
    """Before, every threshold moved with the fleet's median: ITL p99 0.1 s on one load, 0.12 s on
    the next, and the page did not say which it used. Now the page shows each threshold and where
    it comes from; a default or an operator's own stays put from one load to the next; a relative
    one (asked for) moves, and says so."""
    if why := browser.missing():
        pytest.skip(why)
    exporter = Exporter(
        StatsReader(config, vllm_catalog(), client=fake_client()), port=0, page_thresholds=thresholds
    ).start()
    b = browser.Browser()
    try:
        b.get(exporter.url + "/?namespace=elsewhere")  # its own polls fail: only these documents
        texts = []
        for p99 in (0.05, 0.06):
            b.js(f"update({json.dumps(_itl_doc(p99))}); return 1")
            texts.append(b.js("return document.getElementById('thresholds').textContent"))
    finally:
        b.close()
        exporter.close()
    assert [next(part for part in t.split(" · ") if part.startswith("ITL")) for t in texts] == shown, texts
    assert texts[0].startswith("thresholds: queue ≥ 10 ")


class Page:
    """A headless Chromium on the live page of an exporter over a simulated fleet."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self.b = browser.Browser()
        self.b.resize(1280, 1500)
        self.b.get(exporter.url + "/")

    def js(self, script: str) -> Any:
        return self.b.js(script)

    def renders(self) -> list[dict[str, Any]]:
        return self.js("return window.__renders") or []

    def wait(self, what: str, script: str, timeout: float) -> Any:
        """Poll *script* until it returns something truthy (the page polls every 2 s)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(script)
            if value:
                return value
            if time.monotonic() > deadline:
                status = self.js("return document.getElementById('status').textContent")
                raise AssertionError(f"{what}: not within {timeout} s (status: {status!r})")
            time.sleep(0.5)

    def text(self, element_id: str) -> str:
        return self.js(f"return document.getElementById({element_id!r}).textContent")

    def table(self, tbody: str) -> list[list[str]]:
        return self.js(
            f"return Array.from(document.querySelectorAll('#{tbody} tr'))"
            ".map(r => Array.from(r.cells).map(c => c.textContent))"
        )

    def warned(self, tbody: str, column: int) -> dict[str, bool]:
        """Engine -> whether the cell in *column* is coloured as a warning."""
        return dict(
            self.js(
                f"return Array.from(document.querySelectorAll('#{tbody} tr')).filter(r => r.cells.length > 1)"
                f".map(r => [r.cells[0].textContent, r.cells[{column}].classList.contains('warn')])"
            )
        )

    def screenshot(self, name: str) -> bytes:
        where = os.environ.get("LIVE_PAGE_SCREENSHOTS")
        if where:  # how docs/img/live-page*.png are made (with LIVE_PAGE_SECONDS=120 of history)
            time.sleep(float(os.environ.get("LIVE_PAGE_SECONDS", "0")))
            self.b.resize(1280, min(2000, 140 + int(self.js("return document.documentElement.scrollHeight"))))
        png = self.b.screenshot()
        if where:
            Path(where, name).write_bytes(png)
        return png

    def close(self) -> None:
        self.b.close()


@pytest.fixture
def fleet_page(redis_server, namespace) -> Iterator[Any]:
    """``open(engines, warm=..., **fleet options)`` -> (Page, exporter); everything stopped after."""
    if why := browser.missing():
        pytest.skip(why)
    made: list[Any] = []

    def open_(
        engines: int,
        *,
        warm: bool,
        stale_after: float = 3.0,
        wait: float = 0.0,
        thresholds: dict[str, Any] | None = None,
        **options: Any,
    ) -> Page:
        proc = page_fleet.spawn(redis_server.url, namespace, engines, stale_after=stale_after, **options)
        made.append(proc)
        config = StatsConfig(url=redis_server.url, namespace=namespace, stale_after=stale_after)
        exporter = Exporter(
            StatsReader(config, vllm_catalog()),
            port=0,
            window=10,
            summary=VLLM_FLEET_SUMMARY,
            history=VLLM_PAGE_HISTORY,
            page_thresholds=thresholds or {},
        )
        made.append(exporter.start())
        if warm:  # an exporter some client already asks: its window exists when the page opens
            states.snapshot_json(exporter)
            time.sleep(3)  # a window of a few seconds (at least a tenth of the 10 s one)
        time.sleep(wait)  # the page opened that long after the exporter started
        page = Page(exporter)
        made.append(page)
        return page

    yield open_
    for thing in reversed(made):
        if hasattr(thing, "stdin"):
            thing.stdin.close()
            thing.wait(30)
        else:
            thing.close()


@pytest.mark.redis_server
@pytest.mark.slow
def test_two_engines_header_cards_from_the_first_poll_time_axes_and_seconds(
    fleet_page, redis_server, namespace
):
    page = fleet_page(2, warm=True)
    page.wait("three polls", "return (window.__renders || []).length >= 3", 30)
    first = page.renders()[0]
    # The rates come from /snapshot's window: the first poll already has them, no blank card.
    assert first["window"] is not None and first["blank"] == [], first
    # And the charts start from what that window kept: its first read at least.
    assert page.js("return window.__seeded") >= 1
    assert page.text("h-ns") == namespace
    assert page.text("h-model") == page_fleet.MODEL
    assert page.text("h-redis") == redis_server.url  # scheme, host, port, db: nothing else
    assert float(page.text("c-gen").replace("k", "")) > 0
    rows = page.table("rows")
    assert [[r[0], r[3]] for r in rows] == [["0", "up"], ["1", "up"]], rows
    # Where each runs, beside it: its endpoint and its writers' host (the pod), as they stored them.
    assert [r[1:3] for r in rows] == [["vllm-0.vllm:8000", "vllm-0"], ["vllm-1.vllm:8000", "vllm-1"]], rows
    for row in rows:  # TTFT p50/p99, ITL p50/p99 and age: seconds, written as seconds
        assert all(re.fullmatch(r"[\d.]+ s", cell) for cell in (row[4], *row[10:14])), row
    # Fleet charts: lines through several polls, and a time axis of clock times.
    for chart in FLEET_CHARTS:
        paths = page.js(
            f"return Array.from(document.querySelectorAll('#{chart} path')).map(p => p.getAttribute('d'))"
        )
        ticks = page.js(
            f"return Array.from(document.querySelectorAll('#{chart} text.tick')).map(t => t.textContent)"
        )
        assert paths and all(p.startswith("M") and "L" in p for p in paths), (chart, paths)
        assert len(ticks) >= 2 and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in ticks), (chart, ticks)
    assert page.text("status").startswith("updated ")
    assert page.b.screenshot().startswith(b"\x89PNG")


@pytest.mark.redis_server
@pytest.mark.slow
def test_ten_engines_the_down_and_queued_come_first_in_colours_that_do_not_repeat(fleet_page):
    page = fleet_page(10, warm=False, queued=(3, 8), full=(5,), down=(7,))
    page.wait("a first poll", "return (window.__renders || []).length >= 1", 20)
    first = page.renders()[0]
    if first["window"] is None:  # a cold exporter: rates say when they come, never a bare dash
        assert first["blank"] == [], first
    page.wait(
        "engine 7 down and both queued engines past the threshold",
        "const r = Array.from(document.querySelectorAll('#att-rows tr'));"
        "const warned = r.filter(x => x.cells[3].className === 'warn').map(x => x.cells[0].textContent);"
        "return r.length >= 3 && r[0].cells[0].textContent === '7' && r[1].cells[3].className === 'warn'"
        " && warned.includes('3') && warned.includes('8')"
        " && window.__renders.filter(x => x.window !== null).length >= 3",
        40,
    )
    attention = page.table("att-rows")
    assert attention[0][2].startswith("down"), attention
    assert {attention[1][0], attention[2][0]} <= {"3", "5", "8"}, attention
    # Where each runs, beside it: the down one in the pod that stopped, the others in theirs.
    assert attention[0][1] == "vllm-gone.vllm:8000 · vllm-gone", attention
    pod_of = {str(e): f"vllm-{i % 2}" for i, e in enumerate(e for e in range(10) if e != 7)}  # the halves
    assert all(r[1] == f"{pod_of[r[0]]}.vllm:8000 · {pod_of[r[0]]}" for r in attention[1:]), attention
    queued = page.warned("att-rows", 3)
    assert queued["3"] and queued["8"], attention  # their queue in the warning colour
    full_table = page.warned("rows", 8)
    assert full_table["3"] and full_table["8"] and not full_table["0"], full_table
    # Each engine drawn has its own colour: the swatch in the list and its line in the chart.
    swatches = page.js(
        "return Array.from(document.querySelectorAll('#att-rows tr')).map(r =>"
        " [r.cells[0].textContent, r.querySelector('i.sw').style.background])"
    )
    assert len({colour for _, colour in swatches}) == len(swatches) == 8, swatches
    lines = page.js(
        "return Array.from(document.querySelectorAll('#ch-att path'))"
        ".map(p => [p.dataset.engine, p.getAttribute('stroke')])"
    )
    assert lines and len({c for _, c in lines}) == len(lines), lines
    # The full table sorts by a column (a click: descending first).
    page.js("document.querySelector('#table th[data-key=waiting]').click(); return 1")
    by_queue = page.table("rows")
    assert by_queue[0][0] in {"3", "8"} and int(by_queue[0][8]) >= int(by_queue[1][8]), by_queue
    assert next(r for r in by_queue if r[0] == "7")[3] == "DOWN"
    # The filter takes a pod (or an endpoint): its engines only.
    page.js(
        "const f = document.getElementById('filter'); f.value = 'vllm-gone';"
        " f.dispatchEvent(new Event('input')); return 1"
    )
    assert [r[0] for r in page.table("rows")] == ["7"]
    page.js(
        "const f = document.getElementById('filter'); f.value = '';"
        " f.dispatchEvent(new Event('input')); return 1"
    )
    page.screenshot("live-page.png")


@pytest.mark.redis_server
@pytest.mark.slow
def test_1024_engines_render_in_under_a_second_paged_with_bounded_lines(fleet_page):
    # stale_after 30 s: on a loaded 2-core machine the simulation of 1,024 engines can fall a few
    # seconds behind, and its engines must not look down for that (the 10-engine test covers down).
    # The operator's TTFT threshold: every simulated engine's p99 is past the default 1 s.
    page = fleet_page(
        1024,
        warm=False,
        interval=2.0,
        stale_after=30.0,
        load=0.3,
        queued=(3, 100, 517),
        full=(5, 900),
        thresholds={"ttft_p99": 30.0},
    )
    page.wait(
        "two polls with a window", "return window.__renders.filter(x => x.window !== null).length >= 2", 90
    )
    renders = [r for r in page.renders() if r["window"] is not None]
    assert all(r["engines"] == 1024 for r in renders)
    totals = [round(r["total_ms"]) for r in renders]
    # Browser time of one poll: JSON.parse of /snapshot, the render, and the layout it causes. The
    # fastest poll is the page's own cost; the others add what this shared machine's load takes.
    assert min(totals) < 1000, f"browser ms per poll: {totals}; {renders}"
    print(f"\nlive page at 1,024 engines: browser ms per poll {totals}, median {statistics.median(totals)}")
    assert page.text("pageinfo") == "1\u201350 of 1024 \u00b7 page 1 of 21"
    assert len(page.table("rows")) == 50  # one page in the DOM, not 1,024 rows
    page.js("document.getElementById('next').click(); return 1")
    assert page.table("rows")[0][0] == "50"
    # Lines drawn: two per fleet chart and one per engine that needs attention, not 1,024.
    assert page.js("return document.querySelectorAll('svg path').length") <= 2 * len(FLEET_CHARTS) + 8
    page.js("document.getElementById('prev').click(); return 1")
    queued = {"3", "100", "517"}  # more arrivals than they may run: their queue grows past 10
    # Each queue grows at its own pace (the simulation runs behind on a loaded machine): wait until
    # all three have passed the threshold, then hold what the page shows for them.
    page.wait(
        "the three queued engines past the threshold",
        "const r = Array.from(document.querySelectorAll('#att-rows tr'));"
        "return ['3', '100', '517'].every(e => r.some(x => x.cells[0].textContent === e"
        " && x.cells[2].textContent.startsWith('queue')))",
        60,
    )
    attention = page.table("att-rows")
    assert queued <= {r[0] for r in attention}, attention
    assert all(r[2].startswith("queue") for r in attention if r[0] in queued), attention
    assert all(r[1] == f"vllm-{int(r[0]) % 2}.vllm:8000 · vllm-{int(r[0]) % 2}" for r in attention), attention
    page.js("document.querySelector('#table th[data-key=kv]').click(); return 1")  # KV, highest first
    assert {r[0] for r in page.table("rows")[:2]} == {"5", "900"}  # the engines with long prompts
    assert page.warned("rows", 9)["5"] and page.warned("rows", 9)["900"]
    page.js("document.querySelector('#table th[data-key=id]').click(); return 1")
    page.screenshot("live-page-1024.png")


# The page's fleetHist keys, as /history names them.
PAGE_FIGURES = {
    "gen": "generation_tokens_per_second",
    "prompt": "prompt_tokens_per_second",
    "kvMean": "kv_cache_usage_mean",
    "kvMax": "kv_cache_usage_max",
    "waiting": "requests_waiting",
    "waitMax": "requests_waiting_max",
    "ttftW": "ttft_p99_worst",
    "ttftM": "ttft_p99_median",
    "itlW": "itl_p99_worst",
    "itlM": "itl_p99_median",
}


@pytest.mark.slow
def test_on_first_open_the_fleet_charts_are_drawn_from_the_exporters_history(config, fake_client):
    """Before, on first open the five fleet charts had one point (a dot, no line) and filled in as
    the page polled, though the exporter had read the fleet all along. An exporter asked for
    /snapshot every 10 s over the last 5 minutes (a fleet whose numbers are set): the page's first
    render draws every chart through those 30 points, with the values set, on a time axis of
    minutes; its own first point is the very point the exporter kept for the same read."""
    if why := browser.missing():
        pytest.skip(why)
    start = float(int(time.time()) - 300)
    clock: list[float | None] = [start]  # None: reads happen now
    reader = StatsReader(config, vllm_catalog(), client=fake_client())
    reader.snapshot = lambda part=None: growing(time.time() if clock[0] is None else clock[0])  # type: ignore[method-assign]
    exporter = Exporter(
        reader, port=0, window=30, summary=VLLM_FLEET_SUMMARY, history=VLLM_PAGE_HISTORY
    ).start()
    page = None
    try:
        for i in range(30):  # a router asking every 10 s, the last 10 s ago
            clock[0] = start + 10 * i
            assert states.snapshot_json(exporter, buckets=False)[0] == 200
        clock[0] = None
        page = Page(exporter)
        page.wait("a first poll", "return (window.__renders || []).length >= 1", 20)
        fleet, seeded = page.js("return [fleetHist.slice(0, 31), window.__seeded]")
        paths = {
            chart: page.js(
                f"return Array.from(document.querySelectorAll('#{chart} path')).map(p => p.getAttribute('d'))"
            )
            for chart in FLEET_CHARTS
        }
        ticks = page.js(
            "return Array.from(document.querySelectorAll('#ch-tput text.tick')).map(t => t.textContent)"
        )
        status, history = _get_json(exporter.url + "/history")
    finally:
        if page is not None:
            page.close()
        exporter.close()
    assert seeded == 30 and len(fleet) == 31, (seeded, fleet)
    assert [p["t"] for p in fleet[:30]] == [start + 10 * i for i in range(30)]
    # The first has no window yet (no rates, no p99); every other is the fleet's set figures.
    assert fleet[0]["gen"] is None and fleet[0]["ttftW"] is None and fleet[0]["waiting"] == 10
    for point in fleet[1:30]:
        assert {k: point[k] for k in PAGE_FIGURES} == {k: GROWING[n] for k, n in PAGE_FIGURES.items()}, point
    # Drawn at the first render: each chart's two lines through the 29 points with values and the
    # page's own (two for KV and the queue, which have a value at the first point too).
    for chart, lines in paths.items():
        assert len(lines) == 2 and all(d.count("L") >= 29 for d in lines), (chart, lines)
    assert len(ticks) >= 2 and all(re.fullmatch(r"\d\d:\d\d", t) for t in ticks), ticks  # minutes
    # The page's own point (computed in the browser from its /snapshot) is the exporter's for that read.
    assert status == 200 and history["points"]["time"][-1] == fleet[30]["t"]
    kept = {k: history["points"][n][-1] for k, n in PAGE_FIGURES.items()}
    assert {k: fleet[30][k] for k in PAGE_FIGURES} == kept
    assert kept == {k: GROWING[n] for k, n in PAGE_FIGURES.items()} | {
        k: pytest.approx(GROWING[n], rel=1e-6) for k, n in PAGE_FIGURES.items() if k in ("gen", "prompt")
    }


@pytest.mark.slow
def test_cards_say_measuring_while_the_window_measures_no_up_engine_yet(config, fake_client):
    """Redis restarted empty: the window exists but its first read held no engine, so /snapshot
    measures none yet (window.engines[e].seconds null) rather than counting their whole totals as
    a spike. The cards say "measuring…", not a bare dash nor a rate of 0; the queue and KV, which
    need no window, are shown; once an engine is measured, its rate is."""
    if why := browser.missing():
        pytest.skip(why)
    gauges = {
        "vllm:num_requests_waiting": [{"labels": {}, "value": 4}],
        "vllm:kv_cache_usage_perc": [{"labels": {}, "value": 0.5}],
    }
    rate = {"vllm:generation_tokens": [{"labels": {}, "per_second": 30.0}]}
    doc: dict[str, Any] = {
        "time": time.time(),
        "window": {"seconds": 10, "requested_seconds": 30, "engines": {}},
        "engines": {},
    }
    for e in range(2):
        doc["engines"][str(e)] = {"up": True, "state": "up", "age_seconds": 0.5, "gauges": gauges}
        doc["window"]["engines"][str(e)] = {"seconds": None, "rates": {}, "histograms": {}}
    later = json.loads(json.dumps(doc))
    later["time"] += 2
    later["window"]["engines"]["1"] = {"seconds": 10, "rates": rate, "histograms": {}}
    exporter = Exporter(StatsReader(config, vllm_catalog(), client=fake_client()), port=0).start()
    b = browser.Browser()
    try:
        b.get(exporter.url + "/?namespace=elsewhere")  # its own polls fail: only these documents
        cards = "return ['c-gen', 'c-ttft', 'c-running', 'c-kv'].map(id => $(id).textContent)"
        before = b.js(f"update({json.dumps(doc)}); {cards}")
        after = b.js(f"update({json.dumps(later)}); {cards}")
    finally:
        b.close()
        exporter.close()
    dash = "\u2013"  # the page's "no value"
    assert before == ["measuring…", "measuring…", f"{dash} / 8", "50 / 50 %"], before
    assert after[0] == "30.0" and after[1] == dash, after  # measured: its rate; no TTFT observed


def _get_json(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


@pytest.mark.redis_server
@pytest.mark.slow
def test_the_page_keeps_a_trace_of_engines_that_went_down_and_came_back(redis_server, namespace):
    """Engine 2 is restarted (its writer closes: DOWN at once; a new one takes it ~5 s later),
    engine 3's writer stops flushing and never comes back: the page lists both, 2 with when it
    went and came back and for how long, 3 as still down; 0 and 1 never. Before, engine 2's
    outage left no trace once it was up again."""
    if why := browser.missing():
        pytest.skip(why)
    config = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.25, stale_after=2.0)
    cat = vllm_catalog()

    def writer(engines: list[int], role: str, *, start: bool = True) -> StatsWriter:
        w = StatsWriter(config, cat, engines=engines, role=role, start=start)
        recorder = VllmRecorder(w, page_fleet.MODEL, engines)
        for e in engines:
            recorder.record(scheduler(running=2, waiting=1, kv=0.3), iteration(generation=10), engine_idx=e)
        assert w.flush()
        return w

    writers = [writer([0, 1], "live"), writer([3], "stops", start=False)]
    first = writer([2], "before")
    stopped_3 = time.time()
    exporter = Exporter(StatsReader(config, cat), port=0, window=10, summary=VLLM_FLEET_SUMMARY).start()
    page = Page(exporter)
    try:
        page.wait("a first poll", "return (window.__renders || []).length >= 1", 20)
        time.sleep(2)
        went = time.time()
        first.close()  # a clean exit: DOWN at once
        script = (
            "return Array.from(document.querySelectorAll('#out-rows tr')).filter(r => r.cells.length === 5)"
            ".map(r => Array.from(r.cells).map(c => c.textContent))"
        )
        engine_2 = script.replace("return ", "const rows = ") + "; return rows.some(r => r[0] === '2' && "
        page.wait("engine 2 down", engine_2 + "r[2] === 'still down')", 20)
        time.sleep(5)
        writers.append(writer([2], "after"))  # the engine's restarted server
        back = time.time()
        page.wait("engine 2 back", engine_2 + "r[2] !== 'still down')", 20)
        for _ in range(2):  # still there polls later: a trace, not a state
            time.sleep(2.1)
        rows = page.js(script)
        assert sorted(r[0] for r in rows) == ["2", "3"], rows
        two, three = (next(r for r in rows if r[0] == e) for e in ("2", "3"))
        assert rows[0] == three and three[2] == "still down", rows  # still down first
        assert re.fullmatch(r"\d\d:\d\d:\d\d", two[1]) and re.fullmatch(r"\d\d:\d\d:\d\d", two[2]), two
        assert abs(_clock_seconds(two[1]) - _clock_seconds(went)) <= 1, (two, went)  # its last heartbeat
        assert 0 <= _clock_seconds(two[2]) - _clock_seconds(back) <= 3, (two, back)  # the first poll after
        down_for = int(two[3].removesuffix(" s"))
        assert back - went - 1 <= down_for <= back - went + 3, (two, back - went)
        assert abs(_clock_seconds(three[1]) - _clock_seconds(stopped_3)) <= 1, (three, stopped_3)
        assert page.js("return document.querySelector('#out-rows tr td:nth-child(4).bad') !== null")
        assert page.text("out-note").startswith("1 still down · 1 back"), page.text("out-note")
    finally:
        page.close()
        exporter.close()
        for w in writers:
            w.close()


def _clock_seconds(when: float | str) -> int:
    """Seconds since local midnight of a time, or of the page's ``HH:MM:SS``."""
    if isinstance(when, str):
        h, m, s = map(int, when.split(":"))
        return h * 3600 + m * 60 + s
    t = time.localtime(when)
    return t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec


@pytest.mark.slow
def test_in_headless_chromium_the_page_says_when_redis_is_unavailable(namespace):
    if why := browser.missing():
        pytest.skip(why)
    from redis_stats.tools.embedded import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    config = StatsConfig(url=url, namespace=namespace, connect_timeout_ms=200)
    exporter = Exporter(StatsReader(config, vllm_catalog()), port=0).start()
    b = browser.Browser()
    try:
        b.get(exporter.url + "/")
        time.sleep(3)
        status = b.js("return document.getElementById('status').textContent")
        css = b.js("return document.getElementById('status').className")
    finally:
        b.close()
        exporter.close()
    assert status == "Redis unavailable (connection); trying again every 2 s" and css == "error"


@pytest.mark.redis_server
@pytest.mark.slow
def test_an_exporter_of_several_namespaces_gets_a_picker_and_each_namespace_its_own_page(
    redis_server, namespace
):
    """Two models on one exporter: the picker lists both, each shows its own engines, a choice
    starts that namespace's history afresh and is kept in the page's URL (?namespace=)."""
    if why := browser.missing():
        pytest.skip(why)
    small, large = f"{namespace}-small", f"{namespace}-large"
    fleets = [page_fleet.spawn(redis_server.url, small, 2), page_fleet.spawn(redis_server.url, large, 3)]
    reader = StatsReader(StatsConfig(url=redis_server.url, namespace=small), vllm_catalog())
    exporter = Exporter(reader, port=0, window=10, summary=VLLM_FLEET_SUMMARY, namespaces=[small, large])
    exporter.start()
    page = None
    try:
        page = Page(exporter)
        options = page.wait(
            "the picker",
            "const p = document.getElementById('ns-pick');"
            " return !p.hidden && [...p.options].map(o => o.value)",
            20,
        )
        assert options == sorted([small, large])
        first = sorted([small, large])[0]
        engines = {small: "2 / 2", large: "3 / 3"}
        page.wait(
            "the first namespace",
            f"return document.getElementById('c-engines').textContent === {engines[first]!r}",
            20,
        )
        assert page.js("return new URLSearchParams(location.search).get('namespace')") == first
        other = large if first == small else small
        page.js(
            f"const p = document.getElementById('ns-pick'); p.value = {other!r};"
            " p.dispatchEvent(new Event('change'))"
        )
        page.wait(
            "the other namespace",
            f"return document.getElementById('c-engines').textContent === {engines[other]!r}",
            20,
        )
        assert page.js("return new URLSearchParams(location.search).get('namespace')") == other
        assert len(page.table("rows")) == int(engines[other][0])
        # A page opened on ?namespace= shows that one; one not served says so.
        page.b.get(exporter.url + f"/?namespace={other}")
        page.wait(
            "?namespace=",
            f"return document.getElementById('c-engines').textContent === {engines[other]!r}",
            20,
        )
        page.b.get(exporter.url + "/?namespace=elsewhere")
        page.wait(
            "a namespace that left is replaced",
            f"return document.getElementById('c-engines').textContent === {engines[first]!r}",
            20,
        )
    finally:
        if page is not None:
            page.close()
        exporter.close()
        for proc in fleets:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)


def _page_exporter(config: StatsConfig) -> Exporter:
    """An exporter of *config*'s namespace as ``redis-stats exporter`` serves the page (a 10 s window)."""
    reader = StatsReader(config, vllm_catalog())
    return Exporter(reader, port=0, window=10, summary=VLLM_FLEET_SUMMARY, history=VLLM_PAGE_HISTORY).start()


def _recording_writer(
    config: StatsConfig, engines: list[int], role: str, *, start: bool = True
) -> StatsWriter:
    """A writer of *engines*, each with a queue of 1 and KV 30 %, flushed once."""
    w = StatsWriter(config, vllm_catalog(), engines=engines, role=role, start=start)
    recorder = VllmRecorder(w, page_fleet.MODEL, engines)
    for e in engines:
        recorder.record(scheduler(running=2, waiting=1, kv=0.3), iteration(generation=10), engine_idx=e)
    assert w.flush()
    return w


OUTAGE_ROWS = (
    "return Array.from(document.querySelectorAll('#out-rows tr')).filter(r => r.cells.length === 5)"
    ".map(r => Array.from(r.cells).map(c => c.textContent))"
)


@pytest.mark.redis_server
@pytest.mark.slow
def test_a_reload_keeps_the_engines_charts_and_the_outages(redis_server, namespace):
    """Before, the engines' charts under "needs attention" and the list of outages were the page's
    own: a reload started both again, and an engine that went down and came back before the reload
    left the list. The exporter keeps them from its reads (``/history``): right after a reload each
    engine drawn has its chart from before the reload, and the outage is listed with its times."""
    if why := browser.missing():
        pytest.skip(why)
    config = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.25, stale_after=2.0)
    writers = [_recording_writer(config, [0, 1], "live")]
    first = _recording_writer(config, [2], "before")
    exporter = _page_exporter(config)
    page = Page(exporter)
    try:
        page.wait("a first poll", "return (window.__renders || []).length >= 1", 20)
        time.sleep(6)  # a few points of history (one every 2 s)
        went = time.time()
        first.close()  # a clean exit: DOWN at once
        page.wait("engine 2 down", OUTAGE_ROWS + ".some(r => r[0] === '2')", 20)
        time.sleep(3)
        writers.append(_recording_writer(config, [2], "after"))
        page.wait("engine 2 back", OUTAGE_ROWS + ".some(r => r[0] === '2' && r[2] !== 'still down')", 20)
        reloaded = time.time()
        page.b.get(exporter.url + "/")
        page.wait(
            "the first render after the reload, its engines' history asked",
            "return (window.__renders || []).length >= 1 && window.__engineSeeded >= 3",
            10,
        )
        outages = page.js(OUTAGE_ROWS)
        oldest = page.js("return [0, 1, 2].map(e => (engHist.get(e) || [[Infinity]])[0][0])")
        drawn = page.js(
            "return Array.from(document.querySelectorAll('#ch-att path'))"
            ".map(p => p.getAttribute('d').split('L').length)"
        )
        polls = len(page.renders())
    finally:
        page.close()
        exporter.close()
        for w in writers:
            w.close()
    two = next((r for r in outages if r[0] == "2"), None)
    assert two is not None and two[2] != "still down", outages  # listed, with when it was back
    assert abs(_clock_seconds(two[1]) - _clock_seconds(went)) <= 1, (two, went)
    # Each engine's chart starts before the reload: the exporter's points, then the page's polls.
    assert all(t < reloaded - 5 for t in oldest), (oldest, reloaded)
    assert polls <= 3 and len(drawn) == 3 and min(drawn) >= 5, (polls, drawn)


def _library_catalog(help_text: str = "Requests served.") -> Catalog:
    """A namespace's own families, as an application using the library defines them."""
    cat = Catalog()
    cat.counter("requests", help_text, labels=["route"])
    cat.gauge("queue_depth", "Requests queued now.")
    cat.histogram("latency_seconds", "Time to serve a request.", buckets=[0.1, 0.5, 1.0])
    return cat


def _library_fleet(config: StatsConfig, route: str = "/a", **kw: Any) -> StatsWriter:
    """Engines 0-2 of a library namespace: requests 7, 11 and 1 (engine 0's over two routes), engine
    0's queue 3 and two latencies (0.2 s and 0.4 s)."""
    writer = StatsWriter(
        config,
        kw.pop("catalog", None) or _library_catalog(),
        engines=[0, 1, 2],
        start=kw.pop("start", False),
        **kw,
    )
    requests = writer.metric("requests")
    requests.labels(0, route=route).inc(5)
    requests.labels(0, route="/b").inc(2)
    requests.labels(1, route="/b").inc(11)
    requests.labels(2, route="/b").inc(1)
    writer.metric("queue_depth").labels(0).set(3)
    for v in (0.2, 0.4):
        writer.metric("latency_seconds").labels(0).observe(v)
    assert writer.flush()
    return writer


@pytest.mark.redis_server
@pytest.mark.slow
def test_a_namespace_written_by_the_library_shows_its_own_families(redis_server, namespace):
    """Before, a namespace written by the library (not vLLM) showed nothing of its own families:
    vLLM's cards said "measuring…" for ever and the table was dashes. Its catalogue's families are
    listed now, each with its kind, labels, help and total (a counter's series added up, a gauge's
    current sum, a histogram's observations), and per engine; the vLLM cards and charts are not
    shown for it."""
    if why := browser.missing():
        pytest.skip(why)
    config = StatsConfig(url=redis_server.url, namespace=namespace, endpoint="api-0.shop:8080")
    writer = _library_fleet(config, start=True)
    exporter = _page_exporter(config)
    page = Page(exporter)
    try:
        families = page.wait(
            "the families",
            "return document.getElementById('fam').open"
            " && document.querySelectorAll('#fam-rows tr.fam').length"
            " && Array.from(document.querySelectorAll('#fam-rows tr'))"
            ".map(r => Array.from(r.cells).map(c => c.textContent))",
            20,
        )
        cards_shown = page.js(
            "return Array.from(document.querySelectorAll('.card'))"
            ".filter(c => c.offsetParent !== null).length"
        )
        charts_shown = page.js("return document.querySelector('.charts').offsetParent !== null")
        page.js("document.querySelector('#fam-rows tr[data-name=requests]').click(); return 1")
        per_engine = page.table("fam-engine-rows")
        rows = page.table("rows")
        page.screenshot("live-page-library.png")
    finally:
        page.close()
        exporter.close()
        writer.close()
    assert [r[:4] + r[5:6] for r in families] == [
        ["latency_seconds", "histogram", DASH, "2", "1"],
        ["queue_depth", "gauge", DASH, "3", "1"],
        ["requests", "counter", "route", "19", "3"],
    ], families
    # Per second over the window (nothing new: 0), or none yet; a gauge has no rate.
    assert families[0][4] in {DASH, "0"} and families[1][4] == DASH and families[2][4] in {DASH, "0"}
    assert families[2][6] == "Requests served."
    assert [r[:4] for r in per_engine] == [
        ["1", "up", "api-0.shop:8080 · " + rows[0][2], "11"],
        ["0", "up", "api-0.shop:8080 · " + rows[0][2], "7"],
        ["2", "up", "api-0.shop:8080 · " + rows[0][2], "1"],
    ], per_engine
    assert cards_shown == 1 and not charts_shown  # engines up / total; no vLLM figure
    assert [r[:4] for r in rows] == [[str(e), "api-0.shop:8080", rows[0][2], "up"] for e in range(3)], rows


HOSTILE = "<img src=x onerror=\"window.__pwned='{}'\">"


@pytest.mark.redis_server
@pytest.mark.slow
def test_hostile_values_from_the_store_are_shown_as_text_never_run(redis_server, namespace):
    """Whatever the writers stored — a writer id (the host the page shows), a label value, a help
    text, an endpoint written by hand into a writer's hash — the page shows it as text: no element
    made of it, no script run (the page writes every such value escaped or as textContent)."""
    if why := browser.missing():
        pytest.skip(why)
    config = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.25, stale_after=2.0)
    host_id = HOSTILE.format("host") + ":1:api:ab12cd"
    library = _library_fleet(
        config,
        route=HOSTILE.format("label"),
        catalog=_library_catalog(HOSTILE.format("help")),
        writer_id=host_id,
        start=True,  # flushing: up for the whole test
    )
    vllm = StatsWriter(
        config, vllm_catalog(), engines=[3], start=False, writer_id=HOSTILE.format("vllm") + ":2:x:ef"
    )
    VllmRecorder(vllm, HOSTILE.format("model"), [3]).record(
        scheduler(running=1, waiting=1, kv=0.2), iteration(generation=5), engine_idx=3
    )
    assert vllm.flush()
    # An endpoint no config accepts, written by hand: not served (a reader drops it), never run.
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.hset(Keys(namespace).writer_stats(host_id), "endpoint", HOSTILE.format("endpoint"))
    client.close()
    vllm.close()  # engine 3 goes down: an outage whose host is hostile too
    exporter = _page_exporter(config)
    page = Page(exporter)
    try:
        page.wait("a first poll", "return (window.__renders || []).length >= 2", 20)
        page.js(
            "const d = document.getElementById('fam'); d.open = true;"
            " d.dispatchEvent(new Event('toggle')); return 1"
        )
        page.wait("the families", "return document.querySelectorAll('#fam-rows tr.fam').length > 3", 20)
        page.js("document.querySelector('#fam-rows tr[data-name=requests]').click(); return 1")
        time.sleep(1)
        pwned = page.js("return window.__pwned === undefined ? null : window.__pwned")
        images = page.js("return document.querySelectorAll('img').length")
        hosts = page.js(
            "return Array.from(document.querySelectorAll('#rows td.host')).map(c => c.textContent)"
        )
        endpoints = page.js(
            "return Array.from(document.querySelectorAll('#rows td.ep')).map(c => c.textContent)"
        )
        helps = page.js(
            "return Array.from(document.querySelectorAll('#fam-rows td.help')).map(c => c.textContent)"
        )
        model = page.text("h-model")
        outage = page.js(OUTAGE_ROWS)
        where = page.js("return Array.from(document.querySelectorAll('#rows td.host')).map(c => c.title)")
    finally:
        page.close()
        exporter.close()
        library.close()
    assert pwned is None and images == 0, (pwned, images)
    assert hosts == [HOSTILE.format("host")] * 3 + [HOSTILE.format("vllm")], hosts
    assert endpoints == [DASH] * 4, endpoints  # the hand-written endpoint is no endpoint: not shown
    assert HOSTILE.format("help") in helps, helps
    assert model == HOSTILE.format("model")
    assert [r[0] for r in outage] == ["3"] and outage[0][4] == HOSTILE.format("vllm"), outage
    assert where[0] == host_id, where


@pytest.mark.redis_server
@pytest.mark.slow
def test_a_fresh_exporters_window_is_measured_from_its_start(fleet_page):
    """Before, a page opened a few seconds after the exporter started said "measuring…" on its
    first poll whatever the fleet's age: the window started with the page's first request. The
    exporter of one namespace starts measuring when it starts: the first poll has rates."""
    page = fleet_page(2, warm=False, wait=3.0)
    page.wait("a first poll", "return (window.__renders || []).length >= 1", 20)
    first = page.renders()[0]
    assert first["window"] is not None and first["blank"] == [], first
    assert not page.js("return document.getElementById('c-gen').classList.contains('measuring')")
    assert page.js("return window.__seeded") >= 1  # and the charts start from its first reads


@pytest.mark.slow
def test_while_the_window_measures_latencies_show_at_once_and_the_page_says_when_rates_come(
    config, fake_client
):
    """An exporter whose window was dropped (nobody asked for a minute) reads the fleet anew: until
    a second read, no rate. What the store already holds is shown at once — each engine's TTFT and
    ITL p99 since it started, said so — and the page says precisely what it waits for."""
    if why := browser.missing():
        pytest.skip(why)
    t0 = 1_800_000_000.0
    histogram = {
        "vllm:time_to_first_token_seconds": [{"labels": {}, "value": {"p50": 0.2, "p99": 0.9}}],
        "vllm:inter_token_latency_seconds": [{"labels": {}, "value": {"p50": 0.02, "p99": 0.04}}],
    }
    doc: dict[str, Any] = {
        "time": t0 + 1,
        "window": {
            "seconds": None,
            "requested_seconds": 30,
            "first_read": t0,
            "min_seconds": 3,
            "engines": {},
        },
        "engines": {},
    }
    for e in range(2):
        doc["engines"][str(e)] = {
            "up": True,
            "state": "up",
            "age_seconds": 0.5,
            "gauges": {},
            "histograms": histogram,
        }
        doc["window"]["engines"][str(e)] = {"seconds": None, "rates": {}, "histograms": {}}
    exporter = Exporter(StatsReader(config, vllm_catalog(), client=fake_client()), port=0).start()
    b = browser.Browser()
    try:
        b.get(exporter.url + "/?namespace=elsewhere")  # its own polls fail: only this document
        got = b.js(
            f"update({json.dumps(doc)}); return ['c-gen', 'c-ttft', 'c-itl', 'k-ttft', 'measuring-note']"
            f".map(id => $(id).textContent).concat([clock({t0 + 3}), clock({t0})])"
        )
        cells = b.js(
            "return Array.from(document.querySelectorAll('#rows tr')[0].cells)"
            ".map(c => [c.textContent, c.className])"
        )
    finally:
        b.close()
        exporter.close()
    gen, ttft, itl, label, note, ready, first = got
    assert gen == "measuring…" and ttft == "0.9 s" and itl == "0.04 s" and label == " · since start", got
    assert (
        f"tokens/s over the window from {ready}" in note
        and f"first read of this fleet was at {first}" in note
    )
    assert cells[11] == ["0.9 s", "vllm since"], cells  # TTFT p99: dim, "since the engine started"


@pytest.mark.redis_server
@pytest.mark.slow
def test_the_top_tenants_are_shown_with_usage_on_as_text(redis_server, namespace, tmp_path):
    """With ``--usage`` the page shows the usage ledger's top tenants (most generated tokens
    first); a tenant's name came from a client and is shown as text, never run; without it no
    panel is shown."""
    if why := browser.missing():
        pytest.skip(why)
    from redis_stats.usage import Usage, UsageRecorder

    config = StatsConfig(url=redis_server.url, namespace=namespace)
    writer = _recording_writer(config, [0], "api", start=False)
    usage = UsageRecorder(writer)
    for i, tenant in enumerate(["small", HOSTILE.format("tenant"), "big"]):
        usage.record(Usage(tenant=tenant, adapter=None, model="m", prompt_tokens=10, generation_tokens=10**i))
    assert writer.flush()
    reader = StatsReader(config, vllm_catalog())
    on = Exporter(reader, port=0, window=10, usage=True, insecure_private_views=True).start()
    off = _page_exporter(config)
    pages = [Page(on), Page(off)]
    try:
        rows = pages[0].wait(
            "the top tenants",
            "return document.querySelectorAll('#usage-rows tr').length === 3"
            " && Array.from(document.querySelectorAll('#usage-rows tr'))"
            ".map(r => Array.from(r.cells).map(c => c.textContent))",
            20,
        )
        pwned = pages[0].js("return window.__pwned === undefined ? null : window.__pwned")
        pages[1].wait("a first poll", "return (window.__renders || []).length >= 1", 20)
        time.sleep(0.5)
        hidden = pages[1].js("return document.getElementById('usage-panel').style.display")
    finally:
        for page in pages:
            page.close()
        on.close()
        off.close()
        writer.close()
    assert [r[0] for r in rows] == ["big", HOSTILE.format("tenant"), "small"], rows
    assert rows[0][4] == "100" and pwned is None
    assert hidden == "none"
