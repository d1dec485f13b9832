"""Bounded scrapes (redis_stats/server/views/metrics.py, redis_stats/prometheus/filters.py):
``?slice=i/N`` reads and serves only its engines and the N slices are the whole view; ``name[]=``
keeps what prometheus_client's server keeps; a label value past ``max_label_length`` is replaced
and counted."""

from __future__ import annotations

import http.client
import json
import re
from collections import Counter

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.prometheus.collector import RedisCollector
from redis_stats.prometheus.filters import PER_SCRAPE, select_samples, short_label
from redis_stats.reader import EngineSlice
from redis_stats.server import Exporter
from redis_stats.tools.cli import main
from tests.conftest import sample_catalog, scripted_client

pytestmark = pytest.mark.redis_server

ENGINES = 13
VOLATILE = re.compile(r"^redis_stats_(\w*(duration_seconds|age_seconds)\w*|store_used_memory_bytes)[{ ]")


def get(exporter: Exporter, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def samples(text: str) -> Counter[str]:
    """The sample lines of a body, but each scrape's own and those whose value moves."""
    return Counter(
        line
        for line in text.splitlines()
        if line and not line.startswith("#") and not line.startswith(PER_SCRAPE) and not VOLATILE.match(line)
    )


def parsed(text: str) -> set[tuple]:
    """Every sample of a body (as prometheus_client parses it), but the volatile ones."""
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.startswith(PER_SCRAPE) and not VOLATILE.match(s.name + " ")
    }


@pytest.fixture
def fleet(redis_server, namespace):
    config = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.05)
    cat = sample_catalog()
    writers = []
    for api in range(2):
        writer = StatsWriter(config, cat, engines=list(range(ENGINES)), start=False, role=f"api{api}")
        for e in range(ENGINES):
            writer.counter("tokens").labels(engine=e).inc(100 * e + api + 1)
            writer.counter("requests").labels(engine=e, reason="stop").inc(e + 1)
            writer.gauge("running").labels(engine=e).set(e)
            writer.histogram("latency_seconds").labels(engine=e).observe(0.01 * (e + 1))
        assert writer.flush()
        writers.append(writer)
    exporter = Exporter(StatsReader(config, cat), port=0).start()
    yield config, cat, exporter
    exporter.close()
    for writer in writers:
        writer.close()


def test_the_slices_together_are_the_whole_view_and_each_holds_its_engines(fleet):
    _, _, exporter = fleet
    status, whole = get(exporter, "/metrics")
    assert status == 200
    parts = []
    for i in range(4):
        status, text = get(exporter, f"/metrics?slice={i}/4")
        assert status == 200, text
        engines = {int(m) for m in re.findall(r'engine="(\d+)"', text)}
        assert engines == {e for e in range(ENGINES) if e % 4 == i}
        assert ("redis_stats_writer_up{" in text) == (i == 0), "the writers' self-metrics: slice 0 only"
        assert "redis_stats_up 1.0" in text  # every slice says how its own scrape went
        parts.append(samples(text))
    union = sum(parts, Counter())
    assert max(union.values()) == 1, "a sample in two slices"
    assert union == samples(whole)


def test_a_slice_reads_only_its_engines_from_redis(fleet):
    config, cat, _ = fleet
    reader = StatsReader(config, cat)
    (whole,) = reader.read().shards  # one shard
    (part,) = reader.read(EngineSlice(1, 4)).shards
    n_writers = len(part.writers) // 2
    assert n_writers == 2
    listed = part.engines[0::2]
    assert listed == [str(e) for e in range(ENGINES) if e % 4 == 1]
    # the reply holds those engines' hashes and the writers' stats, nothing of the others
    assert (len(part.hashes), len(part.stats)) == (len(listed), n_writers)
    assert (len(whole.hashes), len(whole.stats)) == (ENGINES, n_writers)
    # read.lua (a Cluster, or a server over maxmemory) reads the same engines
    (scripted,) = StatsReader(config, cat, client=scripted_client(config.url)).read(EngineSlice(1, 4)).shards
    assert scripted.engines[0::2] == listed
    assert (len(scripted.hashes), len(scripted.stats)) == (len(part.hashes), len(part.stats))
    assert sorted(reader.snapshot(EngineSlice(1, 4)).engines) == [1, 5, 9]


def test_name_selection_keeps_what_prometheus_clients_server_keeps(fleet):
    config, cat, exporter = fleet
    names = ["tokens_total", "latency_seconds_bucket", "redis_stats_engine_up", "no_such_sample"]
    query = "&".join(f"name[]={n}" for n in names)
    status, ours = get(exporter, f"/metrics?{query}")
    assert status == 200
    # (a collector that names no metrics before reading, as ours, is asked only with this flag)
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(RedisCollector(StatsReader(config, cat)))
    theirs = generate_latest(registry.restricted_registry(names)).decode()
    assert parsed(ours) == parsed(theirs)
    assert len(parsed(ours)) == 2 * ENGINES + 5 * ENGINES  # tokens, engine_up, 5 buckets each
    assert {line.split()[2] for line in ours.splitlines() if line.startswith("# TYPE")} == {
        "tokens_total",
        "latency_seconds",
        "redis_stats_engine_up",
    }
    # A family name keeps the whole family (an extension: prometheus_client keeps none of a histogram)
    _, family = get(exporter, "/metrics?name[]=latency_seconds")
    assert {line.split("{")[0] for line in samples(family)} == {
        "latency_seconds_bucket",
        "latency_seconds_sum",
        "latency_seconds_count",
    }


def test_a_label_value_past_the_cap_is_replaced_and_counted(redis_server, namespace):
    cat = sample_catalog()
    loose = StatsConfig(url=redis_server.url, namespace=namespace, max_label_length=200_000)
    writer = StatsWriter(loose, cat, engines=[0], start=False)
    long_a, long_b = "a" * 50_000, "a" * 49_999 + "b"  # the same first characters: two series still
    writer.counter("requests").labels(engine=0, reason=long_a).inc(1)
    writer.counter("requests").labels(engine=0, reason=long_b).inc(2)
    writer.counter("requests").labels(engine=0, reason="stop").inc(3)
    assert writer.flush()
    reader_config = StatsConfig(url=redis_server.url, namespace=namespace)  # max_label_length 1,024
    exporter = Exporter(StatsReader(reader_config, cat), port=0).start()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisCollector(StatsReader(reader_config, cat)))
    try:
        status, text = get(exporter, "/metrics")
        theirs = generate_latest(registry).decode()  # the prometheus_client path replaces alike
    finally:
        exporter.close()
        writer.close()
    assert status == 200
    assert len(text) < 20_000, len(text)
    lines = [line for line in text.splitlines() if line.startswith("requests_total{")]
    assert len(lines) == 3 and len(set(lines)) == 3
    assert 'reason="stop"' in text
    assert max(len(line) for line in lines) < 200
    assert "redis_stats_label_values_replaced 2.0" in text
    assert "redis_stats_label_values_replaced 2.0" in theirs
    assert parsed(theirs) == parsed(text)


def test_every_view_of_a_read_shows_the_same_replaced_label_value(redis_server, namespace):
    # Replaced where the read is decoded: the snapshot (/snapshot, top, the live page) shows what
    # /metrics shows, escapes and all; short values are left as they are.
    cat = sample_catalog()
    loose = StatsConfig(url=redis_server.url, namespace=namespace, max_label_length=200_000)
    writer = StatsWriter(loose, cat, engines=[0], start=False)
    long_value = '\\"\n' * 700  # 2,100 characters of what the text format escapes
    writer.counter("requests").labels(engine=0, reason=long_value).inc(1)
    writer.counter("requests").labels(engine=0, reason="stop").inc(3)
    assert writer.flush()
    writer.close()
    reader = StatsReader(StatsConfig(url=redis_server.url, namespace=namespace), cat)
    snap = reader.snapshot()
    assert snap.labels_replaced == 1
    short = short_label(long_value, 1024)
    assert short.startswith(long_value[:64]) and short.endswith("]") and len(short) < 100
    assert snap.engines[0].counter("requests", short) == 1
    assert snap.engines[0].counter("requests", "stop") == 3
    text = RedisCollector(reader).render_text()
    assert 'reason="' + short.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"' in text
    assert "redis_stats_label_values_replaced 1.0" in text


def test_select_keeps_headers_only_of_kept_families():
    text = "# HELP a x\n# TYPE a counter\na_total 1\n# HELP b y\n# TYPE b gauge\nb 2\n"
    assert select_samples(text, ["b"]) == "# HELP b y\n# TYPE b gauge\nb 2\n"
    assert select_samples(text, ["c"]) == ""


@pytest.mark.parametrize("bad", ["4/4", "x", "1/0", "-1/4", "1/4&slice=2/4"])
def test_a_bad_slice_is_refused_naming_it(fleet, bad):
    _, _, exporter = fleet
    status, text = get(exporter, f"/metrics?slice={bad}")
    assert status == 400
    assert "slice" in json.loads(text)["error"]


def test_cli_refuses_a_bad_slice():
    result = CliRunner().invoke(main, ["exporter", "--slice", "4/4", "--port", "0"])
    assert result.exit_code != 0
    assert "--slice" in result.output and "0 <= i < N" in result.output


def test_an_exporter_of_one_slice_serves_it_on_every_path(fleet):
    config, cat, _ = fleet
    exporter = Exporter(StatsReader(config, cat), port=0, slice=EngineSlice(2, 4)).start()
    try:
        status, text = get(exporter, "/metrics")
        assert status == 200
        assert {int(m) for m in re.findall(r'engine="(\d+)"', text)} == {2, 6, 10}
        assert "redis_stats_writer_up{" not in text  # slice 0's
        status, body = get(exporter, "/snapshot")
        assert status == 200 and sorted(json.loads(body)["engines"]) == ["10", "2", "6"]
        status, body = get(exporter, "/load")
        assert status == 200 and sorted(json.loads(body)["engines"]) == ["10", "2", "6"]
        assert get(exporter, "/metrics?slice=1/4")[0] == 400  # one slice only: no other
    finally:
        exporter.close()
    with pytest.raises(ValueError, match="give one"):
        Exporter(StatsReader(config, cat), port=0, engines=[1], slice=EngineSlice(0, 2))
