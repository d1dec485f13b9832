"""``POST /bookings``: the HTTP form of router bookings, for routers not written in Python."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.errors import WebConfigError
from redis_stats.server import Exporter
from tests.probes import until
from tests.server.test_load_feed import LOAD, catalog, record

pytestmark = pytest.mark.redis_server


def post(port: int, target: str, body: bytes | None = None, method: str = "POST") -> tuple[int, dict]:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request(method, target, body=body)
    resp = conn.getresponse()
    doc = json.loads(resp.read() or b"{}")
    conn.close()
    return resp.status, doc


@pytest.fixture
def setup(redis_server, namespace):  # type: ignore[no-untyped-def]
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.2, stale_after=5.0)
    writer = StatsWriter(cfg, catalog(), engines=[0, 1], role="fe", load=LOAD)
    record(writer, 0, 0, 0, 0.1)
    record(writer, 1, 0, 0, 0.1)
    exporter = Exporter(StatsReader(cfg), port=0, bookings=True, insecure_private_views=True).start()
    reader = StatsReader(cfg)
    assert until(lambda: len(reader.load().engines) == 2)
    yield exporter, reader
    exporter.close()
    writer.close()


def test_a_router_books_renews_ends_and_releases_over_http(setup):  # type: ignore[no-untyped-def]
    exporter, reader = setup
    status, doc = post(exporter.port, "/bookings?op=book&router=go-1&engine=1&request_id=a&bound=30")
    assert (status, doc["lease_lost"]) == (200, True)  # a new router: the store had no lease for it
    status, doc = post(exporter.port, "/bookings?op=book&router=go-1&engine=1&request_id=b&bound=30")
    assert (status, doc["lease_lost"]) == (200, False)
    assert reader.load().engines[1].booked == 2
    assert post(exporter.port, "/bookings?op=renew&router=go-1")[1]["lease_lost"] is False
    assert post(exporter.port, "/bookings?op=end&router=go-1&engine=1&request_id=a")[1]["ended"] is True
    assert reader.load().engines[1].booked == 1
    assert post(exporter.port, "/bookings?op=release&router=go-1")[0] == 200
    assert reader.load().engines[1].booked == 0


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("/bookings?op=book&router=r&engine=-1&request_id=a", "engine='-1'"),
        ("/bookings?op=book&router=r&engine=x&request_id=a", "engine='x'"),
        ("/bookings?op=book&router=r&engine=1", "request_id=None"),
        ("/bookings?op=book&router=a|b&engine=1&request_id=a", "router="),
        ("/bookings?op=steal&router=r", "op='steal'"),
        ("/bookings?op=renew&router=r&lease=nan", "lease='nan'"),
        ("/bookings?op=book&router=r&engine=1&request_id=a&bound=1e9", "bound="),
        ("/bookings?op=book&router=r&engine=1&request_id=" + "x" * 300, "at most 256 bytes"),
    ],
)
def test_bad_parameters_are_a_400_naming_them_and_book_nothing(setup, target, words):  # type: ignore[no-untyped-def]
    exporter, reader = setup
    status, doc = post(exporter.port, target)
    assert status == 400 and words in doc["error"]
    assert all(e.booked == 0 for e in reader.load().engines.values())


def test_a_body_or_a_get_is_refused(setup):  # type: ignore[no-untyped-def]
    exporter, _ = setup
    status, doc = post(exporter.port, "/bookings?op=renew&router=r", body=b"op=book")
    assert status == 413 and "query string" in doc["error"]
    assert post(exporter.port, "/bookings?op=renew&router=r", method="GET")[0] == 405
    assert post(exporter.port, "/load", method="POST")[0] == 405
    # chunked: never read as a second request
    raw = socket.create_connection(("127.0.0.1", exporter.port), timeout=5)
    raw.sendall(
        b"POST /bookings?op=renew&router=r HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    answer = b""
    while chunk := raw.recv(65536):
        answer += chunk
    raw.close()
    assert answer.startswith(b"HTTP/1.0 413") and answer.count(b"HTTP/1.") == 1


def test_an_exporter_taking_bookings_without_credentials_refuses_to_start(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    with pytest.raises(WebConfigError, match="/bookings"):
        Exporter(StatsReader(cfg), port=0, bookings=True)
    plain = Exporter(StatsReader(cfg), port=0).start()  # without --bookings: no such service
    try:
        status, doc = post(plain.port, "/bookings?op=renew&router=r")
        assert status == 404 and "--bookings" in doc["error"]
    finally:
        plain.close()


def test_watch_carries_a_peers_booking_in_tens_of_milliseconds(setup):  # type: ignore[no-untyped-def]
    from redis_stats.bookings import Bookings

    _, reader = setup
    # the /load refresh slower than the bound below: the feed's own 20 ms reads carry bookings
    exporter = Exporter(StatsReader(reader.config), port=0, load_refresh=4.0).start()
    snap = get_json(exporter.url + "/watch")
    assert snap["engines"]["0"]["booked"] == 0
    router = Bookings(reader.config, router="peer", bound=30.0)
    try:
        booked_at = time.monotonic()
        router.book(0, "w-1")
        answer = get_json(f"{exporter.url}/watch?since={snap['seq']}&epoch={snap['epoch']}&wait=5")
        took = time.monotonic() - booked_at
        event = answer["events"][0]
        assert (event["engine"], event["booked"], event["expected_in_flight"]) == (0, 1, 1)
        assert took < 1.0  # the feed's 20 ms read, not the /load refresh (bench: tens of ms)
    finally:
        router.close()
        exporter.close()


def get_json(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_get_load_and_v1_loads_carry_arrivals_and_bookings(redis_server, namespace):
    from redis_stats.bookings import Bookings
    from redis_stats.writer import Arrivals

    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.2, stale_after=5.0)
    writer = StatsWriter(
        cfg.replace(endpoint="10.0.0.1:8000"), catalog(), engines=[0, 1], role="fe", load=LOAD
    )
    record(writer, 0, 2, 1, 0.1)  # running 2, waiting 1: what the engines' schedulers say
    record(writer, 1, 0, 0, 0.1)
    arrivals = Arrivals(writer)
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05).start()
    router = Bookings(cfg, router="peer", bound=30.0)
    try:
        held = [arrivals.begin(rank=0) for _ in range(4)]  # the front end holds 4 for engine 0
        router.book(1, "not-yet")
        url = exporter.url + "/get_load?endpoint=10.0.0.1:8000"
        assert until(lambda: answered(url).get("load") == 5)  # 4 in flight + 1 booked, not 2 + 1
        doc = get_json(url)
        assert (doc["running"], doc["waiting"], doc["in_flight"], doc["booked"]) == (2, 1, 4, 1)
        ranks = get_json(exporter.url + "/v1/loads?endpoint=10.0.0.1:8000")["loads"]
        assert [(r["in_flight"], r["booked"], r["expected_in_flight"]) for r in ranks] == [
            (4, 0, 4),
            (0, 1, 1),
        ]
        for arrival in held:
            arrival.end()
    finally:
        router.close()
        exporter.close()
        writer.close()


def answered(url: str) -> dict:  # type: ignore[type-arg]
    """The document at *url*, or {} while it answers an error (the feed's first read)."""
    try:
        return get_json(url)
    except urllib.error.HTTPError:
        return {}


def test_a_store_that_cannot_be_reached_is_a_503_saying_so(namespace):
    from redis_stats.tools.embedded import free_port

    cfg = StatsConfig(url=f"redis://127.0.0.1:{free_port()}/0", namespace=namespace, socket_timeout_ms=500)
    exporter = Exporter(StatsReader(cfg), port=0, bookings=True, insecure_private_views=True).start()
    try:
        status, doc = post(exporter.port, "/bookings?op=book&router=r&engine=0&request_id=a")
        assert status == 503 and "did not take it" in doc["detail"] and doc["error"] == "connection"
    finally:
        exporter.close()
