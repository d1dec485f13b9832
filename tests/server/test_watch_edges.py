"""``/watch`` at its edges (issue 46): what is not known is said, a closing engine goes straight to
``down``, streams never starve the scrapes, the history is bounded and given back, the state is
changed under the lock it is read under, and every parameter is checked.

A real Redis the test stops and starts, writers with the load lane, an exporter; subscribers as a
router runs them (a stream, a long poll, the whole state)."""

from __future__ import annotations

import json
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
        StatsReader(cfg), port=0, load_refresh=0.1, max_connections=4, max_streams=6, request_timeout=5.0
    ).start()
    yield SimpleNamespace(cfg=cfg, writers=writers, writer=writer, exporter=exporter, server=own_redis_server)
    exporter.close()
    for w in writers:
        w.close()


def test_a_store_outage_is_said_by_every_form_of_the_feed_and_the_whole_state_follows(fleet):
    url = fleet.exporter.url
    status, snap = get(url + "/watch")
    assert status == 200 and {d["state"] for d in snap["engines"].values()} == {"up"}
    stream = _subscribe(url)
    ((kind, _, _),) = _events(stream, 1)
    assert kind == "state"
    fleet.server.stop(keep_data=True)
    stopped = time.monotonic()
    ((kind, ident, doc),) = _events(stream, 1)  # no keepalives for as long as it lasts: an event
    took = time.monotonic() - stopped
    assert kind == "unknown" and doc["load"] == "unknown" and doc["error"] and doc["detail"]
    assert took < 3.0  # /load's bound: 503 from its first failed refresh (0.1 s), at most 2 s stale
    while answer(url + "/load")[0] != 503:  # /load says so too, within the same bound
        assert time.monotonic() - stopped < 3.0
        time.sleep(0.05)
    for path in ("/watch", f"/watch?since={snap['seq']}&epoch={snap['epoch']}&wait=1"):
        status, doc = answer(url + path)
        assert status == 503 and doc.get("load") == "unknown", (path, doc)  # never a frozen 200
    fleet.server.start()
    for w in fleet.writers:
        w.metric("vllm:num_requests_waiting").labels(w.engines[0], model_name="m").set(5)
    ((kind, ident, state),) = _events(stream, 1)  # known again: the whole state, a new epoch
    assert kind == "state" and state["epoch"] != snap["epoch"] and ident == f"{state['epoch']}-{state['seq']}"
    assert set(state["engines"]) == {"0", "1"}
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
    status, doc = answer(f"{url}/watch?since=0&epoch=x&wait=5")  # one long poll more: refused, said why
    assert status == 503 and "--max-streams" in doc["error"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        _subscribe(url)
    assert refused.value.code == 503
    for s in streams:
        s.close()
    deadline = time.monotonic() + 10  # their slots come back when they leave (found by a write)
    value = 50
    while answer(f"{url}/watch?since=0&epoch=x&wait=0.1")[0] != 200:
        assert time.monotonic() < deadline
        value += 1
        fleet.writers[0].metric("vllm:num_requests_waiting").labels(0, model_name="m").set(value)
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
