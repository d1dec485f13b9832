"""Attack (issue 39): an endpoint view reads only the endpoint's engines and the writers holding
chunks in them (``SNAPSHOT_LEAN``, a plan per endpoint, kept from one request to the next). Is
every view still exact on the first request after the fleet changes under that plan: a new writer
starting to own chunks in the endpoint's engines, a writer closed, a writer killed and folded by
gc, a writer of another shard count, an engine moved to another pod? And the exporter's upkeep
thread (the sweep of what is kept) survives an exception as every other background thread does.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.background import background_errors
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.ops.retention import collect_garbage
from redis_stats.server import Exporter
from redis_stats.server import exporter as exporter_module
from redis_stats.server.http import Request, answer
from redis_stats.server.kept import Kept
from tests.prometheus.test_background_errors import Failing, _until

MODEL = "m"
PROTOCOL = {r.family for r in VLLM_ROLES}
A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def record(writer: StatsWriter, engines: list[int], k: int) -> None:
    for e in engines:
        writer.metric("vllm:prompt_tokens").labels(e, model_name=MODEL).inc(k)
        writer.metric("vllm:num_requests_waiting").labels(e, model_name=MODEL).set(k)
        writer.metric("vllm:num_requests_running").labels(e, model_name=MODEL).set(1)
        writer.metric("vllm:e2e_request_latency_seconds").labels(e, model_name=MODEL).observe(0.1 * k)


def engine_samples(text: str, engines: set[str]) -> dict[tuple[str, tuple], float]:
    """The samples of *engines* (their ``engine`` label), but the protocol families and the
    exporter's own."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("redis_stats") or family.name in PROTOCOL:
            continue
        for s in family.samples:
            if s.labels.get("engine") in engines:
                out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def waiting_of(text: str) -> dict[str, float]:
    """``vllm:num_requests_waiting`` of each engine (the whole /metrics) or the one series (a view)."""
    return {
        s.labels.get("engine", ""): s.value
        for f in text_string_to_metric_families(text)
        if f.name == "vllm:num_requests_waiting"
        for s in f.samples
    }


class Fleet:
    def __init__(self, url: str, namespace: str, **settings: float) -> None:
        self.base = StatsConfig(url=url, namespace=namespace, flush_interval=0.1, **settings)
        self.live: dict[str, StatsWriter] = {}
        reader = StatsReader(self.base.replace(endpoint=None), vllm_catalog())
        self.exporter = Exporter(reader, port=0, roles=VLLM_ROLES)

    def writer(self, role: str, endpoint: str, engines: list[int], k: int, **settings: int) -> StatsWriter:
        config = self.base.replace(endpoint=endpoint, **settings)
        writer = StatsWriter(config, vllm_catalog(), engines=engines, start=False, role=role)
        record(writer, engines, k)
        assert writer.flush()
        self.live[role] = writer
        return writer

    def get(self, query: str) -> str:
        response = answer(self.exporter.app, Request("GET", "/metrics", query))
        assert response.status == 200, response.body
        return response.body.decode()

    def close(self) -> None:
        self.exporter.close()
        for w in self.live.values():
            w._closed = True


def differences(fleet: Fleet, endpoints: dict[str, list[str]]) -> list[str]:
    """What the first request of each endpoint view gets wrong against the whole /metrics read
    just before (every live writer flushed first: nothing changes between the two reads)."""
    for w in fleet.live.values():
        assert w.flush()
    whole = fleet.get("")
    wrong = []
    for endpoint, engines in endpoints.items():
        view = fleet.get("endpoint=" + endpoint)
        got, want = engine_samples(view, set(engines)), engine_samples(whole, set(engines))
        if got != want:
            keys = set(got) ^ set(want) or {k for k in got if got[k] != want[k]}
            wrong.append(f"{endpoint}: {len(got)} samples, want {len(want)}; e.g. {sorted(keys)[:2]}")
        total = sum(v for e, v in waiting_of(whole).items() if e in engines)
        if waiting_of(view).get("") != total:
            wrong.append(f"{endpoint}: waiting {waiting_of(view)}, want {total}")
    return wrong


@pytest.fixture
def quick(redis_server, namespace):
    fleet = Fleet(redis_server.url, namespace, stale_after=1.5, retention=3.0)
    yield fleet
    fleet.close()


def test_an_endpoint_view_stays_exact_as_writers_come_go_are_folded_and_change_shard_count(quick):
    fleet = quick
    fleet.writer("a0", A, [0, 1], 1)
    fleet.writer("a1", A, [0, 1], 2)
    fleet.writer("b0", B, [2, 3], 3)
    fleet.writer("b1", B, [2, 3], 4)
    pods = {A: ["0", "1"], B: ["2", "3"]}
    assert differences(fleet, pods) == []  # every plan made
    fleet.writer("a2", A, [0, 1], 5)  # a new writer owns chunks in A's engines
    assert differences(fleet, pods) == []
    fleet.live.pop("a1").close()  # a writer closes: its gauges go, its counters stay
    assert differences(fleet, pods) == []
    fleet.live.pop("a0")._closed = True  # killed; gc folds it once past the retention
    time.sleep(3.3)
    for w in fleet.live.values():  # the others heartbeat meanwhile
        assert w.flush()
    assert "a0" in " ".join(collect_garbage(fleet.base).writers)
    assert differences(fleet, pods) == []
    fleet.writer("a3", A, [0, 1], 7, shards=2)  # a writer of two shards: engine 1 in shard 1
    assert differences(fleet, pods) == []


def test_the_first_scrape_of_a_pod_an_engine_left_shows_none_of_that_engines_series(redis_server, namespace):
    fleet = Fleet(redis_server.url, namespace, stale_after=30.0)
    try:
        fleet.writer("b0", B, [2, 3], 3)
        assert 'engine="3"' in fleet.get("endpoint=" + B)  # the map: B has 2 and 3
        fleet.live.pop("b0")._closed = True  # the pod dies without a close (live for 30 s)
        fleet.writer("c0", C, [3], 9)  # engine 3 back in a new pod
        fleet.writer("b2", B, [2], 6)  # and engine 2 in the old pod's address again
        view = fleet.get("endpoint=" + B)
        assert waiting_of(view) == {"": 6.0}  # the protocol families are right
        assert 'engine="3"' not in view, "the moved engine's series are served behind its old pod"
    finally:
        fleet.close()


def test_the_upkeep_thread_survives_an_exception_in_the_sweep(redis_server, namespace, monkeypatch):
    sweeps = Failing(Kept.sweep, RuntimeError, times=2)
    monkeypatch.setattr(Kept, "sweep", lambda self: sweeps(self))
    monkeypatch.setattr(exporter_module, "UPKEEP_EVERY", 0.05)
    before = background_errors().get(("kept", "RuntimeError"), 0)
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    exporter = Exporter(StatsReader(config, vllm_catalog()), port=0).start()
    try:
        assert _until(lambda: sweeps.calls >= 4), "the upkeep thread stopped"
    finally:
        exporter.close()
    assert background_errors()[("kept", "RuntimeError")] == before + 2
