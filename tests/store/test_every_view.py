"""Every way in, every view (issue 32): arbitrary label values and amounts, recorded through the
library, the vLLM recorder and the bridge from a real prometheus_client source, read back through
``/metrics`` (text, both render paths, and OpenMetrics), ``/snapshot``, the live page's request,
``/load``, ``top``, ``inspect`` and the log line. Each view shows what was recorded, or skips it and
counts it, and a control series recorded beside the hostile one (and a control engine) is always
shown exactly: no value may darken or falsify the rest of a view.

The text views are parsed with prometheus_client's parsers and compared series for series with
the model of what was recorded (a parser accepts a series twice: duplicates fail here).

fakeredis carries the property tests (hundreds of examples); one pass through a real server and
the exporter's HTTP at the end.
"""

from __future__ import annotations

import json
import math
import sys
import time
import urllib.request
from bisect import bisect_left
from importlib.resources import files
from typing import Any

import fakeredis
import jsonschema
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats import Catalog, CatalogError, RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.bridge import BridgedSource
from redis_stats.integrations.bridge.fetch import ACCEPT
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.integrations.vllm.logline import LogMetrics, VllmLogLines
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY
from redis_stats.load import LoadMap, LoadSource
from redis_stats.ops import inspection
from redis_stats.prometheus.exposition import escape_label_value
from redis_stats.prometheus.openmetrics import openmetrics_from_text
from redis_stats.server import Exporter
from redis_stats.server.states.window import snapshot_document
from redis_stats.tools.cli import main
from redis_stats.tools.top import render_plain
from tests.bridge.compare import get, source_samples, store_samples
from tests.vllm_shapes import finished, iteration, scheduler

MAX = sys.float_info.max
I64 = 2**63 - 1
CAP = 12  # the writers' and readers' max_label_length here: its edges are cheap to reach
SCHEMAS = {
    n: json.loads((files("redis_stats") / "schemas" / f"{n}.schema.json").read_text())
    for n in ("snapshot", "load")
}
CONTROL = {"c": 5, "g": 3.0, "h": 0.25}  # the control series' amounts, recorded by every writer
BUCKETS = (0.5, 1.0, 10.0)

# Label values: every Unicode class (surrogates too: refused where they enter), what formats and
# escapes are made of, and lengths around the cap.
SPECIAL = ["100%", "%s", "%d", "%%", "%(a)s", "%", "{}", "{0}", "{a}", "\\", '"', "\n", '\\"', "\\n", "a\nb"]
SPECIAL += ["", " ", "le", "engine", "+Inf", "NaN", "\u2028", "\x00", "\t", "}", '"}', "#", "# HELP x"]
LABELS = st.one_of(
    st.sampled_from(SPECIAL),
    st.text(st.characters(exclude_categories=()), max_size=CAP + 2),
    st.builds(
        lambda c, n: c * n,
        st.sampled_from(["x", "%", "\\", '"', "\n", "é", "\U0001f600"]),
        st.integers(CAP - 1, CAP + 1),
    ),
)
EDGES = [0, 0.0, -0.0, -1, 1, 0.1, 2**53 + 1, I64, I64 + 1, 2**64 + 1, 10**308, 10**400, 1.7e308, -1.7e308]
EDGES += [MAX, -MAX, 5e-324, math.inf, -math.inf, math.nan, 1e16, 123456789.123]
AMOUNTS = st.one_of(st.sampled_from(EDGES), st.floats(), st.integers(-(2**70), 2**70))


def same(a: float, b: float) -> bool:
    """Equal as numbers, NaN equal to NaN (a NaN is a value a view may show)."""
    return (math.isnan(a) and math.isnan(b)) or a == b


# -- what each kind of record call keeps: the model a view is compared with ----------------------


def counter_part(x: Any) -> int | float:
    """A writer's total of a counter after ``inc(x)`` (0: dropped and counted)."""
    if type(x) not in (int, float) or not 0 <= x <= MAX:
        return 0
    return float(x) if type(x) is int and x > I64 else x  # beyond 64 bits: sent as a float


def gauge_part(x: Any) -> float | None:
    """A writer's value of a gauge after ``set(x)`` (None: dropped, the writer holds none)."""
    try:
        v = float(x)
    except OverflowError:
        return None
    return None if math.isnan(v) else v


def histogram_part(x: Any) -> tuple[list[int], float]:
    """A writer's (bucket counts, sum) of a histogram after ``observe(x)`` (none: dropped)."""
    counts = [0] * (len(BUCKETS) + 1)
    if type(x) not in (int, float) or not -MAX <= x <= MAX:
        return counts, 0.0
    counts[bisect_left((*BUCKETS, math.inf), x)] = 1
    return counts, 0.0 + x


def add(parts: list[Any]) -> Any:
    """Writers' parts added up as a reader does (left to right, ``+``)."""
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def expected_series(label: str, amounts: list[tuple[Any, Any, Any]]) -> dict[tuple[str, tuple], float]:
    """The samples the catalogue's families show, by (sample name, sorted labels): the control
    series in engines 0 and 1, and the hostile one in engine 0 (*amounts*: per writer, what its
    counter, gauge and histogram were given), or without it when its label value is refused."""
    out: dict[tuple[str, tuple], float] = {}
    writers = len(amounts)
    series: list[tuple[str, str, Any, Any, Any]] = [
        ("1", "control", *[[CONTROL[k]] * writers for k in "cgh"])
    ]
    series.append(("0", "control", *[[CONTROL[k]] * writers for k in "cgh"]))
    if len(label) <= CAP and label.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == label:
        series.append(("0", label, *map(list, zip(*amounts))))
    for engine, a, cs, gs, hs in series:
        out.update(one_series(engine, a, cs, gs, hs))
    return out


def one_series(
    engine: str, a: str, cs: list[Any], gs: list[Any], hs: list[Any]
) -> dict[tuple[str, tuple], float]:
    """The samples of the counter, gauge and histogram of label value *a* in *engine*, each
    writer having given them *cs*, *gs* and *hs*."""
    out: dict[tuple[str, tuple], float] = {}
    labels = (("a", a), ("engine", engine))
    out["c_total", labels] = add([counter_part(x) for x in cs])
    held = [v for v in map(gauge_part, gs) if v is not None]
    if held:
        out["g", labels] = 0 + add(held)  # roll_up's sum() starts from 0
    parts = [histogram_part(x) for x in hs]
    counts = [sum(c[i] for c, _ in parts) for i in range(len(BUCKETS) + 1)]
    running = 0
    for bound, n in zip((*BUCKETS, math.inf), counts):
        running += n
        out["h_bucket", (*labels, ("le", repr(float(bound))))] = running
    out["h_count", labels] = running
    out["h_sum", labels] = add([s for _, s in parts])
    return out


def samples(families: Any) -> dict[tuple[str, tuple], float]:
    """The catalogue's samples of a parsed exposition; a series twice fails."""
    out: dict[tuple[str, tuple], float] = {}
    for fam in families:
        if fam.name.startswith("redis_stats_"):
            continue
        for s in fam.samples:
            labels = dict(s.labels)
            if "le" in labels:
                labels["le"] = repr(float(labels["le"]))
            key = (s.name, tuple(sorted(labels.items())))
            assert key not in out, f"series twice: {key}"
            out[key] = float(s.value)
    return out


def self_metrics(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in parse_text(text)
        if fam.name.startswith("redis_stats_")
        for s in fam.samples
    }


def assert_shown(got: dict, want: dict) -> None:
    """Series for series: the same keys, the same numbers."""
    assert set(got) == set(want), set(got) ^ set(want)
    for key, value in want.items():
        assert same(got[key], float(value)), (key, got[key], value)


# -- the library ---------------------------------------------------------------------------------


def library_catalog() -> Catalog:
    cat = Catalog()
    cat.counter("c", "A counter.", labels=["a"])
    cat.gauge("g", "A gauge summed over writers.", labels=["a"], mode="sum")
    cat.histogram("h", "A histogram.", labels=["a"], buckets=list(BUCKETS))
    return cat


LOAD = LoadMap(requests_running=LoadSource("g"))


class Store:
    """One fakeredis server, its namespace and catalogue, clients on demand."""

    def __init__(self, catalog: Catalog, n: int) -> None:
        self.server = fakeredis.FakeServer()
        self.catalog = catalog
        self.config = StatsConfig(namespace=f"every{n}", max_label_length=CAP, flush_interval=0.05)

    def client(self) -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=self.server, decode_responses=True, encoding_errors="replace")

    def reader(self) -> StatsReader:
        return StatsReader(self.config, self.catalog, client=self.client())

    def writer(self, role: str, **kw: Any) -> StatsWriter:
        return StatsWriter(
            self.config, self.catalog, engines=[0, 1], client=self.client(), start=False, role=role, **kw
        )


_stores = iter(range(10**9))


def record_library(store: Store, label: str, amounts: list[tuple[Any, Any, Any]]) -> tuple[bool, int]:
    """Each writer records the control series and the hostile one; (whether the label value was
    taken, how many record calls were dropped and counted)."""
    taken, dropped = True, 0
    for i, (c, g, h) in enumerate(amounts):
        w = store.writer(f"w{i}", load=LOAD)
        for engine in (0, 1):
            w.metric("c").labels(engine, a="control").inc(CONTROL["c"])
            w.metric("g").labels(engine, a="control").set(CONTROL["g"])
            w.metric("h").labels(engine, a="control").observe(CONTROL["h"])
        try:
            w.metric("c").labels(0, a=label).inc(c)
            w.metric("g").labels(0, a=label).set(g)
            w.metric("h").labels(0, a=label).observe(h)
        except CatalogError:  # a label value that is not text (a lone surrogate): refused, said
            taken = False
        assert w.flush()
        dropped += sum(w.drops.values())
        w._closed = True  # no close(): its gauges must keep counting (a closed writer's do not)
    return taken, dropped


def check_text_views(store: Store, want: dict) -> None:
    """/metrics as the exporter writes it (fast path), as prometheus_client writes it, and as
    OpenMetrics; the self-metrics say the read succeeded."""
    collector = RedisCollector(store.reader())
    text = collector.render_text()
    assert self_metrics(text)["redis_stats_up", ()] == 1.0
    assert_shown(samples(parse_text(text)), want)
    for (
        name,
        labels,
    ), v in want.items():  # an integer past 2**53 is printed exactly (the parser gives floats)
        if name == "c_total" and type(v) is int:
            a, engine = dict(labels)["a"], dict(labels)["engine"]
            assert f'c_total{{engine="{engine}",a="{escape_label_value(a)}"}} {v}\n' in text
    # OpenMetrics holds counter-like samples to be >= 0 and not NaN: such a one is left out, and
    # counted (a histogram's sum after negative observations), the rest of the body as in text.
    unfit = {k for k, v in want.items() if k[0] != "g" and (math.isnan(v) or v < 0)}
    unfit |= {("h_count", k[1]) for k in unfit if k[0] == "h_sum"}  # a _count needs its _sum
    om = list(parse_om(openmetrics_from_text(text)))
    assert_shown(samples(om), {k: v for k, v in want.items() if k not in unfit})
    omitted = [s.value for f in om if f.name == "redis_stats_openmetrics_samples_omitted" for s in f.samples]
    assert omitted == ([len(unfit)] if unfit else [])
    registry = CollectorRegistry()
    registry.register(RedisCollector(store.reader()))
    assert_shown(samples(parse_text(generate_latest(registry).decode())), want)


def snapshot_values(doc: dict) -> dict[tuple[str, tuple], float]:
    """The since-start series of a /snapshot document as samples (text-format names)."""
    out: dict[tuple[str, tuple], float] = {}

    def num(v: Any) -> float:
        return (
            {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(v, v)
            if isinstance(v, str)
            else float(v)
        )

    for engine, block in doc["engines"].items():
        for kind, suffix in (("counters", "_total"), ("gauges", "")):
            for name, items in block[kind].items():
                for item in items:
                    labels = tuple(sorted({**item["labels"], "engine": engine}.items()))
                    out[name + suffix, labels] = num(item["value"])
        for name, items in block["histograms"].items():
            for item in items:
                labels = tuple(sorted({**item["labels"], "engine": engine}.items()))
                value = item["value"]
                out[name + "_count", labels] = num(value["count"])
                out[name + "_sum", labels] = num(value["sum"])
                for le, n in value.get("buckets", []):
                    out[name + "_bucket", tuple(sorted((*labels, ("le", repr(num(le))))))] = num(n)
    return out


def strict(doc: dict, schema: str) -> dict:
    """*doc* as a client gets it: strict JSON, valid against its schema."""
    back = json.loads(json.dumps(doc, allow_nan=False))
    jsonschema.Draft202012Validator(SCHEMAS[schema]).validate(back)
    return back


def check_snapshot_views(store: Store, earlier: Any, want: dict) -> Any:
    """/snapshot (since start, window, fleet) and the live page's request (named metrics, no
    buckets); the snapshot, for the views made from two of them."""
    now = store.reader().snapshot()
    doc = strict(snapshot_document(now, earlier, requested=30.0), "snapshot")
    assert_shown(snapshot_values(doc), {k: float(v) for k, v in want.items()})
    page = strict(
        snapshot_document(now, earlier, requested=30.0, names=["c", "g", "h"], buckets=False), "snapshot"
    )
    assert_shown(snapshot_values(page), {k: float(v) for k, v in want.items() if k[0] != "h_bucket"})
    for block in (doc, page):  # the control engine's window and fleet figures are exact
        rates = block["window"]["engines"]["1"]["rates"]["c"]
        assert [r["per_second"] for r in rates] == [
            len_writers(want) * CONTROL["c"] / doc["window"]["seconds"]
        ]
    return now


def len_writers(want: dict) -> int:
    return int(want["c_total", (("a", "control"), ("engine", "1"))] / CONTROL["c"])


def check_load(store: Store, want: dict) -> None:
    """/load: the control engine exact; the other engine's running is what its writers' entries
    add up to (a writer whose sum is not finite reports none); strict JSON, valid."""
    doc = strict(store.reader().load().to_dict(namespace=store.config.namespace), "load")
    writers = len_writers(want)
    assert doc["engines"]["1"]["requests_running"] == writers * CONTROL["g"]
    assert doc["fleet"]["engines_up"] == 2
    for figure in ("sum", "mean", "max"):
        assert isinstance(doc["fleet"]["requests_running"][figure], (int, float))


def check_top_and_log(store: Store, earlier: Any, now: Any, want: dict) -> None:
    """top's table and the log lines: the control engine's running exact, every line formats."""
    metrics = LogMetrics(running="g", generation_tokens="c", ttft="h")
    table = render_plain(earlier, now, metrics)
    control = len_writers(want) * CONTROL["g"]
    row = next(line for line in table.splitlines() if line.startswith("1 "))
    assert f" {control:.0f} " in row
    lines = VllmLogLines(metrics)(earlier, now)
    texts = [fmt % tuple(args) for _level, fmt, args in lines]
    assert any(t.startswith("Engine 001: ") and f"Running: {control:.0f} reqs" in t for t in texts)


def check_inspect(store: Store, want: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect: one line per engine with its number of series."""
    monkeypatch.setattr(inspection, "make_client", lambda config: store.client())
    lines = list(inspection.inspect_namespace(store.config, store.catalog))
    for engine in ("0", "1"):
        series = {
            (n.removesuffix("_total").removesuffix("_count"), k)
            for n, k in want
            if dict(k)["engine"] == engine and not n.endswith(("_bucket", "_sum"))
        }
        line = next(x for x in lines if x.strip().startswith(f"engine {engine}:"))
        assert f", {len(series)} series, " in line, (line, series)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(label=LABELS, amounts=st.lists(st.tuples(AMOUNTS, AMOUNTS, AMOUNTS), min_size=1, max_size=2))
@example(label="100%", amounts=[(1, 2.0, 0.5), (3, 4.0, 5.0)])
@example(label="%s", amounts=[(1.7e308, 1.7e308, 1.7e308), (1.7e308, 1.7e308, 1.7e308)])
@example(label="x" * CAP, amounts=[(2**64 + 1, math.inf, -MAX), (I64, -math.inf, MAX)])
@example(label="x" * (CAP + 1), amounts=[(1, 1, 1)])
@example(label="\ud800", amounts=[(1, 1, 1)])
def test_the_library_through_every_view(label, amounts, monkeypatch):
    store = Store(library_catalog(), next(_stores))
    # The engines are there before anything is counted: the window measures them from 0 (an
    # engine the window's first read lacks is not measured at all).
    first = store.writer("first")
    assert first.flush()
    first._closed = True
    earlier = store.reader().snapshot()
    assert sorted(earlier.engines) == [0, 1]
    time.sleep(0.002)  # a window of a few milliseconds (server clock)
    taken, _ = record_library(store, label, amounts)
    want = expected_series(label, amounts)
    assert taken == (("c_total", (("a", label), ("engine", "0"))) in want or len(label) > CAP)
    check_text_views(store, want)
    now = check_snapshot_views(store, earlier, want)
    check_load(store, want)
    check_top_and_log(store, earlier, now, want)
    check_inspect(store, want, monkeypatch)


# -- the vLLM recorder ---------------------------------------------------------------------------


def record_vllm(store: Store, model: str, reason: str, amounts: tuple[Any, Any, Any]) -> StatsWriter:
    """An API server's recorders as the plugin makes them: *model* on engine 0 (its running
    gauge, prompt tokens and TTFT given *amounts*, a request finished and one rejected with
    *reason*), and the control recorder on engine 1."""
    writer = store.writer("api", load=VLLM_LOAD)
    control = VllmRecorder(writer, "control", [1])
    control.record(
        scheduler(running=2, waiting=1, kv=0.25),
        iteration(prompt=10, ttft=[0.1], done=[finished()]),
        engine_idx=1,
    )
    running, prompt, ttft = amounts
    try:
        hostile = VllmRecorder(writer, model, [0])
    except CatalogError:  # a model name that is not text (a lone surrogate): refused, said
        assert not is_text(model)
    else:
        hostile.record(
            scheduler(running=running, waiting=1, kv=0.5),
            iteration(prompt=prompt, ttft=[ttft], done=[finished(reason=reason)]),
            engine_idx=0,
        )
        hostile.record_admission_rejection(reason)
    assert writer.flush()
    writer._closed = True
    return writer


def is_text(value: str) -> bool:
    return value.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == value


def engine_samples(text: str, engine: str) -> dict[tuple[str, tuple], float]:
    return {k: v for k, v in samples(parse_text(text)).items() if dict(k[1]).get("engine") == engine}


_clean: dict[str, Any] = {}


def clean_vllm() -> tuple[str, Any, Any]:
    """The control engine's view when nothing hostile was recorded beside it (made once)."""
    if not _clean:
        store = Store(vllm_catalog(), next(_stores))
        earlier = store.reader().snapshot()
        record_vllm(store, "m", "stop", (4, 10, 0.1))
        _clean.update(
            text=RedisCollector(store.reader()).render_text(), earlier=earlier, now=store.reader().snapshot()
        )
    return _clean["text"], _clean["earlier"], _clean["now"]


def running_cells(table: str, engine: str) -> list[str]:
    """top's running, waiting and KV % cells of *engine*'s row (throughput depends on the window)."""
    row = next(line for line in table.splitlines() if line.split()[:1] == [engine])
    return row.split()[5:8]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(model=LABELS, reason=LABELS, amounts=st.tuples(AMOUNTS, AMOUNTS, AMOUNTS))
@example(model="100%", reason="%s", amounts=(1.7e308, 2**64 + 1, -1.0))
@example(model="x" * (CAP + 1), reason="stop", amounts=(1, 1, 1))
@example(model="m", reason="\ud800", amounts=(math.inf, math.nan, math.inf))
def test_the_vllm_recorder_through_every_view(model, reason, amounts, monkeypatch):
    store = Store(vllm_catalog(), next(_stores))
    earlier = store.reader().snapshot()
    time.sleep(0.002)
    writer = record_vllm(store, model, reason, amounts)
    text = RedisCollector(store.reader()).render_text()
    assert self_metrics(text)["redis_stats_up", ()] == 1.0
    clean_text, clean_earlier, clean_now = clean_vllm()
    control = engine_samples(clean_text, "1")
    assert_shown(engine_samples(text, "1"), control)  # the control engine, exactly as alone
    assert_shown(
        {
            k: v
            for k, v in samples(parse_om(openmetrics_from_text(text))).items()
            if dict(k[1])["engine"] == "1"
        },
        control,
    )
    hostile = engine_samples(text, "0")
    taken = is_text(model) and len(model) <= CAP
    if not taken:  # model_name is on every series: none of engine 0's is stored, each drop counted
        assert hostile == {}
        assert not is_text(model) or writer.drops.get("label_too_long")
    else:
        labels = (("engine", "0"), ("model_name", model))
        running, prompt, ttft = amounts
        if gauge_part(running) is not None:
            assert same(hostile["vllm:num_requests_running", labels], gauge_part(running))
        assert same(hostile["vllm:prompt_tokens_total", labels], float(counter_part(prompt)))
        counts, total = histogram_part(ttft)
        assert hostile["vllm:time_to_first_token_seconds_count", labels] == sum(counts)
        assert same(hostile["vllm:time_to_first_token_seconds_sum", labels], total)
        why = reason.encode("utf-8", "replace").decode("utf-8").lower()  # a lone surrogate: "?"
        if len(why) <= CAP:
            key = (
                "vllm:request_success_total",
                tuple(sorted({**dict(labels), "finished_reason": why}.items())),
            )
            assert hostile[key] == 1
    now = store.reader().snapshot()
    doc = strict(snapshot_document(now, earlier, requested=30.0, summary=VLLM_FLEET_SUMMARY), "snapshot")
    want_1 = {
        k: v
        for k, v in snapshot_values(
            strict(snapshot_document(clean_now, None, requested=30.0), "snapshot")
        ).items()
        if dict(k[1])["engine"] == "1"
    }
    assert_shown({k: v for k, v in snapshot_values(doc).items() if dict(k[1])["engine"] == "1"}, want_1)
    names = [
        "vllm:generation_tokens",
        "vllm:prompt_tokens",
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds",
    ]
    strict(
        snapshot_document(
            now, earlier, requested=30.0, summary=VLLM_FLEET_SUMMARY, names=names, buckets=False
        ),
        "snapshot",
    )
    load = strict(store.reader().load().to_dict(), "load")
    assert load["engines"]["1"]["requests_running"] == 2 and load["engines"]["1"]["kv_cache_usage"] == 0.25
    assert running_cells(render_plain(earlier, now), "1") == running_cells(
        render_plain(clean_earlier, clean_now), "1"
    )
    texts = [fmt % tuple(args) for _level, fmt, args in VllmLogLines()(earlier, now)]
    assert any(
        t.startswith("Engine 001: ") and "Running: 2 reqs, Waiting: 1 reqs, GPU KV cache usage: 25.0%" in t
        for t in texts
    )
    monkeypatch.setattr(inspection, "make_client", lambda config: store.client())
    lines = list(inspection.inspect_namespace(store.config, store.catalog))
    assert any(x.strip().startswith("engine 1: up, ") for x in lines)


# -- the bridge, from a real prometheus_client source over HTTP ---------------------------------


class Source:
    """A prometheus_client HTTP server on loopback whose registry each example replaces."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        outer = CollectorRegistry(auto_describe=False)
        outer.register(self)
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=outer)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"

    def collect(self) -> Any:
        return self.registry.collect()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def source():
    made = Source()
    yield made
    made.close()


def serve_source(source: Source, label: str, amounts: tuple[float, float, float]) -> None:
    """The source's families: a counter, a gauge and a histogram, each with the hostile label
    value and a control one, recorded with prometheus_client's own objects."""
    reg = CollectorRegistry()
    c = Counter("src_requests", "Requests.", ["a"], registry=reg)
    g = Gauge("src_running", "Running.", ["a"], registry=reg)
    h = Histogram("src_latency_seconds", "Latency.", ["a"], buckets=BUCKETS, registry=reg)
    for value, (cv, gv, hv) in ((label, amounts), ("control", (5, 3.0, 0.25))):
        if cv >= 0:  # prometheus_client refuses a negative increment itself
            c.labels(value).inc(cv)
        g.labels(value).set(gv)
        h.labels(value).observe(hv)
    source.registry = reg


SOURCE_LABELS = LABELS.filter(is_text)  # a source cannot serve a lone surrogate
FLOATS = st.one_of(st.sampled_from([x for x in EDGES if isinstance(x, float)]), st.floats())


@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(label=SOURCE_LABELS, amounts=st.tuples(FLOATS, FLOATS, FLOATS))
@example(label="100%", amounts=(1.7e308, -1.7e308, 0.5))
@example(label="x" * (CAP + 1), amounts=(1.0, 1.0, 1.0))
def test_the_bridge_through_every_view(source, fmt, label, amounts):
    if fmt == "openmetrics" and not amounts[2] >= 0:
        amounts = (*amounts[:2], 0.5)  # (prometheus_client's own OpenMetrics parser refuses a negative _sum)
    serve_source(source, label, amounts)
    store = Store(Catalog(), next(_stores))
    bridged = BridgedSource(source.url, store.config, client=store.client(), accept=fmt)
    assert bridged.scrape(), bridged.stats
    body, content_type = get(source.url, ACCEPT[fmt])
    want = source_samples(body, content_type)
    got = store_samples(store.config, client=store.client())
    control = {k: v for k, v in want.items() if ("a", "control") in k[1]}
    assert_shown({k: v for k, v in got.items() if ("a", "control") in k[1]}, control)
    if len(label) > CAP:  # refused as too long by the bridge's writer: counted, the rest stored
        assert_shown(got, control)
        assert bridged.writer.drops.get("label_too_long")
    else:  # each series as the source shows it, or left out and said (a value the store cannot take)
        left_out = set(want) - set(got)
        assert_shown({k: v for k, v in got.items()}, {k: v for k, v in want.items() if k not in left_out})
        for name, labels in left_out:
            value = want[name, labels]
            if name == "src_running":  # a NaN gauge: dropped by the writer and counted
                assert math.isnan(value) and bridged.writer.drops.get("invalid_value")
            else:  # a counter at +Inf, a histogram whose sum is NaN: the series is left out, said
                assert any(k.startswith(name.rsplit("_", 1)[0]) for k in bridged.stats.skipped), bridged.stats
    text = RedisCollector(StatsReader(store.config, client=store.client())).render_text()
    assert_shown(
        samples(parse_om(openmetrics_from_text(text))),
        {
            k: v
            for k, v in got.items()
            if not (k[0] != "src_running" and (math.isnan(v) or v < 0))
            and not (
                k[0].endswith("_count")
                and (k[0][:-6] + "_sum", k[1]) in got
                and not got[k[0][:-6] + "_sum", k[1]] >= 0
            )
        },
    )
    now = StatsReader(store.config, client=store.client()).snapshot()
    doc = strict(snapshot_document(now, None, requested=30.0), "snapshot")
    assert_shown({k: v for k, v in snapshot_values(doc).items() if ("a", "control") in k[1]}, control)
    bridged.writer._closed = True


# -- one pass through a real server and the exporter's HTTP ---------------------------------------

E2E_LABELS = ["100%", "%s", "%d", "%%", "{0}", "\\", '"', "a\nb", "é\U0001f600", "x" * CAP, "x" * (CAP + 1)]


def http_get(url: str, accept: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, resp.read()


@pytest.mark.redis_server
def test_every_view_over_http_from_a_real_server(redis_server, namespace, monkeypatch):
    """Hostile label values and amounts at the float's limits, recorded into a real redis-server,
    read through the exporter's HTTP (/metrics in both formats, /snapshot, the live page's
    request, /load) and the CLI (top --once, inspect): every view answers, whole, and shows each
    series as recorded (or leaves it out and counts it)."""
    config = StatsConfig(url=redis_server.url, namespace=namespace, max_label_length=CAP)
    cat = library_catalog()
    amounts = [(2**64 + 1, 1.7e308, -2.0), (I64, 1.7e308, 1.7e308)]
    want: dict = {}
    for i, (c, g, h) in enumerate(amounts):
        w = StatsWriter(config, cat, engines=[0, 1], start=False, role=f"w{i}", load=LOAD)
        for label in ["control", *E2E_LABELS]:
            engine = 1 if label == "control" else 0
            if label == "control":
                c_, g_, h_ = CONTROL["c"], CONTROL["g"], CONTROL["h"]
            else:
                c_, g_, h_ = c, g, h
            w.metric("c").labels(engine, a=label).inc(c_)
            w.metric("g").labels(engine, a=label).set(g_)
            w.metric("h").labels(engine, a=label).observe(h_)
        assert w.flush()
        w._closed = True
    for label in ["control", *E2E_LABELS]:
        rows = [(CONTROL["c"], CONTROL["g"], CONTROL["h"])] * 2 if label == "control" else amounts
        if len(label) <= CAP:  # longer: refused by the writers, counted
            want.update(one_series("1" if label == "control" else "0", label, *map(list, zip(*rows))))
    exporter = Exporter(StatsReader(config, cat), port=0, window=2.0).start()
    try:
        status, text = http_get(exporter.url + "/metrics")
        assert status == 200 and self_metrics(text.decode())["redis_stats_up", ()] == 1.0
        assert_shown(samples(parse_text(text.decode())), want)
        _, om = http_get(exporter.url + "/metrics", "application/openmetrics-text; version=1.0.0")
        unfit = {k for k, v in want.items() if k[0] != "g" and (math.isnan(v) or v < 0)}
        unfit |= {("h_count", k[1]) for k in unfit if k[0] == "h_sum"}
        assert_shown(samples(parse_om(om.decode())), {k: v for k, v in want.items() if k not in unfit})
        _, body = http_get(exporter.url + "/snapshot")
        doc = json.loads(body)
        jsonschema.Draft202012Validator(SCHEMAS["snapshot"]).validate(doc)
        assert_shown(snapshot_values(doc), {k: float(v) for k, v in want.items()})
        _, body = http_get(exporter.url + "/snapshot?buckets=0&name[]=c&name[]=g&name[]=h")
        page = json.loads(body)
        assert_shown(snapshot_values(page), {k: float(v) for k, v in want.items() if k[0] != "h_bucket"})
        assert page["fleet"]["gauges"]["g"]["sum"] == "+Inf"  # engine 0's gauges at 2 x 1.7e308 each
        deadline = time.monotonic() + 10
        while True:
            status, body = http_get(exporter.url + "/load")
            load = json.loads(body)
            if (
                status == 200 and load["engines"]["1"]["requests_running"] is not None
            ) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        jsonschema.Draft202012Validator(SCHEMAS["load"]).validate(load)
        assert load["engines"]["1"]["requests_running"] == 2 * CONTROL["g"]
        # Engine 0: each writer's series add up past the float range, which an entry does not store
        assert load["engines"]["0"]["requests_running"] is None
        assert load["fleet"]["requests_running"] == {"sum": 6, "mean": 6, "max": 6, "engines": 1}
        # /watch's state: the same numbers from the feed's own read, strict JSON too
        status, body = http_get(exporter.url + "/watch")
        assert status == 200 and b"NaN" not in body and b"Infinity" not in body, body[:300]
        watch = json.loads(body)
        assert watch["engines"]["1"]["requests_running"] == 2 * CONTROL["g"]
        assert watch["engines"]["0"]["requests_running"] is None
    finally:
        exporter.close()
    env = {"REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    runner = CliRunner()
    top = runner.invoke(main, ["top", "--once", "--interval", "0.2"], env=env)
    assert top.exit_code == 0, top.output
    assert any(line.split()[:2] == ["1", "up"] for line in top.output.splitlines()), top.output
    shown = runner.invoke(main, ["inspect"], env=env)
    assert shown.exit_code == 0, shown.output
    assert "engine 0: up" in shown.output and "engine 1: up" in shown.output
    as_json = runner.invoke(main, ["inspect", "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    assert_shown(snapshot_values(json.loads(as_json.output)), {k: float(v) for k, v in want.items()})
