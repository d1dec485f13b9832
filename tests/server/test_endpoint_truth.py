"""An endpoint view serves its live engines' true numbers, or says why it cannot (issue 39 item 2):
an engine moved to a new pod is served behind the live pod whatever the two ids' order, and a
family some live engine does not report is withheld, never another engines' partial sum."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter

pytestmark = pytest.mark.redis_server

DEAD, NEW = "10.0.0.1:8000", "10.0.0.9:8000"  # the dead pod's id sorts first


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def pod(cfg: StatsConfig, endpoint: str, engines: list[int], waiting: float | None = 3) -> StatsWriter:
    writer = StatsWriter(
        cfg.replace(endpoint=endpoint), vllm_catalog(), engines=engines, start=False, load=VLLM_LOAD
    )
    for e in engines:
        writer.metric("vllm:num_requests_running").labels(e, model_name="m").set(2)
        if waiting is not None:
            writer.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(waiting)
    assert writer.flush()
    return writer


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture
def cfg(redis_server, namespace):
    return StatsConfig(url=redis_server.url, namespace=namespace, stale_after=30.0)


def test_an_engine_back_in_a_new_pod_is_served_behind_the_new_pod_while_the_dead_one_is_still_live(cfg):
    dead = pod(cfg, DEAD, [0], waiting=9)
    dead._closed = True  # killed: no close, its heartbeat stays "live" for its stale_after (30 s)
    new = pod(cfg, NEW, [0], waiting=4)
    exporter = Exporter(StatsReader(cfg, vllm_catalog()), port=0, roles=VLLM_ROLES).start()
    try:
        for _ in range(3):  # every poll, not most of them
            doc = json.loads(fetch(exporter.url + "/endpoints")[1])
            assert list(doc["endpoints"]) == [NEW], doc
            status, body = fetch(exporter.url + "/metrics?endpoint=" + NEW)
            assert status == 200
            (waiting,) = families(body)["vllm:num_requests_waiting"]
            assert waiting.value == 4  # the new pod's value (the engine's newest writer wins too)
            assert fetch(exporter.url + "/metrics?endpoint=" + DEAD)[0] == 404
            status, body = fetch(exporter.url + "/get_load?endpoint=" + NEW)
            assert status == 200 and json.loads(body)["load"] == 6, body
            load = json.loads(fetch(exporter.url + "/load")[1])
            assert load["engines"]["0"]["up"] is True
    finally:
        exporter.close()
        new.close()


def test_a_family_one_live_engine_does_not_report_is_withheld_never_a_partial_sum(cfg):
    reporting = pod(cfg, "10.0.0.2:8000", [0])
    silent = pod(cfg, "10.0.0.2:8000", [1], waiting=None)  # up, running reported, waiting not yet
    exporter = Exporter(StatsReader(cfg, vllm_catalog()), port=0, roles=VLLM_ROLES).start()
    try:
        status, body = fetch(exporter.url + "/metrics?endpoint=10.0.0.2:8000")
        assert status == 200
        found = families(body)
        assert "vllm:num_requests_waiting" not in found  # not engine 0's 3 as the endpoint's total
        (running,) = found["vllm:num_requests_running"]
        assert running.value == 4  # both report it: their sum
        (withheld,) = found["redis_stats_endpoint_withheld"]
        assert withheld.labels == {
            "family": "vllm:num_requests_waiting",
            "engine": "1",
            "reason": "no_series",
        }
        assert 'redis_stats_endpoint_up{endpoint="10.0.0.2:8000"} 1' in body
        # /get_load refuses the same state
        status, doc = fetch(exporter.url + "/get_load?endpoint=10.0.0.2:8000")
        assert status == 503 and json.loads(doc)["error"] == "no_load"
        # once engine 1 reports, both are served, nothing withheld
        silent.metric("vllm:num_requests_waiting").labels(1, model_name="m").set(5)
        assert silent.flush()
        found = families(fetch(exporter.url + "/metrics?endpoint=10.0.0.2:8000")[1])
        assert [s.value for s in found["vllm:num_requests_waiting"]] == [8]
        assert "redis_stats_endpoint_withheld" not in found
    finally:
        exporter.close()
        reporting.close()
        silent.close()
