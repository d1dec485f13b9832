"""Any number of exporters over one store give the same answers (issue 39 item 3): a router or
KEDA may read a Service in front of several, and a replica killed under polling costs no answer
a retry would not get."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter
from tests.server.test_kept_views import fleet

pytestmark = pytest.mark.redis_server


def fetch(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def stable(body: bytes) -> object:
    """A /load, /endpoints or /get_load body without its times (each replica reads at its own)."""
    doc = json.loads(body)
    doc.pop("time", None)
    for engine in doc.get("engines", {}).values() if isinstance(doc.get("engines"), dict) else ():
        engine.pop("age_seconds", None)
    for endpoint in doc.get("endpoints", {}).values():
        for engine in endpoint["engines"].values():
            engine.pop("age_seconds")
    doc.pop("age_seconds", None)
    return doc


@pytest.fixture
def store(redis_server, namespace):
    writers = fleet(redis_server.url, namespace, 3)
    yield StatsConfig(url=redis_server.url, namespace=namespace)
    for w in writers:
        w._closed = True


def replicas(config: StatsConfig, n: int) -> list[Exporter]:
    return [Exporter(StatsReader(config, vllm_catalog()), port=0, roles=VLLM_ROLES).start() for _ in range(n)]


def test_replicas_over_one_store_answer_the_same(store):
    exporters = replicas(store, 2)
    try:
        load = [fetch(e.url + "/load") for e in exporters]
        assert load[0][1]["ETag"] == load[1][1]["ETag"]  # a router's If-None-Match works on either
        assert stable(load[0][2]) == stable(load[1][2])
        seqs = [{k: v["seq"] for k, v in json.loads(body)["engines"].items()} for _, _, body in load]
        assert seqs[0] == seqs[1] and all(s is not None for s in seqs[0].values())
        for path in (
            "/endpoints",
            "/metrics?endpoint=10.0.1.1:8000",
            "/metrics?engine=5",
            "/get_load?endpoint=10.0.2.1:8000",
        ):
            a, b = (fetch(e.url + path) for e in exporters)
            assert a[0] == b[0] == 200, (path, a[2][:200])
            if path.startswith("/metrics"):
                strip = [
                    line
                    for line in a[2].decode().splitlines()
                    if "duration_seconds" not in line and "age_seconds" not in line
                ]
                assert strip == [
                    line
                    for line in b[2].decode().splitlines()
                    if "duration_seconds" not in line and "age_seconds" not in line
                ], path
            else:
                assert stable(a[2]) == stable(b[2]), path
        # a 304 from one replica for the other's ETag
        request = urllib.request.Request(
            exporters[1].url + "/load", headers={"If-None-Match": load[0][1]["ETag"]}
        )
        with pytest.raises(urllib.error.HTTPError) as got:
            urllib.request.urlopen(request, timeout=10)
        assert got.value.code == 304
    finally:
        for e in exporters:
            e.close()


def test_a_replica_killed_under_polling_costs_no_answer_a_retry_would_not_get(store):
    exporters = replicas(store, 2)
    answers: list[int] = []
    retried = 0
    killed = threading.Event()

    def poll_once(turn: int) -> int:
        """One poll through a 'Service': the replica of this turn, the other one on a refused
        connection (what a Service's next endpoint or the router's own retry gives)."""
        nonlocal retried
        urls = [e.url for e in exporters]
        first = turn % 2
        for attempt, url in enumerate((urls[first], urls[1 - first])):
            try:
                return fetch(url + "/get_load?endpoint=10.0.0.1:8000")[0]
            except (urllib.error.URLError, ConnectionError):
                retried += attempt == 0
                continue
        raise AssertionError("neither replica answered")

    try:
        for turn in range(60):
            if turn == 20:
                exporters[0].close()  # a replica goes (a node drained, an OOM kill)
                killed.set()
            answers.append(poll_once(turn))
    finally:
        for e in exporters:
            e.close()
    assert answers == [200] * 60
    assert retried >= 1  # the dead replica was tried, and the other answered
