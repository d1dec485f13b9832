"""``/watch`` at its edges (issue 46): what is not known is said, a closing engine goes straight to
``down``, streams never starve the scrapes, the history is bounded and given back, the state is
changed under the lock it is read under, and every parameter is checked.

A real Redis the test stops and starts, writers with the load lane, an exporter; subscribers as a
router runs them (a stream, a long poll, the whole state)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.load import EngineLoad, LoadView
from redis_stats.server import Exporter
from redis_stats.server.states.watch_feed import FeedUnknown, WatchFeed, watch_of
from tests.conftest import ROOT
from tests.server.test_watch import _events, _subscribe, get

pytestmark = pytest.mark.redis_server


def answer(url: str, timeout: float = 10) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def fleet(own_redis_server, namespace):
    cfg = StatsConfig(
        url=own_redis_server.url,
        namespace=namespace,
        flush_interval=0.5,
        stale_after=5.0,
        endpoint="10.0.9.1:8000",
    )
    writers = []

    def writer(engine: int) -> StatsWriter:
        w = StatsWriter(cfg, vllm_catalog(), engines=[engine], role=f"api{engine}", load=VLLM_LOAD)
        w.metric("vllm:num_requests_waiting").labels(engine, model_name="m").set(engine)
        w.metric("vllm:num_requests_running").labels(engine, model_name="m").set(1)
        assert w.flush()
        writers.append(w)
        return w

    for e in (0, 1):
        writer(e)
    exporter = Exporter(
        StatsReader(cfg),
        port=0,
        load_refresh=0.1,
        max_connections=4,
        max_streams=6,
        request_timeout=5.0,
        self_metrics=True,
    ).start()
    ns = SimpleNamespace(cfg=cfg, writers=writers, writer=writer, exporter=exporter, server=own_redis_server)
    yield ns
    exporter.close()
    ns.exporter.close()  # a test may have started another
    for w in writers:
        w.close()


def test_a_store_outage_is_said_by_every_form_of_the_feed_and_the_whole_state_follows(fleet):
    url = fleet.exporter.url
    status, snap = get(url + "/watch")
    assert status == 200 and {d["state"] for d in snap["engines"].values()} == {"up"}
    stream = _subscribe(url)
    ((kind, _, _),) = _events(stream, 1)
    assert kind == "state"
    epochs = [snap["epoch"]]
    for keep in (True, False):  # restarted twice: with its data, then empty
        fleet.server.stop(keep_data=keep)
        stopped = time.monotonic()
        ((kind, ident, doc),) = _events(stream, 1)  # no keepalives for as long as it lasts: an event
        took = time.monotonic() - stopped
        assert kind == "unknown" and doc["feed"] == "unknown" and doc["error"] and doc["detail"]
        assert took < 3.0  # /load's bound: 503 from its first failed refresh (0.1 s), at most 2 s stale
        while answer(url + "/load")[0] != 503:  # /load says so too, within the same bound
            assert time.monotonic() - stopped < 3.0
            time.sleep(0.05)
        for path in ("/watch", f"/watch?since={snap['seq']}&epoch={snap['epoch']}&wait=1"):
            status, doc = answer(url + path)
            assert status == 503 and doc.get("feed") == "unknown", (path, doc)  # never a frozen 200
        fleet.server.start()
        value = 5 if keep else 6
        for w in fleet.writers:
            w.metric("vllm:num_requests_waiting").labels(w.engines[0], model_name="m").set(value)
        ((kind, ident, state),) = _events(stream, 1)  # known again: the whole state, a new epoch
        assert (
            kind == "state" and state["epoch"] not in epochs and ident == f"{state['epoch']}-{state['seq']}"
        )
        epochs.append(state["epoch"])
        engines = state["engines"]
        deadline = time.monotonic() + 15  # (empty: the writers store everything again)
        while {e: d.get("requests_waiting") for e, d in engines.items()} != {"0": value, "1": value}:
            assert time.monotonic() < deadline, engines
            ((kind, _, event),) = _events(stream, 1)
            assert kind == "message"
            engines[str(event["engine"])] = event
        assert {d["state"] for d in engines.values()} == {"up"}
    stream.close()
    status, doc = answer(f"{url}/watch?since={snap['seq']}&epoch={snap['epoch']}&wait=0")
    assert status == 200 and doc["gap"] is True  # the long poll: the whole state, not "nothing changed"


def test_a_closing_engine_goes_straight_to_down(fleet):
    url = fleet.exporter.url
    for attempt in range(2):  # the review saw it 2 of 2 clean closes
        engine = 10 + attempt
        fleet.writer(engine)
        stream = _subscribe(url)
        ((_, _, state),) = _events(stream, 1)
        deadline = time.monotonic() + 5
        while state["engines"].get(str(engine), {}).get("state") != "up":
            assert time.monotonic() < deadline
            ((_kind, _, event),) = _events(stream, 1)
            if event.get("engine") == engine:
                state["engines"][str(engine)] = event
        fleet.writers.pop().close()
        seen = []
        while not seen or seen[-1]["state"] not in ("down", "gone"):
            ((_kind, _, event),) = _events(stream, 1)
            if event.get("engine") == engine:
                seen.append(event)
        stream.close()
        # never `up` (nor stale) with numbers nobody has on the way out
        assert all(e["state"] == "down" for e in seen), seen
        assert seen[0]["requests_waiting"] is None


def test_streams_at_their_limit_never_starve_the_scrapes(fleet):
    url = fleet.exporter.url
    streams = [_subscribe(url) for _ in range(6)]  # max_streams: every one open, past max_connections (4)
    for s in streams:
        assert _events(s, 1)[0][0] == "state"
    for path in ("/metrics", "/load", "/healthz", "/metrics", "/load", "/healthz"):
        start = time.monotonic()
        with urllib.request.urlopen(url + path, timeout=5) as r:
            assert r.status == 200, path
        assert time.monotonic() - start < 5.0
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "redis_stats_exporter_streams_open 6.0" in text  # the feed full, said; the scrape answered
    status, doc = answer(f"{url}/watch?since=0&epoch=x&wait=5")  # one long poll more: refused, said why
    assert status == 503 and "--max-streams" in doc["error"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        _subscribe(url)
    assert refused.value.code == 503
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        assert "redis_stats_exporter_streams_refused_total 2.0" in r.read().decode()
    for s in streams:
        s.close()
    # their slots come back when they leave, nothing written to them (no change, no keepalive yet)
    deadline = time.monotonic() + 6
    while answer(f"{url}/watch?since=0&epoch=x&wait=0.1")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_hostile_parameters_are_a_400(fleet):
    url = fleet.exporter.url
    for query in (
        "since=" + "9" * 5000,
        "since=" + "9" * 19,
        "since=-1",
        "since=1&wait=nan",
        "since=1&wait=inf",
    ):
        status, doc = answer(f"{url}/watch?{query}")
        assert status == 400 and len(doc["error"]) < 200, query
    request = urllib.request.Request(
        url + "/watch", headers={"Accept": "text/event-stream", "Last-Event-ID": "e-" + "9" * 5000}
    )
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(request, timeout=5)
    assert bad.value.code == 400


def test_the_history_is_bounded_in_bytes_inside_the_budget_and_given_back_when_idle(fleet):
    url = fleet.exporter.url
    snap = get(url + "/watch")[1]
    feed = fleet.exporter.app.sources.one(None).state(watch_of)
    feed.keep_bytes = 3_000
    w = fleet.writers[0]
    for i in range(40):
        w.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(i + 100)
        time.sleep(0.1)  # the writer's lane stores a change every 80 ms
    assert feed.seq > snap["seq"] + 20  # many events, few kept
    assert 0 < feed.history_bytes <= 3_000 and len(feed.events) < 10
    status, doc = answer(f"{url}/watch?since={snap['seq']}&epoch={snap['epoch']}&wait=0")
    assert status == 200 and doc["gap"] is True  # older than what is kept: the whole state
    kept = fleet.exporter.app.kept.bytes_by_kind()
    assert 0 < kept["watch_history"] <= 3_000  # in the server's budget
    feed.idle = 0.3  # nobody watches: the history, and the state, go
    deadline = time.monotonic() + 5
    while feed.history_bytes or feed.events or feed.state:
        assert time.monotonic() < deadline
        time.sleep(0.1)


class _Source:
    def __init__(self) -> None:
        self.reader = SimpleNamespace(config=SimpleNamespace(url="redis://x"))
        self.options = SimpleNamespace(view_budget=2**20)

    def kept(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_the_state_changes_under_the_lock_it_is_read_under(monkeypatch):
    """A gone engine was deleted outside the lock the whole state is read under: with threads
    switched every microsecond, a KeyError (a 500, or a stream that ends)."""
    views = [
        LoadView(1.0, {e: EngineLoad(e, True, 0.0, requests_running=1.0, state="up") for e in range(200)}),
        LoadView(
            1.0, {e: EngineLoad(e, True, 0.0, requests_running=1.0, state="up") for e in range(0, 200, 2)}
        ),
    ]
    turn = [0]
    load = SimpleNamespace(max_age=60.0, current=lambda: (views[turn[0] % 2], 0, 0.0))
    feed = WatchFeed(_Source(), lambda: load)  # type: ignore[arg-type]
    monkeypatch.setattr(feed, "_read_hashes", lambda: (1000.0, {}))
    feed._asked = time.monotonic()
    feed._read_once()
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                feed.snapshot()
            except FeedUnknown:
                pass
            except Exception as exc:  # the KeyError
                errors.append(exc)

    monkeypatch.setattr(feed, "ask", lambda: None)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    readers = [threading.Thread(target=read) for _ in range(4)]
    try:
        for t in readers:
            t.start()
        for _ in range(300):
            turn[0] += 1
            feed._read_once()
    finally:
        stop.set()
        for t in readers:
            t.join(10)
        sys.setswitchinterval(old)
    assert errors == []


def test_the_example_router_stops_routing_on_what_the_feed_no_longer_vouches_for(fleet):
    sys.path.insert(0, str(ROOT / "docs" / "examples"))
    try:
        import load_router
    finally:
        sys.path.pop(0)
    client = load_router.WatchClient(fleet.exporter.url)
    client.start()
    deadline = time.monotonic() + 5
    while client.pick() is None:
        assert time.monotonic() < deadline
        client.follow()
    fleet.server.stop(keep_data=True)
    deadline = time.monotonic() + 5
    while client.pick() is not None:  # the feed says unknown: it routes on nothing it held
        assert time.monotonic() < deadline
        client.follow()
    assert client.unknown is not None and client.unknown["feed"] == "unknown"
    poller = load_router.LoadClient(fleet.exporter.url)
    while poller.poll()["engines"]:
        assert time.monotonic() < deadline
    assert load_router.pick(poller.poll(), 0.0) is None and poller.unknown is not None
    fleet.server.start()
    deadline = time.monotonic() + 10
    while client.pick() is None:  # the whole state again: it routes
        assert time.monotonic() < deadline
        client.follow()
    client.close()
    # an engine without counts (null is not 0) and one with a negative count are never picked
    doc = {
        "time": 0.0,
        "engines": {
            "0": {
                "up": True,
                "state": "up",
                "age_seconds": 0,
                "requests_waiting": None,
                "requests_running": None,
            },
            "1": {
                "up": True,
                "state": "up",
                "age_seconds": 0,
                "kv_cache_usage": 0.1,
                "requests_waiting": -5,
                "requests_running": 0,
            },
            "2": {
                "up": True,
                "state": "up",
                "age_seconds": 0,
                "kv_cache_usage": 0.1,
                "requests_waiting": 3,
                "requests_running": 1,
            },
        },
    }
    assert load_router.pick(doc, 0.0) == 2


def test_a_slow_subscriber_is_dropped_and_never_holds_the_others_back(redis_server, namespace):
    """A subscriber that stops reading fills its socket; its write times out (``request_timeout``)
    and its stream ends, its slot back; meanwhile a subscriber that reads gets every change."""
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.5)
    writers = [StatsWriter(cfg, vllm_catalog(), engines=[e], role=f"w{e}", load=VLLM_LOAD) for e in range(64)]
    exporter = Exporter(StatsReader(cfg), port=0, request_timeout=2.0, self_metrics=True).start()
    try:
        for e, w in enumerate(writers):
            w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(0)
            assert w.flush()
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", exporter.port))
        slow.sendall(b"GET /watch HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        seen: dict[int, float] = {}

        def follow() -> None:
            with _subscribe(exporter.url) as stream:
                for raw in stream:
                    line = raw.decode()
                    if line.startswith('data: {"engine": 0,'):  # engine 0's events (not the state)
                        seen.setdefault(json.loads(line[6:])["requests_waiting"], time.monotonic())

        threading.Thread(target=follow, daemon=True).start()
        time.sleep(1.0)

        def streams_open() -> str:
            with urllib.request.urlopen(exporter.url + "/metrics", timeout=10) as r:
                return next(
                    x
                    for x in r.read().decode().splitlines()
                    if x.startswith("redis_stats_exporter_streams_open")
                )

        assert streams_open().endswith(" 2.0")
        set_at: dict[int, float] = {}
        i, end = 0, time.monotonic() + 40  # ~400 KB of events a second: past what the kernel buffers
        while time.monotonic() < end and (i % 20 or not streams_open().endswith(" 1.0")):
            i += 1
            for e, w in enumerate(writers):
                w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(i)
            set_at[i] = time.monotonic()
            time.sleep(0.05)
        assert streams_open().endswith(" 1.0")  # the slow one ended, its slot back
        time.sleep(1.0)
        late = [seen[v] - at for v, at in set_at.items() if v in seen]
        assert len(late) > len(set_at) / 3 and max(late) < 3.0  # the reader kept up meanwhile
        slow.close()
    finally:
        exporter.close()
        for w in writers:
            w.close()


def test_the_example_router_rides_two_exporter_restarts(fleet):
    sys.path.insert(0, str(ROOT / "docs" / "examples"))
    try:
        import load_router
    finally:
        sys.path.pop(0)
    port = fleet.exporter.port
    client = load_router.WatchClient(fleet.exporter.url, timeout=5.0)
    client.start()
    epochs = {client.epoch}
    for restart in range(2):
        fleet.exporter.close()
        deadline = time.monotonic() + 10
        while client.pick() is not None:  # the exporter gone: nothing vouched for
            assert time.monotonic() < deadline
            client.follow()
        fleet.exporter = Exporter(StatsReader(fleet.cfg), port=port, load_refresh=0.1).start()
        value = 20 + restart
        fleet.writers[1].metric("vllm:num_requests_waiting").labels(1, model_name="m").set(value)
        while client.pick() is None or client.engines[1].get("requests_waiting") != value:
            assert time.monotonic() < deadline + 10
            client.follow()
        epochs.add(client.epoch)  # a new run of the feed: the whole state, not a resumed one
    assert len(epochs) == 3
    client.close()
