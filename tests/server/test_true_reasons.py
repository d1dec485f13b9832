"""Every "not available" answer of the routers' views names its true cause (issue 50, "Broken"):
``/v1/loads`` on a fleet whose engines store no endpoint said "no engine of the fleet is up with
request counts" while ``/load`` showed both up with counts; an unknown endpoint said "stored (yet)"
whatever the store held; a sum past the float range said the engines reported no count."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.server import Exporter

pytestmark = pytest.mark.redis_server


def fetch(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def writer(cfg: StatsConfig, engines: list[int], endpoint: str | None, running: float = 2) -> StatsWriter:
    w = StatsWriter(
        cfg.replace(endpoint=endpoint), vllm_catalog(), engines=engines, start=False, load=VLLM_LOAD
    )
    for e in engines:
        w.metric("vllm:num_requests_running").labels(e, model_name="m").set(running)
        w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(1)
    assert w.flush()
    return w


@pytest.fixture
def cfg(redis_server, namespace):
    return StatsConfig(url=redis_server.url, namespace=namespace)


@pytest.fixture
def serve(cfg):
    started = []

    def start() -> str:
        exporter = Exporter(StatsReader(cfg, vllm_catalog()), port=0).start()
        started.append(exporter)
        return exporter.url

    yield start
    for exporter in started:
        exporter.close()


def test_engines_up_with_counts_but_no_endpoint_are_said_to_store_no_endpoint(cfg, serve):
    w = writer(cfg, [0, 1], endpoint=None)
    try:
        url = serve()
        load = fetch(url + "/load")[1]
        assert all(e["up"] and e["requests_running"] == 2 for e in load["engines"].values())
        for path in ("/v1/loads", "/loads"):
            status, doc = fetch(url + path)
            assert status == 503 and doc["error"] == "no_endpoints", doc
            assert "no engine stores an endpoint" in doc["detail"] and "REDIS_STATS_ENDPOINT" in doc["detail"]
            assert "up with request counts" not in doc["detail"] and doc["unassigned"] == [0, 1]
        for path in ("/v1/loads?endpoint=10.0.0.1:8000", "/get_load?endpoint=10.0.0.1:8000"):
            status, doc = fetch(url + path)
            assert status == 503 and doc["error"] == "unknown_endpoint", doc
            assert "no engine of this namespace stores an endpoint (engines 0, 1 have none" in doc["detail"]
    finally:
        w.close()


def test_an_unknown_endpoint_is_answered_with_the_endpoints_stored(cfg, serve):
    w = writer(cfg, [0, 1], endpoint="10.0.0.1:8000")
    try:
        url = serve()
        for path in ("/v1/loads?endpoint=10.0.0.2:8000", "/get_load?endpoint=10.0.0.2:8000"):
            status, doc = fetch(url + path)
            assert status == 503 and doc["error"] == "unknown_endpoint", doc
            assert "the endpoints stored are 10.0.0.1:8000" in doc["detail"], doc
    finally:
        w.close()


def test_an_empty_namespace_is_said_to_hold_nothing_not_to_be_down(serve):
    url = serve()
    status, doc = fetch(url + "/v1/loads")
    assert status == 503 and doc["error"] == "no_engines", doc
    assert "holds no engine's load" in doc["detail"]
    status, doc = fetch(url + "/get_load?endpoint=10.0.0.1:8000")
    assert status == 503 and "holds no engine's load" in doc["detail"], doc


def test_a_fleet_whose_every_rank_is_down_is_fleet_down_with_its_ranks(cfg, serve):
    w = writer(cfg, [0, 1], endpoint="10.0.0.1:8000")
    w.close()  # both engines down at once
    url = serve()
    status, doc = fetch(url + "/v1/loads")
    assert status == 503 and doc["error"] == "fleet_down", doc
    assert doc["ranks_not_reported"] == {"10.0.0.1:8000": [0, 1]}


def test_counts_past_the_float_range_are_said_to_overflow_not_to_be_missing(cfg, serve):
    w = writer(cfg, [0, 1], endpoint="10.0.0.1:8000", running=1.7e308)
    try:
        status, doc = fetch(serve() + "/get_load?endpoint=10.0.0.1:8000")
        assert status == 503 and doc["error"] == "no_load", doc
        assert "past the float range" in doc["detail"] and "report no finite" not in doc["detail"]
    finally:
        w.close()
