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
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats import StatsReader, StatsWriter
from redis_stats.exporter import Exporter

from .conftest import sample_catalog

PATHS = ["/metrics", "/snapshot", "/healthz", "/no-such-path"]
# What Prometheus 2.x/3.x sends by default: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
# Lines whose value changes on every scrape (how long the read took, how old the data is).
VOLATILE = re.compile(r"^redis_stats_\w*(duration_seconds|age_seconds)\w*[{ ]", re.M)


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
