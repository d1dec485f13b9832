"""What the exporter keeps and serves for the live page (#50 item 3), without a browser: the
thresholds an operator sets (``--page-threshold``), each engine's history and the outages kept in
bytes a thousand engines cannot grow past, ``/history?engine=``, ``/families`` of a library
namespace, and where each engine runs in ``/snapshot``.
"""

from __future__ import annotations

import itertools
import json
import math
import urllib.error
import urllib.request
from typing import Any

import pytest
from click.testing import CliRunner

from redis_stats import Catalog, StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY
from redis_stats.server import Exporter
from redis_stats.server.states.fleet_history import HISTORY_SECONDS, MAX_POINTS, FleetHistory
from redis_stats.server.states.outages import OutageTrace
from redis_stats.server.thresholds import page_thresholds, parse_thresholds
from redis_stats.server.views.families import families_document
from redis_stats.server.views.page import live_page
from redis_stats.tools.cli import main
from tests.server.set_fleet import CAT, KV, TTFT, WAITING, engine, fleet_at, hist, snap

ENGINE_FIGURES = ["engine_requests_waiting", "engine_kv_cache_usage", "engine_ttft_p99"]


# -- thresholds -------------------------------------------------------------------------------


def test_thresholds_read_as_the_operator_writes_them():
    assert parse_thresholds(["queue=10,ttft_p99=2s", "kv=90%", "itl_p99=100ms"]) == {
        "queue": 10.0,
        "ttft_p99": 2.0,
        "kv": 0.9,
        "itl_p99": pytest.approx(0.1),
    }
    assert parse_thresholds(["ttft_p99=relative", " kv = 0.95 ,"]) == {"ttft_p99": "relative", "kv": 0.95}
    shown = page_thresholds({"ttft_p99": 2.0, "kv": "relative"})
    assert shown["ttft_p99"] == {"value": 2.0, "relative": False, "set": True}
    assert shown["kv"] == {"value": 0.9, "relative": True, "set": True}  # its floor: the default
    assert shown["queue"] == {"value": 10.0, "relative": False, "set": False}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttf_p99=2s", "'ttf_p99=2s': unknown threshold 'ttf_p99' (did you mean ttft_p99?): one of queue"),
        ("kv=1.5", "'kv=1.5': '1.5' is not a share of the KV cache used, above 0 and at most 1"),
        ("ttft_p99=2x", "'2x' is not a number of seconds above 0 (ttft_p99=2s, ttft_p99=500ms"),
        ("queue=-1", "'-1' is not a number of requests waiting >= 0 (queue=10), nor 'relative'"),
        ("itl_p99=nan", "'nan' is not a number of seconds above 0"),
        ("ttft_p99=inf", "'inf' is not a number of seconds above 0"),
        ("queue", "'queue': write NAME=VALUE, e.g. queue=10,ttft_p99=2s,kv=0.9"),
        ("queue=1,queue=2", "'queue=2': queue is given twice; give it once"),
    ],
)
def test_a_bad_threshold_is_refused_naming_it_why_and_what_to_write(text, message):
    with pytest.raises(ValueError) as err:
        parse_thresholds([text])
    assert message in str(err.value)
    # The command says it as a usage error of the option, before it connects to anything.
    result = CliRunner().invoke(
        main, ["exporter", "--page-threshold", text, "--redis-url", "redis://127.0.0.1:1/0"]
    )
    assert result.exit_code == 2 and "--page-threshold" in result.output and message in result.output


def test_the_exporter_refuses_thresholds_it_cannot_show(config, fake_client):
    reader = StatsReader(config, CAT, client=fake_client())
    with pytest.raises(ValueError, match=r"page_thresholds kv=2: not a share of the KV cache"):
        Exporter(reader, port=0, page_thresholds={"kv": 2})
    with pytest.raises(ValueError, match=r"unknown threshold 'waiting' \(did you mean"):
        Exporter(reader, port=0, page_thresholds={"waiting": 10})


def test_the_page_carries_the_thresholds_as_data_that_cannot_end_its_script_block():
    page = live_page({"ttft_p99": 2.0, "kv": "relative"}).decode()
    start = page.index('<script id="settings" type="application/json">') + len(
        '<script id="settings" type="application/json">'
    )
    settings = json.loads(page[start : page.index("</script>", start)])
    assert settings["thresholds"]["ttft_p99"] == {"value": 2.0, "relative": False, "set": True}
    assert "<!--settings-->" not in page and live_page().startswith(b"<!doctype html>")


# -- each engine's history, in bytes a thousand engines cannot grow past -----------------------------


def test_each_engines_figures_are_kept_as_the_page_computes_them():
    earlier, now = fleet_at(1000.0)
    history = FleetHistory(VLLM_PAGE_HISTORY, spacing=2.0)
    history.add(now, earlier)
    series = history.engine_series([0, 1, 2, 3, 99])
    # Engine 0: queue 3, KV 25 %, TTFT p99 in (0.1, 0.5]; engine 1: queue 2 + 5, KV the larger of its
    # two series; engine 2 is down and 99 unknown: nothing; engine 3's queue is NaN: none.
    assert [series["0"][f][0] for f in ENGINE_FIGURES[:2]] == [3.0, 0.25]
    assert 0.1 < series["0"]["engine_ttft_p99"][0] <= 0.5
    assert [series["1"][f][0] for f in ENGINE_FIGURES[:2]] == [7.0, 0.75]
    assert series["2"] == series["99"] == {f: [None] for f in ENGINE_FIGURES}
    assert series["3"]["engine_requests_waiting"] == [None] and series["3"]["engine_kv_cache_usage"] == [0.5]
    assert set(history.columns()) == {"time", *(n for n in VLLM_PAGE_HISTORY if not n.startswith("engine_"))}


def _fleet(engines: int, t: float) -> Any:
    return snap(
        t,
        *(
            engine(
                e,
                gauges={(WAITING, "m"): e % 7, (KV, "m"): 0.5},
                histograms={(TTFT, "m"): hist(e, e, e, e)},
            )
            for e in range(engines)
        ),
    )


@pytest.mark.slow
def test_a_thousand_engines_history_is_bounded_in_bytes_and_keeps_the_newest():
    """1,024 engines sampled every 2 s for 11 minutes: at most 301 points over the last 10 minutes,
    3.7 MB by the estimate; in a budget too small for them the oldest points go first (the newest
    always stay), and a point whose engines alone are past the whole budget keeps the fleet's."""
    t0 = 1000.0
    full = FleetHistory(VLLM_PAGE_HISTORY, spacing=2.0)
    small = FleetHistory(VLLM_PAGE_HISTORY, spacing=2.0, max_bytes=1_000_000)
    tiny = FleetHistory(VLLM_PAGE_HISTORY, spacing=2.0, max_bytes=4_000)
    previous = _fleet(1024, t0 - 2)
    for i in range(330):
        now = snap(t0 + 2 * i, *previous.engines.values())
        for h in (full, small, tiny) if i >= 230 else (full,):
            h.add(now, previous)
        previous = now
    times = full.columns()["time"]
    assert len(times) == MAX_POINTS + 1 and times[-1] - times[0] == HISTORY_SECONDS
    assert 3.5e6 < full.bytes < 4.0e6, full.bytes  # 12 KB a point: three float32 per engine
    assert small.bytes <= 1_000_000 and small.columns()["time"][-1] == t0 + 2 * 329
    kept = len(small)
    assert 70 <= kept <= 85, kept  # a million bytes: about 80 points of 1,024 engines
    assert small.engine_series([5])["5"]["engine_requests_waiting"][-1] == 5.0
    # One point's engines are past 4 KB: the fleet's figures stay, each engine's do not.
    assert len(tiny) >= 1 and tiny.bytes <= 4_000 and tiny.engines_held() == 0
    assert tiny.columns()["requests_waiting"][-1] == sum(e % 7 for e in range(1024))


@pytest.mark.slow
def test_the_history_estimate_is_what_the_process_holds():
    import gc
    import tracemalloc

    previous = _fleet(256, 998.0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        history = FleetHistory(VLLM_PAGE_HISTORY, spacing=2.0)
        for i in range(20):
            history.add(snap(1000.0 + 2 * i, *previous.engines.values()), previous)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.8 * held <= history.bytes <= 1.25 * held, (history.bytes, held)


# -- the outages ------------------------------------------------------------------------------------


def test_outages_are_traced_from_each_read_kept_ten_minutes_and_bounded():
    trace = OutageTrace(600.0, most=5)
    up = [engine(e) for e in range(3)]
    trace.see(snap(100.0, *up))
    down_1 = engine(1, up=False)
    down_1.age, down_1.endpoint, down_1.writers = 4.0, "pod-1:8000", ("pod-1:7:api:ab",)
    trace.see(snap(110.0, up[0], down_1, up[2]))
    trace.see(snap(105.0, *up))  # an older read finishing late: ignored
    assert trace.document() == [
        {
            "engine": 1,
            "from": 106.0,
            "to": None,
            "gone": False,
            "endpoint": "pod-1:8000",
            "writers": ["pod-1:7:api:ab"],
        }
    ]
    trace.see(snap(120.0, *up))  # back
    trace.see(snap(130.0, up[0], up[1]))  # engine 2 never seen down, just gone: not an outage
    trace.see(snap(131.0, up[0], engine(1, up=False)))  # down again, then removed
    trace.see(snap(140.0, up[0]))
    doc = trace.document()
    assert [(o["engine"], o["to"], o["gone"]) for o in doc] == [(1, 140.0, True), (1, 120.0, False)]
    trace.see(snap(721.0, up[0]))  # ten minutes after the first one ended: it goes
    assert [o["to"] for o in trace.document()] == [140.0]
    for e in range(10):  # ten engines down at once, five kept: the oldest ended went first
        trace.see(snap(800.0 + e, *(engine(x, up=False) for x in range(e + 1))))
    assert len(trace) == 5 and trace.dropped >= 6
    trace.see(snap(10.0, up[0]))  # a clock gone back past the whole trace (another Redis): anew
    assert trace.document() == []


# -- over HTTP --------------------------------------------------------------------------------------


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def served(config, fake_client):
    """An exporter whose reads return fleet_at's fleet at 1000, 1010, ... in turn."""
    times = iter(range(1000, 10**6, 10))
    reader = StatsReader(config, CAT, client=fake_client())
    reader.snapshot = lambda part=None: fleet_at(float(next(times)))[1]  # type: ignore[method-assign]
    exporter = Exporter(reader, port=0, window=30, summary=VLLM_FLEET_SUMMARY, history=VLLM_PAGE_HISTORY)
    yield exporter.start()
    exporter.close()


def test_history_serves_the_engines_asked_and_refuses_what_is_no_engine(served):
    for _ in range(3):
        assert _get(served.url + "/snapshot?buckets=0")[0] == 200
    status, doc = _get(served.url + "/history?engine=0&engine=2")
    assert status == 200 and doc["points"]["time"] == [1000.0, 1010.0, 1020.0]
    assert doc["engines"]["series"]["0"]["engine_requests_waiting"] == [3.0, 3.0, 3.0]
    assert doc["engines"]["series"]["2"]["engine_requests_waiting"] == [None] * 3  # down
    assert doc["engines"]["held"] == 3 and 0 < doc["engines"]["bytes"] <= doc["engines"]["max_bytes"]
    assert doc["outages"] == [
        {"engine": 2, "from": 999.5, "to": None, "gone": False, "endpoint": None, "writers": []}
    ]
    assert _get(served.url + "/history")[1]["engines"]["series"] == {}
    for bad in ("engine=x", "engine=-1", "engine=" + "9" * 30, "&".join(["engine=1"] * 65)):
        status, doc = _get(served.url + "/history?" + bad)
        assert status == 400 and "engine" in doc["error"], (bad, doc)


def test_snapshot_says_which_writers_each_engine_runs_in_and_what_the_window_waits_for(served):
    status, doc = _get(served.url + "/snapshot?buckets=0")
    assert status == 200
    assert doc["window"]["seconds"] is None and doc["window"]["first_read"] == doc["time"]
    assert doc["window"]["min_seconds"] == 3.0  # rates once a read is 3 s after that one
    assert all(e["writers"] == [] for e in doc["engines"].values())  # engines made by hand


@pytest.mark.redis_server
def test_families_of_a_library_namespace_with_their_totals_per_engine(redis_server, namespace):
    cat = Catalog()
    cat.counter("requests", "Requests served.", labels=["route"])
    cat.gauge("queue_depth", "Queued now.")
    cat.histogram("latency_seconds", "Latency.", buckets=[0.1, 1.0])
    config = StatsConfig(url=redis_server.url, namespace=namespace, endpoint="api-0:8080")
    writer = StatsWriter(config, cat, engines=[0, 1], start=False, role="web")
    writer.metric("requests").labels(0, route="/a").inc(5)
    writer.metric("requests").labels(0, route="/b").inc(2)
    writer.metric("requests").labels(1, route="/b").inc(11)
    writer.metric("queue_depth").labels(1).set(4)
    writer.metric("latency_seconds").labels(0).observe(0.25)
    assert writer.flush()
    reader = StatsReader(config, CAT)  # the exporter's reader: vLLM's catalogue given, not stored
    exporter = Exporter(reader, port=0, window=30, history=VLLM_PAGE_HISTORY).start()
    try:
        status, doc = _get(exporter.url + "/families")
        snapshot = _get(exporter.url + "/snapshot?buckets=0")[1]
    finally:
        exporter.close()
        writer.close()
    assert status == 200 and doc["engines"] == [0, 1] and doc["up"] == [True, True]
    by_name = {f["name"]: f for f in doc["families"]}
    assert list(by_name) == ["latency_seconds", "queue_depth", "requests"]  # no vLLM family: none stored
    assert by_name["requests"]["values"] == [7.0, 11.0] and by_name["requests"]["total"] == 18.0
    assert by_name["requests"]["labels"] == ["route"] and by_name["requests"]["rates"] == [None, None]
    assert by_name["queue_depth"]["values"] == [None, 4.0] and "rates" not in by_name["queue_depth"]
    assert by_name["latency_seconds"]["values"] == [1.0, None] and by_name["latency_seconds"]["sums"] == [
        0.25,
        None,
    ]
    assert snapshot["engines"]["0"]["writers"] == [writer.writer_id]
    assert snapshot["engines"]["0"]["endpoint"] == "api-0:8080"


def test_families_rates_over_the_window_and_values_past_the_float_range():
    earlier, now = fleet_at(1000.0)
    doc = families_document(now, earlier)
    gen = next(f for f in doc["families"] if f["name"] == "vllm:generation_tokens")
    assert doc["window_seconds"] == 10.0 and gen["rates"][0] == 30.0  # 300 tokens in 10 s
    big = snap(1.0, engine(0, counters={("vllm:generation_tokens", "m"): 1.7e308}),
               engine(1, counters={("vllm:generation_tokens", "m"): 1.7e308}))  # fmt: skip
    gen = families_document(big, None)["families"][0]
    assert gen["total"] == "+Inf" and gen["values"] == [1.7e308, 1.7e308] and gen["rates"] == [None, None]
    assert json.loads(json.dumps(families_document(big, None), allow_nan=False))
    assert not math.isnan(gen["values"][0])


def test_history_and_outages_taken_from_several_threads_at_once_stay_whole():
    """The window's sampler and every /snapshot request add to one history and one trace at once
    (reads finishing out of order): the points stay in order, their bytes add up, nothing raises."""
    import threading

    history = FleetHistory(VLLM_PAGE_HISTORY, spacing=0.5, max_bytes=200_000)
    trace = OutageTrace(600.0)
    fleets = [_fleet(64, 0.0), snap(0.0, *(engine(e, up=e % 3 != 0) for e in range(64)))]
    errors: list[BaseException] = []

    def run(offset: int) -> None:
        try:
            for i in range(300):
                t = 1000.0 + i + offset * 0.25
                now = snap(t, *fleets[i % 2].engines.values())
                history.add(now, fleets[0])
                trace.see(now)
        except BaseException as exc:  # pragma: no cover - the assertion below says it
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    times = history.columns()["time"]
    assert times == sorted(times) and all(b - a >= 0.5 for a, b in itertools.pairwise(times))
    points = list(history._points)
    assert history.bytes == sum(p.size for p in points) <= 200_000
    doc = trace.document()
    assert doc and all(o["to"] is None or o["to"] >= o["from"] for o in doc)
    assert len({o["engine"] for o in doc if o["to"] is None}) == sum(1 for o in doc if o["to"] is None)


def test_families_say_when_redis_cannot_be_read(config):
    from redis_stats.tools.embedded import free_port

    down = StatsConfig(
        url=f"redis://127.0.0.1:{free_port()}/0", namespace=config.namespace, connect_timeout_ms=200
    )
    exporter = Exporter(StatsReader(down, CAT), port=0, history=VLLM_PAGE_HISTORY).start()
    try:
        status, doc = _get(exporter.url + "/families")
        history_status = _get(exporter.url + "/history")[0]
    finally:
        exporter.close()
    assert status == 503 and doc["error"] == "connection", doc
    assert history_status == 200  # from memory


def test_an_engine_index_past_64_bits_costs_its_own_chart_only():
    """A writer may be given any engine index (``engines=[10**20]`` flushes fine). Kept in the
    engines' arrays it failed every point: /snapshot and /families answered 500. Now that engine has
    no chart of its own; the fleet's figures count it, every other engine keeps its chart."""
    huge = 10**20
    now = snap(1000.0, engine(0, gauges={(WAITING, "m"): 2}), engine(huge, gauges={(WAITING, "m"): 5}))
    history = FleetHistory(VLLM_PAGE_HISTORY, spacing=2.0)
    history.add(now, None)
    assert history.columns()["requests_waiting"] == [7.0]
    assert history.engine_series([0])["0"]["engine_requests_waiting"] == [2.0]
    assert history.engines_held() == 1
