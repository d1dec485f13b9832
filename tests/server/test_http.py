"""The exporter's HTTP, as prometheus_client's own server behaves: HEAD, gzip, OpenMetrics on
request, and a timeout that frees the thread of an idle connection."""

from __future__ import annotations

import gzip
import http.client
import json
import re
import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats import StatsReader, StatsWriter
from redis_stats.server import Exporter
from tests.conftest import sample_catalog
from tests.server import states

PATHS = ["/metrics", "/snapshot", "/healthz", "/no-such-path"]
# What Prometheus 2.x/3.x sends by default: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
# Lines whose value changes on every scrape (how long the read took, how old the data is).
VOLATILE = re.compile(
    r"^redis_stats_(\w*(duration_seconds|age_seconds)\w*|store_used_memory_bytes)[{ ]", re.M
)


@pytest.fixture
def exporter(config, fake_client):
    cat = sample_catalog()
    writer = StatsWriter(config, cat, engines=[0, 1], client=fake_client(), start=False)
    writer.counter("tokens").labels(engine=0).inc(5)
    writer.counter("requests").labels(engine=1, reason="stop").inc(2)
    writer.gauge("running").labels(engine=0).set(3)
    for v in (0.05, 0.2, 7.0):
        writer.histogram("latency_seconds").labels(engine=1).observe(v)
    assert writer.flush()
    server = Exporter(StatsReader(config, cat, client=fake_client()), port=0, request_timeout=0.5).start()
    yield server
    server.close()
    writer._closed = True


def request(exporter: Exporter, path: str, method: str = "GET", **headers: str):
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=10)
    try:
        conn.request(method, path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        resp = conn.getresponse()
        return resp.status, dict(resp.headers), resp.read()
    finally:
        conn.close()


def stable(body: bytes, path: str) -> object:
    """The body without the values that change between two requests."""
    if path == "/snapshot":

        def strip(doc: object) -> object:
            if isinstance(doc, dict):
                return {k: strip(v) for k, v in doc.items() if k != "time" and "age" not in k}
            if isinstance(doc, list):
                return [strip(v) for v in doc]
            return doc

        return strip(json.loads(body))
    return [line for line in body.decode().splitlines() if not VOLATILE.match(line)]


@pytest.mark.parametrize("path", PATHS)
def test_head_answers_every_get_path_with_its_headers_and_no_body(exporter, path):
    status, headers, body = request(exporter, path)
    head_status, head_headers, head_body = request(exporter, path, "HEAD")
    assert head_status == status != 501
    assert head_body == b""
    assert head_headers["Content-Type"] == headers["Content-Type"]
    # Same length as the GET body (the volatile numbers of /metrics keep their width or close).
    assert abs(int(head_headers["Content-Length"]) - len(body)) <= 16


@pytest.mark.parametrize("path", PATHS)
def test_gzip_when_accepted_and_the_same_body(exporter, path):
    status, headers, plain = request(exporter, path)
    gz_status, gz_headers, packed = request(exporter, path, Accept_Encoding="gzip, deflate")
    assert gz_status == status
    assert gz_headers["Content-Encoding"] == "gzip" and "Content-Encoding" not in headers
    assert "Accept-Encoding" in gz_headers["Vary"]
    assert int(gz_headers["Content-Length"]) == len(packed)
    assert stable(gzip.decompress(packed), path) == stable(plain, path)
    # No gzip when the client does not list it (identity only).
    _, id_headers, _ = request(exporter, path, Accept_Encoding="identity")
    assert "Content-Encoding" not in id_headers


def test_openmetrics_on_request(exporter):
    _, headers, body = request(exporter, "/metrics", Accept=PROMETHEUS_ACCEPT)
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in parse_openmetrics(text)}  # strict: raises on any error
    # Counters: the family has no _total, its samples do.
    assert "# TYPE tokens counter" in text and "# TYPE tokens_total" not in text
    assert [(s.name, s.labels, s.value) for s in families["tokens"].samples] == [
        ("tokens_total", {"engine": "0"}, 5.0)
    ]
    hist = {(s.name, s.labels.get("le")): s.value for s in families["latency_seconds"].samples}
    assert hist[("latency_seconds_bucket", "+Inf")] == hist[("latency_seconds_count", None)] == 3
    # The same samples as the Prometheus text (the fast path), volatile self-metrics aside.
    _, text_headers, plain = request(exporter, "/metrics")
    assert text_headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"

    def samples(fams):
        return sorted(
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for f in fams
            for s in f.samples
            if not VOLATILE.match(s.name + " ") and not s.name.endswith("_created")
        )

    assert samples(families.values()) == samples(parse_text(plain.decode()))


def reference_openmetrics(exporter: Exporter) -> str:
    """prometheus_client's own OpenMetrics writer over the collector's collect()."""
    from prometheus_client.openmetrics.exposition import generate_latest

    return generate_latest(states.source(exporter).collector).decode()


def same_openmetrics(fast: str, reference: str) -> None:
    """Metadata lines byte for byte, samples by parsed value (the fast path writes 5, not 5.0),
    each family's samples in the same order and number (a parser alone would accept a series
    twice). Families may come in another order (the fast path puts the per-engine self-metrics
    first): OpenMetrics does not order families."""

    def split(text: str):
        meta = sorted(line for line in text.splitlines() if line.startswith("#"))
        families = sorted(
            (
                f.name,
                f.type,
                f.documentation,
                [
                    (s.name, tuple(sorted(s.labels.items())), s.value)
                    for s in f.samples
                    if not VOLATILE.match(s.name + " ")
                ],
            )
            for f in parse_openmetrics(text)
        )
        return meta, families

    assert text_end(fast) == text_end(reference) == "# EOF\n"
    assert split(fast) == split(reference)


def text_end(text: str) -> str:
    return text[-6:]


def test_openmetrics_is_what_prometheus_client_writes(exporter):
    _, _, body = request(exporter, "/metrics", Accept=PROMETHEUS_ACCEPT)
    same_openmetrics(body.decode(), reference_openmetrics(exporter))


def test_openmetrics_help_escaping_and_odd_label_values(config, fake_client):
    from redis_stats import Catalog

    cat = Catalog()
    cat.counter("odd", 'Help with "quotes", a back\\slash\nand a newline.', labels=["who"])
    cat.gauge("g_total", "A gauge whose name ends in _total.")
    cat.histogram("h", 'Histogram "h".', buckets=(0.1, 1.0))
    writer = StatsWriter(config, cat, engines=[0], client=fake_client(), start=False)
    writer.counter("odd").labels(engine=0, who='a "b" \\ c\nd').inc(2)
    writer.gauge("g_total").labels(engine=0).set(float("inf"))
    writer.histogram("h").labels(engine=0).observe(0.5)
    assert writer.flush()
    server = Exporter(StatsReader(config, cat, client=fake_client()), port=0).start()
    try:
        _, _, body = request(server, "/metrics", Accept=PROMETHEUS_ACCEPT)
        text = body.decode()
        assert '# HELP odd Help with \\"quotes\\"' in text and "# TYPE g_total gauge" in text
        same_openmetrics(text, reference_openmetrics(server))
    finally:
        server.close()
        writer._closed = True


def test_other_openmetrics_versions_come_from_prometheus_client(exporter):
    _, headers, body = request(exporter, "/metrics", Accept="application/openmetrics-text;version=2.0.0")
    assert "version=2.0.0" in headers["Content-Type"]
    assert body.decode().endswith("# EOF\n") and "# TYPE tokens counter" in body.decode()


def test_openmetrics_gzip_decompresses_to_the_openmetrics_body(exporter):
    _, headers, packed = request(exporter, "/metrics", Accept=PROMETHEUS_ACCEPT, Accept_Encoding="gzip")
    _, _, plain = request(exporter, "/metrics", Accept=PROMETHEUS_ACCEPT)
    assert headers["Content-Encoding"] == "gzip"
    assert stable(gzip.decompress(packed), "/metrics") == stable(plain, "/metrics")


@pytest.mark.parametrize(
    "accept", [None, "text/plain;version=0.0.4", "text/plain", "*/*", "application/json"]
)
def test_prometheus_text_otherwise(exporter, accept):
    headers = {"Accept": accept} if accept else {}
    _, got, body = request(exporter, "/metrics", **headers)
    assert got["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = body.decode()
    assert "# EOF" not in text and re.search(r'^tokens_total\{engine="0"\} 5(\.0)?$', text, re.M)


def test_an_idle_connection_is_closed_after_the_timeout_and_frees_its_thread(exporter):
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", exporter.port), timeout=10) for _ in range(5)]
    time.sleep(0.2)
    assert threading.active_count() >= before + 5  # one handler thread each, waiting
    started = time.monotonic()
    for s in idle:
        assert s.recv(1) == b""  # the server closed it (a hung connection would raise timeout)
        s.close()
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before
    # And the server still answers.
    assert request(exporter, "/healthz")[0] == 200


def test_a_slow_request_gets_the_same_timeout(exporter):
    # Half a request line, then silence: closed too (HTTP 408 is not sent by http.server).
    s = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
    s.sendall(b"GET /metr")
    assert s.recv(1) == b""
    s.close()


def test_request_timeout_must_be_positive(config):
    with pytest.raises(ValueError, match="request_timeout"):
        Exporter(StatsReader(config, sample_catalog()), port=0, request_timeout=0)


@settings(max_examples=200, deadline=None)
@given(
    helps=st.lists(st.text(), min_size=3, max_size=3),
    value=st.text(),
    number=st.floats(allow_nan=False) | st.integers(0, 2**53).map(float),
)
def test_openmetrics_from_text_matches_prometheus_client(helps, value, number):
    # Any help text and label value through prometheus_client's two writers: converting its text
    # gives its OpenMetrics, byte for byte.
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.exposition import generate_latest as text_latest
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    from redis_stats.prometheus.openmetrics import openmetrics_from_text

    class Families:
        def collect(self):
            c = CounterMetricFamily("c", helps[0], labels=["l"])
            c.add_metric([value], abs(number))
            yield c
            g = GaugeMetricFamily("g_total", helps[1], labels=["l"])
            g.add_metric([value], number)
            yield g
            h = HistogramMetricFamily("h", helps[2], labels=["l"])
            h.add_metric([value], [("1.0", 1), ("+Inf", 2)], sum_value=abs(number))
            yield h

    assert openmetrics_from_text(text_latest(Families()).decode()) == om_latest(Families()).decode()


MALFORMED_ACCEPT = [
    "application/openmetrics-text; version=abc",
    "application/openmetrics-text; version=1.x",
    "application/openmetrics-text; version=1.0.0.\x01",
    "application/openmetrics-text; version=\x01",
    "application/openmetrics-text; version=1.0.0.x; charset=utf-8",
    "text/plain; version=abc",
    "application/openmetrics-text; version=\u0661.0.0",  # an Arabic-Indic digit: int() takes it
]


@pytest.mark.parametrize("accept", MALFORMED_ACCEPT)
def test_a_malformed_accept_gets_the_text_format_not_a_500_nor_a_logged_traceback(exporter, accept, caplog):
    caplog.set_level("DEBUG", logger="redis_stats")
    status, headers, body = request(exporter, "/metrics", Accept=accept.encode("utf-8").decode("latin-1"))
    assert status == 200, body
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name for f in parse_text(body.decode())}
    assert "tokens" in families
    assert not [r for r in caplog.records if r.levelno >= 30], [r.getMessage() for r in caplog.records]


@settings(max_examples=200, deadline=None)
@given(
    version=st.text(max_size=12), escaping=st.sampled_from(["", "; escaping=zz", "; escaping=allow-utf-8"])
)
def test_no_accept_header_raises_or_is_echoed_unchecked(version, escaping):
    from redis_stats.prometheus.openmetrics import negotiate

    _, content_type = negotiate(f"application/openmetrics-text; version={version}{escaping}")
    # What goes back in Content-Type is prometheus_client's own text or three ASCII numbers.
    assert re.fullmatch(r"[a-z/.=; 0-9_-]+", content_type), content_type


def test_a_body_gzipped_a_slice_at_a_time_is_the_whole_text_exactly():
    """/metrics and /snapshot bodies are compressed from the text in slices (no whole copy as
    bytes); a slice boundary inside non-ASCII text must not change a byte."""
    import gzip as gzip_module

    from redis_stats.server import http as exporter_module

    text = ('vllm:x{model_name="é✓"} 1\n' * 5) + "ü" * 3 + "z" * 7
    old = exporter_module.ENCODE_CHUNK
    exporter_module.ENCODE_CHUNK = 4  # many slices, boundaries between multi-byte characters
    try:
        body, size = exporter_module.encode_body(text, True)
    finally:
        exporter_module.ENCODE_CHUNK = old
    assert gzip_module.decompress(body) == text.encode() and size == len(text.encode())
    assert exporter_module.encode_body(text, False) == (text.encode(), len(text.encode()))


def test_openmetrics_leaves_out_a_negative_histogram_sum_and_counts_it(config, catalog, fake_client):
    """OpenMetrics holds a histogram's _sum and _count to be counters (never below 0, never NaN),
    and prometheus_client's parser refused the whole body for one negative observation: every
    series of every engine unreadable. Now that sum (and its _count) are left out and counted."""
    writer = StatsWriter(config, catalog, engines=[0, 1], client=fake_client(), start=False)
    writer.histogram("latency_seconds").labels(engine=0).observe(-2.0)
    writer.histogram("latency_seconds").labels(engine=1).observe(0.3)
    writer.gauge("running").labels(engine=0).set(-5)  # a gauge below 0 is a gauge: kept
    assert writer.flush()
    exporter = Exporter(StatsReader(config, catalog, client=fake_client()), port=0).start()
    _, _, body = request(exporter, "/metrics", Accept="application/openmetrics-text; version=1.0.0")
    got = {
        (s.name, s.labels.get("engine")): s.value for f in parse_openmetrics(body.decode()) for s in f.samples
    }
    assert ("latency_seconds_sum", "0") not in got and ("latency_seconds_count", "0") not in got
    assert got[("latency_seconds_bucket", "0")] == 1  # its buckets stay (the +Inf one is its count)
    assert got[("latency_seconds_sum", "1")] == 0.3 and got[("latency_seconds_count", "1")] == 1
    assert got[("running", "0")] == -5
    assert got[("redis_stats_openmetrics_samples_omitted", None)] == 2
    _, _, text = request(exporter, "/metrics", Accept="text/plain")
    exporter.close()
    assert 'latency_seconds_sum{engine="0"} -2.0' in text.decode()  # the text format carries it
    writer._closed = True
