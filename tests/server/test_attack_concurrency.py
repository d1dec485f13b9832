"""Attack (issue 39): many clients at once.

- Every endpoint, engine and slice view is read by readers the requests share (one reader of
  every endpoint and engine view, with a plan per selection): many threads asking many views at
  once must each get the body a lone request gets (compared line by line, not only parsed).
- A burst of connections within ``max_connections`` (routers polling ``/load``, Prometheus
  scraping every ``?slice=`` at the same second) must be served at once.
"""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter
from tests.probes import fetch
from tests.server.test_concurrent_scrapes import VOLATILE, fast_thread_switches  # noqa: F401
from tests.server.test_kept_views import fleet

pytestmark = pytest.mark.redis_server


def stable(path: str, body: bytes) -> str:
    """*body* without what moves with the clock (ages, durations, the store's used memory)."""
    if path.startswith(("/endpoints", "/get_load")):
        doc = json.loads(body)
        doc.pop("time", None)
        doc.pop("age_seconds", None)
        for endpoint in doc.get("endpoints", {}).values():
            for engine in endpoint["engines"].values():
                engine.pop("age_seconds")
                engine.pop("state")  # up, then stale as the static writers' entries age
        return json.dumps(doc, sort_keys=True)
    return "".join(line + "\n" for line in body.decode().splitlines() if not line.startswith(VOLATILE))


@pytest.fixture
def pods(redis_server, namespace):
    writers = fleet(redis_server.url, namespace, 8)  # 8 pods of 4 engines, 2 API servers each
    yield StatsConfig(url=redis_server.url, namespace=namespace)
    for w in writers:
        w._closed = True


def test_many_threads_on_the_endpoint_engine_and_slice_views_each_get_a_lone_requests_body(
    pods,
    fast_thread_switches,  # noqa: F811
):
    exporter = Exporter(StatsReader(pods, vllm_catalog()), port=0, roles=VLLM_ROLES).start()
    paths = [f"/metrics?endpoint=10.0.{p}.1:8000" for p in range(8)]
    paths += [f"/metrics?engine={e}" for e in range(0, 32, 3)]
    paths += [f"/metrics?slice={i}/4" for i in range(4)] + ["/metrics", "/endpoints"]
    paths += [f"/get_load?endpoint=10.0.{p}.1:8000" for p in range(0, 8, 2)]
    try:
        lone = {}
        for path in paths:
            status, body = fetch(exporter.url + path)
            assert status in (200, 503), (path, body)  # /get_load: these writers keep no load feed
            lone[path] = (status, stable(path, body))
        wrong: list[str] = []
        rng = random.Random(39)
        asked = [rng.choice(paths) for _ in range(400)]

        def ask(path: str) -> None:
            status, body = fetch(exporter.url + path)
            if (status, stable(path, body)) != lone[path]:
                wrong.append(path)

        with ThreadPoolExecutor(12) as pool:
            list(pool.map(ask, asked))
        assert not wrong, f"{len(wrong)} of {len(asked)} bodies differ from a lone request's: {wrong[:5]}"
    finally:
        exporter.close()


def test_a_burst_of_connections_within_the_cap_is_served_at_once(pods):
    exporter = Exporter(StatsReader(pods, vllm_catalog()), port=0, max_connections=64).start()
    try:
        assert fetch(exporter.url + "/load")[0] == 200  # the refresher runs: /load waits on nothing
        clients = 30
        barrier = threading.Barrier(clients)

        def poll(_: int) -> tuple[int, float]:
            barrier.wait()
            started = time.monotonic()
            status, _body = fetch(exporter.url + "/load")
            return status, time.monotonic() - started

        with ThreadPoolExecutor(clients) as pool:
            answers = list(pool.map(poll, range(clients)))
        assert {status for status, _ in answers} == {200}
        slowest = max(took for _, took in answers)
        assert slowest < 0.5, f"{sum(t > 0.5 for _, t in answers)} of {clients} waited, up to {slowest:.2f} s"
    finally:
        exporter.close()
