"""The load proxy in front of vLLM's Rust front end (issue 40): vllm-rs runs no Python middleware,
so the proxy takes the address routers use, answers ``/get_load`` and ``/v1/loads`` from Redis
(what the bridge stores of the front end's ``/metrics``) and passes everything else on.

(a) The proxy against a stand-in front end (tests/helpers/vllm_rs.py): answers, requests passed
byte for byte, a router's pooled connection never sending ``/get_load`` to the front end, the
front end down. (b) The real ``vllm-router`` 0.1.17 wheel, ``--policy power_of_two``, in front of
two such pods (front end + bridge + proxy): it sends its traffic to the pod with the lower load,
and follows when the loads swap."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from redis_stats import StatsConfig
from redis_stats.integrations.bridge import BridgedSource
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.get_load import TTL
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.integrations.vllm.load_proxy import LoadProxy
from tests import smg_decode
from tests.helpers.vllm_rs import Engine, VllmRs
from tests.routers.procs import Router, free_port, router_binary, sent_to

pytestmark = pytest.mark.redis_server


class Loop:
    """An asyncio loop in a thread (the proxy's)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Pod:
    """A vllm-rs pod: the front end (2 engines), the bridge of its /metrics, the load proxy."""

    def __init__(self, cfg: StatsConfig, loop: Loop, name: str, first: int) -> None:
        self.front = VllmRs(name, {0: Engine(), 1: Engine()}).start()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = cfg.replace(endpoint=f"127.0.0.1:{self.port}", engine_offset=first)
        self.bridge = BridgedSource(
            f"http://{self.front.address}/metrics",
            config,
            engine_label="engine",
            known=vllm_catalog(),
            load=VLLM_LOAD,
        )
        self.loop = loop
        self.proxy = loop.run(LoadProxy(config, self.front.address, host="127.0.0.1", port=self.port).start())

    def load(self, running: int, waiting: int) -> None:
        """Set the front end's numbers (split over its engines) and bridge them."""
        self.front.engines[0].running, self.front.engines[1].running = running // 2, running - running // 2
        self.front.engines[0].waiting, self.front.engines[1].waiting = waiting, 0
        assert self.bridge.scrape(), self.bridge.stats

    def close(self) -> None:
        self.loop.run(self.proxy.close())
        self.bridge.close()
        self.front.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    made = Loop()
    yield made
    made.close()


@pytest.fixture
def cfg(redis_server, namespace) -> StatsConfig:
    return StatsConfig(url=redis_server.url, namespace=namespace)


def request(
    conn: http.client.HTTPConnection, method: str, path: str, body: Any = None
) -> tuple[int, bytes, dict]:
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    resp = conn.getresponse()
    return resp.status, resp.read(), dict(resp.getheaders())


def test_it_answers_the_load_routes_and_passes_everything_else(cfg, loop):
    pod = Pod(cfg, loop, "rs", 0)
    try:
        pod.load(running=6, waiting=3)
        conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10)
        for _ in range(3):  # one connection, kept open, answered each time (a router's pool)
            status, body, _ = request(conn, "GET", "/get_load")
            assert status == 200 and json.loads(body)["load"] == 9
        status, body, _ = request(conn, "GET", "/v1/loads?include=core,disagg,queues,memory")
        verdict, response = smg_decode.probe(status, body)
        assert verdict == "available" and [s["num_running_reqs"] for s in response["loads"]] == [3, 3]
        # a completion passes to the front end, its body too; then that connection is closed
        status, body, headers = request(
            conn, "POST", "/v1/completions", {"model": "m", "prompt": "x" * 100_000}
        )
        assert status == 200 and json.loads(body)["echo"] == "x" * 100_000
        assert headers.get("Connection", "").lower() == "close" or conn.sock is None
        conn.close()
        # the next poll, on a new connection, is answered by the proxy again, never by the front end
        conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10)
        assert request(conn, "GET", "/get_load")[0] == 200
        metrics = request(http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10), "GET", "/metrics")
        direct = request(
            http.client.HTTPConnection("127.0.0.1", pod.front.port, timeout=10), "GET", "/metrics"
        )
        assert metrics[1] == direct[1]  # byte for byte
        assert "/get_load" not in pod.front.paths and "/v1/loads" not in pod.front.paths
        assert pod.front.paths["/v1/completions"] == 1
    finally:
        pod.close()


def test_the_front_end_down_is_a_502_and_a_huge_head_a_431(cfg, loop):
    pod = Pod(cfg, loop, "rs", 0)
    try:
        pod.load(running=1, waiting=0)
        pod.front.close()
        conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10)
        assert request(conn, "POST", "/v1/completions", {"prompt": "x"})[0] == 502
        conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10)
        assert request(conn, "GET", "/get_load")[0] == 200  # its load is still known (from Redis)
        conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10)
        conn.putrequest("GET", "/v1/models")
        conn.putheader("X-Big", "y" * 70_000)
        conn.endheaders()
        assert conn.getresponse().status == 431
    finally:
        pod.proxy and loop.run(pod.proxy.close())
        pod.bridge.close()


def test_a_proxy_without_an_endpoint_or_a_bad_upstream_is_refused(cfg):
    with pytest.raises(ValueError, match="REDIS_STATS_ENDPOINT"):
        LoadProxy(cfg, "127.0.0.1:8000")
    with pytest.raises(ValueError, match="not host:port"):
        LoadProxy(cfg.replace(endpoint="10.0.0.1:8001"), "127.0.0.1")


@pytest.mark.slow
def test_vllm_router_routes_vllm_rs_pods_by_their_exact_load(cfg, loop, tmp_path):
    binary = router_binary()
    if binary is None:
        pytest.skip("vllm-router is not installed (the test extra installs it on Linux x86_64/aarch64)")
    pods = {"light": Pod(cfg, loop, "light", 0), "heavy": Pod(cfg, loop, "heavy", 2)}
    pods["light"].load(running=4, waiting=1)
    pods["heavy"].load(running=40, waiting=10)
    router = Router([binary], [pods["light"].url, pods["heavy"].url], tmp_path / "router.log", "warning")
    url = router.url

    def polls() -> list[int]:
        return [pod.proxy.polls for pod in pods.values()]

    def polled_after(before: list[int]) -> None:
        router.wait_polled(polls, before, timeout=20, settle=0.3)

    try:
        polled_after([0, 0])
        assert sent_to(url, 40) == {"light": 40}
        pods["light"].load(running=40, waiting=10)
        pods["heavy"].load(running=4, waiting=1)
        time.sleep(TTL)  # the proxies' kept answers have aged out
        polled_after(polls())
        assert sent_to(url, 40) == {"heavy": 40}
        assert all(p.front.paths.get("/get_load", 0) == 0 for p in pods.values())  # never asked of vllm-rs
    finally:
        router.close()
        for pod in pods.values():
            pod.close()


def test_the_command_bridges_and_answers_until_sigterm(cfg, python_env):
    """``redis-stats load-proxy --upstream ...``: one sidecar for a vllm-rs pod (the bridge of its
    /metrics and the proxy), stopped by SIGTERM as Kubernetes stops it."""
    import os
    import signal
    import sys
    import urllib.request

    front = VllmRs("rs", {0: Engine(running=2, waiting=5), 1: Engine(running=1)}).start()
    port = free_port()
    env = dict(
        python_env,
        REDIS_STATS_URL=cfg.url,
        REDIS_STATS_NAMESPACE=cfg.namespace,
        REDIS_STATS_ENDPOINT=f"127.0.0.1:{port}",
        REDIS_STATS_FLUSH_INTERVAL="0.2",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redis_stats",
            "load-proxy",
            "--upstream",
            front.address,
            "--listen",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_load", timeout=5) as r:
                    doc = json.loads(r.read())
                break
            except OSError:  # not listening yet, or 503 until the first scrape is stored
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert doc["load"] == 8 and doc["engines"] == [0, 1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.loads(r.read())["data"][0]["id"] == "m"  # passed on to the front end
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0, proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        front.close()
