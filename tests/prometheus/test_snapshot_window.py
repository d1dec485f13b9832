"""/snapshot for routers and autoscalers: rates and quantiles over a recent window, fleet totals,
a JSON Schema that real documents satisfy, ``redis-stats inspect --json``; and the exporter's own
process and scrape metrics."""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
import urllib.request
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats import HistogramValue, StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY
from redis_stats.server import Exporter
from redis_stats.server.states.window import SnapshotRing, recent_document
from redis_stats.tools.cli import main
from tests.conftest import ROOT, sample_catalog
from tests.prometheus import views

SCHEMA = json.loads((files("redis_stats") / "schemas" / "snapshot.schema.json").read_text())
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def get(server: Exporter, path: str, accept: str | None = None) -> bytes:
    req = urllib.request.Request(server.url + path, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read()


def snapshot(server: Exporter) -> dict:
    return json.loads(get(server, "/snapshot"))


@pytest.fixture
def fleet(redis_server, namespace):
    """A writer of engines 0 and 1 and an exporter over them with a 2 s window."""
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    cat = sample_catalog()
    writer = StatsWriter(config, cat, engines=[0, 1], start=False)
    server = Exporter(StatsReader(config, cat), port=0, window=2.0).start()
    yield writer, server
    server.close()
    writer.close()


def test_window_rates_and_quantiles_are_those_of_the_window_only(fleet):
    writer, server = fleet
    tokens0 = writer.counter("tokens").labels(engine=0)
    tokens1 = writer.counter("tokens").labels(engine=1)
    latency = writer.histogram("latency_seconds").labels(engine=1)
    tokens0.inc(1000)  # before the window: must not count
    for _ in range(50):
        latency.observe(4.0)
    writer.gauge("running").labels(engine=0).set(3)
    writer.gauge("running").labels(engine=1).set(5)
    assert writer.flush()
    first = snapshot(server)
    validate(first)
    assert first["window"]["seconds"] is None  # nothing earlier yet: no rates rather than wrong ones
    assert first["fleet"]["rates"]["tokens"] is None
    assert first["fleet"]["gauges"]["running"] == {"engines": 2, "sum": 8.0, "mean": 4.0, "max": 5.0}
    tokens0.inc(30)
    tokens1.inc(90)
    for v in (0.05, 0.05, 0.3, 0.3, 0.3, 0.7):
        latency.observe(v)
    assert writer.flush()
    time.sleep(0.5)  # more than a tenth of the window
    doc = snapshot(server)
    validate(doc)
    seconds = doc["window"]["seconds"]
    assert 0.4 < seconds < 2.0
    rates = {
        (e, name): r["per_second"]
        for e, b in doc["window"]["engines"].items()
        for name, series in b["rates"].items()
        for r in series
    }
    assert rates[("0", "tokens")] == pytest.approx(30 / seconds)
    assert rates[("1", "tokens")] == pytest.approx(90 / seconds)
    assert doc["fleet"]["rates"]["tokens"] == pytest.approx(120 / seconds)
    ((hist,),) = doc["window"]["engines"]["1"]["histograms"].values()
    recent = HistogramValue((0.1, 0.5, 1.0, 5.0, float("inf")), (2.0, 5.0, 6.0, 6.0, 6.0), 1.7)
    assert hist["count"] == 6
    assert hist["p50"] == pytest.approx(recent.quantile(0.5))  # the 4.0s before the window are out
    assert hist["p99"] == pytest.approx(recent.quantile(0.99)) and hist["p99"] < 1.0
    assert hist["mean"] == pytest.approx(1.7 / 6)
    # Since start (the existing block) still counts everything.
    since = {name: h["value"] for name, (h,) in doc["engines"]["1"]["histograms"].items()}
    assert since["latency_seconds"]["count"] == 56


def test_fleet_summary_is_injected_and_the_core_knows_no_vllm_name(redis_server, namespace):
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    writer = StatsWriter(config, vllm_catalog(), engines=[0, 1], start=False)
    recorders = VllmRecorder(writer, "m", [0, 1])
    from types import SimpleNamespace

    def sched(running: int, waiting: int, kv: float) -> SimpleNamespace:
        return SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv)

    recorders.record(sched(4, 1, 0.2), None, engine_idx=0)
    recorders.record(sched(6, 3, 0.6), None, engine_idx=1)
    assert writer.flush()
    server = Exporter(StatsReader(config, vllm_catalog()), port=0, summary=VLLM_FLEET_SUMMARY).start()
    try:
        doc = snapshot(server)
    finally:
        server.close()
        writer.close()
    validate(doc)
    summary = doc["fleet"]["summary"]
    assert summary["requests_running"] == 10 and summary["requests_waiting"] == 4
    assert summary["kv_cache_usage_mean"] == pytest.approx(0.4) and summary["kv_cache_usage_max"] == 0.6
    assert summary["generation_tokens_per_second"] is None  # no window yet
    from redis_stats import reporting as reporter
    from redis_stats.ops import inspection as inspect
    from redis_stats.server.states import sampler, window
    from redis_stats.server.views import snapshot as snapshot_view

    for module in (window, sampler, snapshot_view, reporter, inspect):  # by module, wherever they are
        assert "vllm:" not in Path(module.__file__).read_text()  # no metric name in the core


def test_an_engines_queue_and_kv_usage_are_found_by_key_and_the_source_is_named(redis_server, namespace):
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    writer = StatsWriter(config, vllm_catalog(), engines=[0, 1, 2], start=False)
    from types import SimpleNamespace

    for engine, (waiting, kv) in enumerate([(0, 0.1), (7, 0.9), (2, 0.5)]):
        sched = SimpleNamespace(num_running_reqs=1, num_waiting_reqs=waiting, kv_cache_usage=kv)
        VllmRecorder(writer, "m", [engine]).record(sched, None, engine_idx=engine)
    assert writer.flush()
    server = Exporter(StatsReader(config, vllm_catalog()), port=0, summary=VLLM_FLEET_SUMMARY).start()
    try:
        doc = snapshot(server)
    finally:
        server.close()
        writer.close()
    validate(doc)
    assert doc["schema_version"] == 2
    engine = doc["engines"]["1"]  # no list to filter: metric name, then its label sets
    assert engine["gauges"]["vllm:num_requests_waiting"] == [{"labels": {"model_name": "m"}, "value": 7.0}]
    assert engine["gauges"]["vllm:kv_cache_usage_perc"][0]["value"] == 0.9
    assert doc["source"] == {"namespace": namespace, "redis": redis_server.url}


def test_name_parameters_keep_only_those_metrics_and_the_whole_summary(redis_server, namespace):
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    writer = StatsWriter(config, vllm_catalog(), engines=[0], start=False)
    from types import SimpleNamespace

    tokens = writer.counter("vllm:generation_tokens").labels(engine=0, model_name="m")
    sched = SimpleNamespace(num_running_reqs=2, num_waiting_reqs=5, kv_cache_usage=0.3)
    VllmRecorder(writer, "m", [0]).record(sched, None, engine_idx=0)
    tokens.inc(10)
    writer.counter("vllm:prompt_tokens").labels(engine=0, model_name="m").inc(50)
    assert writer.flush()
    server = Exporter(
        StatsReader(config, vllm_catalog()), port=0, window=2.0, summary=VLLM_FLEET_SUMMARY
    ).start()
    try:
        whole = snapshot(server)
        time.sleep(0.5)
        tokens.inc(100)
        assert writer.flush()
        doc = json.loads(get(server, "/snapshot?name[]=vllm:num_requests_waiting&name[]=vllm:prompt_tokens"))
        hist = "vllm:time_to_first_token_seconds"
        slim = json.loads(get(server, f"/snapshot?buckets=0&name[]={hist}"))
    finally:
        server.close()
        writer.close()
    validate(doc)
    engine = doc["engines"]["0"]
    assert set(engine["gauges"]) == {"vllm:num_requests_waiting"} and set(engine["counters"]) == {
        "vllm:prompt_tokens"
    }
    assert len(whole["engines"]["0"]["gauges"]) > 1  # without the parameter: every metric
    assert set(doc["window"]["engines"]["0"]["rates"]) == {"vllm:prompt_tokens"}
    assert set(doc["fleet"]["rates"]) == {"vllm:prompt_tokens"} and set(doc["fleet"]["gauges"]) == {
        "vllm:num_requests_waiting"
    }
    validate(slim)
    ((with_buckets,),) = [whole["engines"]["0"]["histograms"][hist]]
    ((without,),) = [slim["engines"]["0"]["histograms"][hist]]
    assert "buckets" in with_buckets["value"] and "buckets" not in without["value"]
    assert without["value"] == {k: v for k, v in with_buckets["value"].items() if k != "buckets"}
    # The summary is whole, its rates measured from metrics the filter left out of the document.
    summary = doc["fleet"]["summary"]
    assert summary.keys() == VLLM_FLEET_SUMMARY.keys() and summary["requests_running"] == 2
    assert summary["generation_tokens_per_second"] == pytest.approx(100 / doc["window"]["seconds"])


def test_every_vllm_view_serves_the_fleet_summary():
    """The demo's view had no ``fleet.summary`` (its Exporter was built without it): every place
    that builds an exporter over the vLLM catalogue passes the vLLM figures."""
    import ast

    for path in (ROOT / "redis_stats").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Exporter":
                keywords = {k.arg for k in node.keywords}
                assert "summary" in keywords, f"{path}:{node.lineno} builds an Exporter without summary="


def test_a_bad_summary_kind_is_refused_naming_it(redis_server, namespace):
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    with pytest.raises(ValueError, match=r"'running'.*'avg' is not one of rate, sum, mean, max"):
        Exporter(StatsReader(config, sample_catalog()), port=0, summary={"running": ("avg", "running")})


def test_schema_is_not_vacuous():
    series = {"labels": {"model_name": "m"}, "value": 3.0}
    engine = {
        "up": True,
        "age_seconds": 0.1,
        "counters": {},
        "gauges": {"waiting": [series]},
        "histograms": {},
    }
    good = {
        "schema_version": 2,
        "time": 1.0,
        "engines": {"0": engine},
        "writers": {},
        "skipped": {},
        "window": {"requested_seconds": 30, "seconds": None, "engines": {}},
        "fleet": {"engines": 0, "engines_up": 0, "rates": {}, "gauges": {}, "summary": {}},
    }
    validate(good)
    version_1 = {**engine, "gauges": [{"name": "waiting", **series}]}  # lists of named series
    for broken in (
        {k: v for k, v in good.items() if k != "fleet"},
        {k: v for k, v in good.items() if k != "schema_version"},
        {**good, "schema_version": 1},
        {**good, "engines": {"0": version_1}},
        {**good, "fleet": {k: v for k, v in good["fleet"].items() if k != "summary"}},
        {**good, "source": {"namespace": "demo"}},
        {**good, "time": "yesterday"},
        {**good, "engines": {"zero": {}}},
        {**good, "window": {**good["window"], "seconds": 0}},
        {**good, "fleet": {**good["fleet"], "rates": {"tokens": "Infinity"}}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)


def test_concurrent_snapshot_requests_all_valid_and_ring_stays_ordered_and_bounded(fleet):
    writer, server = fleet
    tokens = writer.counter("tokens").labels(engine=0)
    stop = threading.Event()
    docs: list[dict] = []
    errors: list[BaseException] = []

    def write() -> None:
        while not stop.is_set():
            tokens.inc(7)
            writer.flush()
            time.sleep(0.01)

    def read() -> None:
        try:
            for _ in range(25):
                docs.append(snapshot(server))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    assert not errors
    assert len(docs) == 150
    for doc in docs:
        validate(doc)
        rate = doc["fleet"]["rates"]["tokens"]
        assert rate is None or rate >= 0  # never a negative rate from snapshots taken out of order
    ring = views.window(server).ring
    times = [s.time for s, _size in ring._ring]
    assert times == sorted(times) and ring.bytes <= ring.max_bytes
    assert times[-1] - times[0] <= ring.keep


def test_ring_keeps_only_the_window_and_ignores_a_late_older_read():
    from redis_stats.catalog import Catalog
    from redis_stats.snapshot import Snapshot

    def snap(t: float) -> Snapshot:
        return Snapshot(time=t, engines={}, writers={}, catalog=Catalog())

    ring = SnapshotRing(keep=10)
    for t in (100, 103, 106, 104, 112, 115):
        ring.add(snap(t))
    assert [s.time for s, _size in ring._ring] == [106, 112, 115]
    assert ring.baseline(snap(116), window=10).time == 106
    assert ring.baseline(snap(116), window=10, min_span=5).time == 106
    assert ring.baseline(snap(116), window=3).time == 115
    assert ring.baseline(snap(116), window=3, min_span=2) is None
    with pytest.raises(ValueError, match="keep"):
        SnapshotRing(keep=0)


def _busy_snapshot(config: StatsConfig, engines: int):
    """A real decoded snapshot of *engines* vLLM engines with busy histograms (2 API servers)."""
    from redis_stats.tools.simulate import SimulatedApiServer

    cat = vllm_catalog()
    for api in range(2):
        writer = StatsWriter(config, cat, engines=list(range(engines)), start=False, role=f"api{api}")
        sims = [
            SimulatedApiServer(VllmRecorder(writer, "m", [e]), e, seed=api * 100 + e) for e in range(engines)
        ]
        t = sims[0]._last
        for step in range(40):
            for sim in sims:
                sim.step(t + step * 0.25)
        assert writer.flush()
        writer._closed = True
    return StatsReader(config, cat).snapshot()


def test_the_window_keeps_what_fits_its_byte_budget_oldest_dropped_first(redis_server, namespace):
    """The /snapshot window is bounded by bytes, not by count (it kept up to 256 whole decoded
    snapshots: about 19 MB each at 1,024 engines). What it keeps is a compact copy whose size is
    estimated from its parts; the estimate is checked against tracemalloc here."""
    import gc
    import tracemalloc
    from dataclasses import replace

    from redis_stats.server.states.window import window_copy

    snap = _busy_snapshot(StatsConfig(url=redis_server.url, namespace=namespace), 16)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        copy, estimate = window_copy(snap)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.6 * held <= estimate <= 1.6 * held, (estimate, held)
    assert set(copy.engines) == set(snap.engines)
    e0, c0 = snap.engines[0], copy.engines[0]
    assert c0.counters == e0.counters and not c0.gauges
    for key, h in e0.histograms.items():
        assert list(c0.histograms[key].cumulative) == list(h.cumulative) and c0.histograms[key].sum == h.sum
    # Three copies fit; the fourth pushes the oldest out (the window is the span that fits).
    ring = SnapshotRing(keep=1000, max_bytes=3 * estimate + estimate // 2)
    for t in range(5):
        ring.add(replace(snap, time=snap.time + t))
    assert [s.time - snap.time for s, _ in ring._ring] == [2, 3, 4]
    assert ring.bytes <= ring.max_bytes
    latest = replace(snap, time=snap.time + 10)
    assert ring.baseline(latest, window=100).time == snap.time + 2
    # Rates over the window that fits: the document says how long it is.
    doc = recent_document(latest, ring.baseline(latest, window=100), requested=100)
    assert doc["window"]["seconds"] == pytest.approx(8)
    # One snapshot over the whole budget: nothing kept, no window, said once in the log.
    small = SnapshotRing(keep=1000, max_bytes=estimate // 2)
    small.add(snap)
    assert len(small) == 0 and small.baseline(latest, window=100) is None


def test_the_window_keeps_one_snapshot_per_sampling_period_not_every_request(fleet):
    """The live page polls every 2 s: each poll's snapshot was kept, for two windows."""
    writer, server = fleet  # a 2 s window: the sampler every 1/3 s
    writer.counter("tokens").labels(engine=0).inc(5)
    assert writer.flush()
    for _ in range(30):  # 3 s of requests every 0.1 s
        snapshot(server)
        time.sleep(0.1)
    ring = views.window(server).ring
    times = [s.time for s, _size in ring._ring]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps and min(gaps) >= 0.9 * server.options.window / 6, gaps
    assert len(times) <= ring.keep / (0.9 * server.options.window / 6) + 1


def test_a_bad_window_budget_is_refused_naming_it(redis_server, namespace):
    reader = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog())
    with pytest.raises(ValueError, match="window_budget=-1 must be a whole number of bytes"):
        Exporter(reader, port=0, window_budget=-1)
    result = CliRunner().invoke(main, ["exporter", "--window-budget", "-5"])
    assert result.exit_code == 2 and "--window-budget" in result.output


def test_inspect_json_prints_the_documented_snapshot(redis_server, namespace):
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    writer = StatsWriter(config, vllm_catalog(), engines=[0], start=False)
    tokens = writer.counter("vllm:generation_tokens").labels(engine=0, model_name="m")
    tokens.inc(5)
    assert writer.flush()
    env = {"REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}

    def later() -> None:
        time.sleep(0.2)
        tokens.inc(40)
        writer.flush()

    t = threading.Thread(target=later)
    t.start()
    result = CliRunner().invoke(main, ["inspect", "--json", "--window", "0.6"], env=env)
    t.join()
    writer.close()
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    validate(doc)
    seconds = doc["window"]["seconds"]
    assert doc["fleet"]["summary"]["generation_tokens_per_second"] == pytest.approx(40 / seconds)
    plain = CliRunner().invoke(main, ["inspect", "--json"], env=env)
    assert plain.exit_code == 0 and json.loads(plain.output)["window"]["seconds"] is None


def _samples(text: str, parse=parse_text) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in parse(text) for s in f.samples}


def test_exporter_shows_its_own_process_and_scrapes(fleet):
    _, view = fleet
    server = Exporter(view.reader, port=0, self_metrics=True).start()
    try:
        first = get(server, "/metrics")
        second = get(server, "/metrics").decode()
        om = get(server, "/metrics", OPENMETRICS).decode()
    finally:
        server.close()
    samples = _samples(second)
    names = {name for name, _ in samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
    assert "python_gc_objects_collected_total" in names
    assert samples[("redis_stats_exporter_scrape_duration_seconds_count", ())] == 1
    assert samples[("redis_stats_exporter_last_scrape_size_bytes", ())] == len(first)
    assert samples[("redis_stats_exporter_scrape_bytes_total", ())] == len(first)
    # OpenMetrics stays valid (prometheus_client's strict parser) and counts the two scrapes before.
    om_samples = _samples(om, parse_openmetrics)
    assert om_samples[("redis_stats_exporter_scrape_duration_seconds_count", ())] == 2
    # Off by default: a host such as vLLM serves its own process metrics on its own port.
    assert "process_cpu_seconds_total" not in get(view, "/metrics").decode()


def test_self_metrics_doc_lists_the_exporter_metrics():
    ops = (ROOT / "docs" / "self-metrics.md").read_text()
    for name in (
        "redis_stats_exporter_scrape_duration_seconds",
        "redis_stats_exporter_scrape_bytes_total",
        "redis_stats_exporter_last_scrape_size_bytes",
        "process_*",
    ):
        assert name in ops, name
    assert Path(ROOT / "docs" / "snapshot.md").is_file()


def _engine_snap(t: float, values: list[float], gauges: list[float]):
    from redis_stats.snapshot import EngineSnapshot, Snapshot

    cat = sample_catalog()
    engines = {}
    for i, (c, g) in enumerate(zip(values, gauges)):
        engines[i] = EngineSnapshot(
            engine=i,
            heartbeat=t,
            age=0.0,
            up=True,
            counters={("tokens", ()): c},
            gauges={("running", ()): g},
            histograms={
                ("latency_seconds", ()): HistogramValue(
                    (0.1, 0.5, 1.0, 5.0, float("inf")), (c, c, c, c, c), c
                )
            },
        )
    return Snapshot(time=t, engines=engines, writers={}, catalog=cat)


floats = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=200, deadline=None)
@example(before=[0.0, 0.0], after=[1.0, 1.0], gauges=[math.inf, -math.inf])
@example(before=[0.0, 0.0], after=[1e308, 1e308], gauges=[1e308, 1e308])
@given(
    before=st.lists(floats, min_size=1, max_size=4),
    after=st.lists(floats, min_size=1, max_size=4),
    gauges=st.lists(floats, min_size=1, max_size=4),
)
def test_any_values_give_a_strict_json_document_valid_against_the_schema(before, after, gauges):
    from redis_stats.server.states.window import snapshot_document

    n = min(len(before), len(after), len(gauges))
    earlier = _engine_snap(100.0, before[:n], gauges[:n])
    now = _engine_snap(110.0, after[:n], gauges[:n])
    doc = snapshot_document(
        now, earlier, requested=30.0, summary={"r": ("rate", "tokens"), "g": ("mean", "running")}
    )
    text = json.dumps(doc, allow_nan=False)  # strict JSON: never NaN or Infinity literals
    validate(json.loads(text))


def test_fleet_gauge_figures_past_the_float_range(fleet):
    """Issue 32: the fleet mean of two gauges at 1.7e308 was their sum (+Inf) over two; the
    mean of finite values is finite. A sum past the float range is "+Inf" (the schema's form);
    the other gauges' figures are untouched."""
    writer, server = fleet
    big = 1.7e308
    for e in (0, 1):
        writer.gauge("inflight").labels(engine=e).set(big)
        writer.gauge("running").labels(engine=e).set(e + 1)
    assert writer.flush()
    doc = snapshot(server)
    validate(doc)
    gauges = doc["fleet"]["gauges"]
    assert gauges["inflight"] == {"engines": 2, "sum": "+Inf", "mean": big, "max": big}
    assert gauges["running"] == {"engines": 2, "sum": 3, "mean": 1.5, "max": 2}
