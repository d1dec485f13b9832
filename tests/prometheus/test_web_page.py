"""The exporter's live page (``/``): self-contained, and in a real headless Chromium the table fills
and the charts draw from ``/snapshot``."""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.prometheus.exporter import Exporter
from redis_stats.tools.simulate import LoadProfile, SimulatedApiServer
from tests import browser


def test_the_page_is_served_at_root_and_loads_nothing_from_elsewhere(config, fake_client):
    exporter = Exporter(StatsReader(config, vllm_catalog(), client=fake_client()), port=0).start()
    try:
        with urllib.request.urlopen(exporter.url + "/", timeout=10) as resp:
            content_type, page = resp.headers["Content-Type"], resp.read().decode()
    finally:
        exporter.close()
    assert content_type == "text/html; charset=utf-8"
    assert 'fetch("snapshot"' in page
    # Self-contained: no external script, stylesheet, font or image.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page


@pytest.fixture
def live_fleet(redis_server, namespace):
    """Two engines with simulated vLLM load, flushed every 0.2 s, behind an exporter."""
    config = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.2)
    writer = StatsWriter(config, vllm_catalog(), engines=[0, 1])
    recorder = VllmRecorder(writer, "demo-model", [0, 1])
    stop = threading.Event()
    sims = [SimulatedApiServer(recorder, e, LoadProfile(arrivals_per_s=4.0 + 4 * e), seed=e) for e in (0, 1)]

    def run() -> None:
        while not stop.is_set():
            for sim in sims:
                sim.step()
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    exporter = Exporter(StatsReader(config, vllm_catalog()), port=0).start()
    yield exporter
    exporter.close()
    stop.set()
    thread.join(5)
    writer.close()


@pytest.mark.redis_server
@pytest.mark.slow
def test_in_headless_chromium_the_table_fills_and_the_charts_draw(live_fleet, tmp_path):
    why = browser.missing()
    if why:
        pytest.skip(why)
    b = browser.Browser()
    try:
        b.get(live_fleet.url + "/")
        seconds = float(os.environ.get("REDIS_STATS_PAGE_SECONDS", "9"))
        time.sleep(seconds)  # real time: the page polls /snapshot every 2 s
        rows = b.js(
            "return Array.from(document.querySelectorAll('#rows tr'))"
            ".map(r => Array.from(r.cells).map(c => c.textContent))"
        )
        paths = b.js(
            "return Array.from(document.querySelectorAll('#ch-gen path')).map(p => p.getAttribute('d'))"
        )
        status = b.js("return document.getElementById('status').textContent")
        png = b.screenshot()
    finally:
        b.close()
    (tmp_path / "page.png").write_bytes(png)
    if os.environ.get("REDIS_STATS_SCREENSHOT"):  # how docs/img/live-page.png is made
        Path(os.environ["REDIS_STATS_SCREENSHOT"]).write_bytes(png)
    assert status.startswith("updated "), status
    assert [r[:2] for r in rows] == [["0", "up"], ["1", "up"]], rows
    for row in rows:
        assert float(row[4]) > 0, row  # generation tokens/s over the last poll
        assert row[9].endswith(" ms") and row[11].endswith(" ms"), row  # TTFT p50, ITL p50
    # One line per engine, each through several polls (a move, then lines).
    assert len(paths) == 2 and all(p.startswith("M") and p.count("L") >= 2 for p in paths), paths
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


@pytest.mark.slow
def test_in_headless_chromium_the_page_says_when_redis_is_unavailable(namespace):
    why = browser.missing()
    if why:
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
