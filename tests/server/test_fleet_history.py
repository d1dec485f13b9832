"""``GET /history``: the fleet's recent history the exporter keeps for the live page's charts.

On first open the page's five fleet charts were empty until it had polled for a while, although
the exporter had been reading the fleet all along for ``/snapshot``'s window. Each snapshot that
window takes now also gives a point of the charts' figures (exact here against a fleet whose
numbers are set), kept for 10 minutes in a bound of points and bytes whatever the fleet's size,
dropped with the window when nobody asks, never read from Redis on its own; and an outage or a
Redis restarted empty leaves a gap, not a spike.
"""

from __future__ import annotations

import ast
import gc
import itertools
import json
import time
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY
from redis_stats.server import Exporter
from redis_stats.server.options import PER_ENGINE
from redis_stats.server.states.fleet_history import MAX_POINTS, FleetHistory, fleet_point
from redis_stats.server.states.window import recent_document
from redis_stats.snapshot import Snapshot
from redis_stats.tools.embedded import EmbeddedRedis
from tests.conftest import ROOT
from tests.server import states
from tests.server.set_fleet import (
    CAT,
    EXPECTED,
    GEN,
    NAMES,
    TTFT,
    WAITING,
    engine,
    figures,
    fleet_at,
    snap,
)


def test_a_point_holds_the_charts_figures_of_the_up_engines_exactly():
    earlier, now = fleet_at(1000.0)
    assert figures(fleet_point(now, earlier, VLLM_PAGE_HISTORY)) == EXPECTED


def test_without_a_window_the_rates_and_p99_are_none_and_the_gauges_are_there():
    _earlier, now = fleet_at(1000.0)
    got = figures(fleet_point(now, None, VLLM_PAGE_HISTORY))
    windowed = [n for n in NAMES if "per_second" in n or "p99" in n]
    assert {n: got[n] for n in windowed} == dict.fromkeys(windowed)
    assert {n: got[n] for n in NAMES if n not in windowed} == {
        n: v for n, v in EXPECTED.items() if n not in windowed
    }


def test_no_engine_up_gives_no_figure_rather_than_zeros():
    """A namespace restarted empty (Redis lost it), or every engine down: no figure is invented."""
    got = figures(fleet_point(snap(20.0), snap(10.0), VLLM_PAGE_HISTORY))
    assert got == dict.fromkeys(NAMES)
    down = engine(0, up=False, counters={(GEN, "m"): 5.0}, gauges={(WAITING, "m"): 4})
    assert figures(fleet_point(snap(20.0, down), snap(10.0, down), VLLM_PAGE_HISTORY)) == dict.fromkeys(NAMES)


def test_an_engine_the_windows_first_read_lacks_is_not_measured_rather_than_a_spike():
    """Redis restarted empty: a read found no engine, then the writers stored their whole totals
    again. Measured against that read, an engine's whole total (thousands of tokens) was its
    increase over the window: 17 times the true throughput on the page for a window, and kept on
    its 10-minute chart. An engine the window's first read does not hold is not measured yet, in
    /snapshot and in the history alike (the others are, as before); when none is, no rate."""
    before = snap(10.0, engine(0, counters={(GEN, "m"): 100.0}))
    after = snap(20.0, engine(0, counters={(GEN, "m"): 200.0}), engine(1, counters={(GEN, "m"): 1e6}))
    doc = recent_document(after, before, requested=30, summary=VLLM_FLEET_SUMMARY)
    assert (
        doc["fleet"]["rates"][GEN] == 10.0 and doc["fleet"]["summary"]["generation_tokens_per_second"] == 10.0
    )
    assert doc["window"]["engines"] == {
        "0": {
            "seconds": 10.0,
            "rates": {GEN: [{"labels": {"model_name": "m"}, "per_second": 10.0}]},
            "histograms": {},
        },
        "1": {"seconds": None, "rates": {}, "histograms": {}},
    }
    assert figures(fleet_point(after, before, VLLM_PAGE_HISTORY))["generation_tokens_per_second"] == 10.0
    # Every engine back at once (the read before found none): no rate at all, not 0 and not 1e6/s.
    doc = recent_document(after, snap(10.0), requested=30, summary=VLLM_FLEET_SUMMARY)
    assert doc["window"]["seconds"] == 10.0 and doc["fleet"]["rates"][GEN] is None
    assert doc["fleet"]["summary"]["generation_tokens_per_second"] is None
    got = figures(fleet_point(after, snap(10.0), VLLM_PAGE_HISTORY))
    assert got["generation_tokens_per_second"] is None and got["ttft_p99_worst"] is None
    # An empty namespace measured over a window has a throughput: none.
    assert recent_document(snap(20.0), snap(10.0), requested=30)["fleet"]["rates"][GEN] == 0.0


class SetFleet:
    """A reader's ``snapshot``: :func:`fleet_at`'s fleet as read at each of *times* in turn (the
    last one again and again after), or a ConnectionError for a time that is None (Redis away)."""

    def __init__(self, times: list[float | None]) -> None:
        self.times = times
        self.reads = 0

    def __call__(self, part: Any = None) -> Snapshot:
        t = self.times[min(self.reads, len(self.times) - 1)]
        self.reads += 1
        if t is None:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
        return fleet_at(t)[1]


def get(exporter: Exporter, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(exporter.url + path, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def set_exporter(config, fake_client) -> Iterator[Any]:
    """``make(times, **options)`` -> an exporter whose reads return :func:`fleet_at`'s fleet."""
    made: list[Exporter] = []

    def make(reads: Any, **options: Any) -> Exporter:
        reader = StatsReader(config, CAT, client=fake_client())
        reader.snapshot = reads  # type: ignore[method-assign]
        options = {"window": 30, "summary": VLLM_FLEET_SUMMARY, "history": VLLM_PAGE_HISTORY, **options}
        exporter = Exporter(reader, port=0, **options).start()
        made.append(exporter)
        return exporter

    yield make
    for exporter in made:
        exporter.close()


def test_history_over_http_has_a_point_per_window_snapshot_exactly(set_exporter, namespace):
    """Each /snapshot read a point (spaced at least 2 s, the page's poll), oldest first, each the
    figures of its read against the window's baseline; described; what it reads named."""
    reads = [fleet_at(1000.0)[0], fleet_at(1000.0)[1], fleet_at(1001.0)[1], fleet_at(1020.0)[1]]
    exporter = set_exporter(lambda part=None: reads.pop(0) if len(reads) > 1 else reads[0])
    for _ in range(4):
        assert get(exporter, "/snapshot?buckets=0")[0] == 200
    status, doc = get(exporter, "/history")
    assert status == 200
    assert doc["source"] == {"namespace": namespace, "redis": "redis://127.0.0.1:1/0"}
    assert doc["seconds"] == 600 and doc["window_seconds"] == 30 and doc["sampling"] is True
    assert doc["spacing_seconds"] == max(30 / 6 * 0.9, 600 / MAX_POINTS)
    assert doc["figures"]["ttft_p99_median"] == {"metric": TTFT, "engine": "p99", "fleet": "median"}
    points = doc["points"]
    # 990 (no window yet), 1000 (against 990: the fleet of fleet_at), 1001 too soon, 1020 (against 990:
    # 30 s, every counter's increase the same as in 10 s: a third of the rates).
    assert points["time"] == [990.0, 1000.0, 1020.0]
    first = {n: points[n][0] for n in NAMES}
    assert first["generation_tokens_per_second"] is None  # no window yet
    assert first["requests_waiting"] is None  # that read holds no queue
    assert {n: points[n][1] for n in NAMES} == EXPECTED
    assert points["generation_tokens_per_second"][2] == 60.0 / 3
    assert points["requests_waiting"][2] == 10.0


def test_history_answers_from_memory_while_redis_is_away_and_keeps_no_outage_rate(set_exporter):
    """Redis stopped mid-history: /snapshot is 503, /history 200 with what it had, nothing read;
    the first point after an outage longer than the window has no rates (no baseline within the
    window) rather than a rate over the outage."""
    reads = SetFleet([1000.0, 1010.0, None, None, 1100.0])
    exporter = set_exporter(reads)
    for _ in range(2):
        assert get(exporter, "/snapshot")[0] == 200
    kept = get(exporter, "/history")[1]["points"]
    for _ in range(2):
        assert get(exporter, "/snapshot")[0] == 503
    reads_before = reads.reads
    assert get(exporter, "/history")[1]["points"] == kept  # the same points, and
    assert reads.reads == reads_before  # no read of its own
    assert get(exporter, "/snapshot")[0] == 200
    points = get(exporter, "/history")[1]["points"]
    assert points["time"] == [*kept["time"], 1100.0]
    assert points["generation_tokens_per_second"][-1] is None and points["requests_waiting"][-1] == 10.0


def test_history_is_bounded_in_points_and_bytes_whatever_the_window_and_the_fleet():
    """A short --window samples often: still at most MAX_POINTS over 10 minutes. A point is a few
    floats: the same bytes at 2 engines and at 1,024, and the estimate is what tracemalloc sees."""
    small = FleetHistory(VLLM_PAGE_HISTORY, spacing=0.05)
    earlier, now = fleet_at(1000.0)
    for i in range(5000):  # an hour and a half of reads every second
        small.add(snap(1000.0 + i, *now.engines.values()), earlier)
    times = small.columns()["time"]
    assert len(times) <= MAX_POINTS + 1 and times[-1] - times[0] <= 600
    assert min(b - a for a, b in itertools.pairwise(times)) >= 600 / MAX_POINTS

    gc.collect()
    tracemalloc.start()
    try:
        held_before = tracemalloc.get_traced_memory()[0]
        full = FleetHistory(VLLM_PAGE_HISTORY, spacing=0.05)
        for i in range(2000):
            full.add(snap(1000.0 + i, *now.engines.values()), earlier)
        gc.collect()  # the snapshots read meanwhile, gone
        held = tracemalloc.get_traced_memory()[0] - held_before
    finally:
        tracemalloc.stop()
    assert len(full) == MAX_POINTS + 1 and 0.7 * held <= full.bytes <= 1.4 * held, (full.bytes, held)

    # 1,024 engines: the fleet's few floats a point, and each engine's three float32 figures.
    thousand = [engine(e, counters={(GEN, "m"): 10.0 * e}, gauges={(WAITING, "m"): 1}) for e in range(1024)]
    fleet_only = {n: f for n, f in VLLM_PAGE_HISTORY.items() if f[2] != PER_ENGINE}
    big, few = (FleetHistory(fleet_only, spacing=0.05) for _ in range(2))
    for i in range(10):
        big.add(snap(1000.0 + 2 * i, *thousand), snap(999.0, *thousand))
        few.add(snap(1000.0 + 2 * i, *thousand[:2]), snap(999.0, *thousand[:2]))
    assert len(big) == len(few) == 10 and big.bytes == few.bytes
    assert full.bytes < 160 * 1024  # per namespace: 64 namespaces of 3 engines keep under 10 MiB


def test_history_counts_in_the_view_budget_and_goes_with_the_window_when_nobody_asks(set_exporter):
    reads = SetFleet([1000.0, 1010.0, 1020.0])
    exporter = set_exporter(reads, view_idle=0.5, self_metrics=True)
    for _ in range(3):
        get(exporter, "/snapshot")
    window = states.window(exporter)
    assert len(window.history) == 3
    assert (
        exporter.app.kept.bytes_by_kind()["window"]
        == window.ring.bytes + window.history.bytes + window.outages.bytes
    )
    time.sleep(0.7)
    exporter.app.kept.sweep()  # the exporter's upkeep, every 10 s
    status, doc = get(exporter, "/history")
    assert status == 200 and doc["points"]["time"] == [] and doc["sampling"] is False


def test_a_bad_history_kind_is_refused_naming_it(config, fake_client):
    reader = StatsReader(config, CAT, client=fake_client())
    with pytest.raises(
        ValueError, match=r"'q' \(vllm:x\): over engines 'avg' is not one of sum, mean, max, median"
    ):
        Exporter(reader, port=0, history={"q": ("vllm:x", "sum", "avg")})


def test_every_vllm_view_keeps_the_pages_history():
    """Every place that builds an exporter over the vLLM catalogue passes the page's figures."""
    for path in (ROOT / "redis_stats").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Exporter":
                assert "history" in {k.arg for k in node.keywords}, f"{path}:{node.lineno}"


@pytest.mark.slow
def test_redis_stopped_then_restarted_empty_leaves_a_gap_not_a_spike(namespace):
    """A real Redis under a real writer (two engines, 40 generation tokens a second in all), and a
    client asking /snapshot: Redis stopped (its data lost), /history still answers; started again
    empty, the writer stores its whole totals again. Before, the rates measured against the read
    that found no engine counted those totals as the window's increase: 676 tokens/s, then 358,
    252, 199, on the page and in its history for a window."""
    server = EmbeddedRedis().start()
    config = StatsConfig(url=server.url, namespace=namespace, flush_interval=0.2, stale_after=3)
    writer = StatsWriter(config, CAT, engines=[0, 1])
    tokens = [writer.counter(GEN).labels(engine=e, model_name="m") for e in (0, 1)]
    exporter = Exporter(
        StatsReader(config, CAT), port=0, window=3, summary=VLLM_FLEET_SUMMARY, history=VLLM_PAGE_HISTORY
    ).start()
    summaries: list[float] = []

    def run(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for t in tokens:
                t.inc(10)  # 20 tokens a second each, asked every 0.5 s
            status, doc = get(exporter, "/snapshot?buckets=0")
            if status == 200 and doc["fleet"]["summary"]["generation_tokens_per_second"] is not None:
                summaries.append(doc["fleet"]["summary"]["generation_tokens_per_second"])
            time.sleep(0.5)

    try:
        run(5)
        before = get(exporter, "/history")[1]["points"]
        server.stop()  # its data lost
        run(3)
        assert get(exporter, "/history")[1]["points"] == before
        server.start()
        run(7)
        points = get(exporter, "/history")[1]["points"]
    finally:
        exporter.close()
        writer.close()
        server.close()
    rates = [r for r in points["generation_tokens_per_second"] if r is not None]
    assert len(points["time"]) >= len(before["time"]) + 2 and len(rates) >= 3, points
    assert max(rates) < 60 and max(summaries) < 60, (rates, summaries)  # 40 a second, give or take
    assert min(rates) > 20, rates
