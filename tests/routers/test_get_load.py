"""``GET /get_load`` on vLLM's API port (issue 34 item 2): the endpoint's true load, from Redis.

(a) The middleware alone, driven as ASGI, against writers of two endpoints of several engines
each: the right load per endpoint, a dead engine left out, Redis stopped -> 503, every other path
passed through untouched. (b) The real router: ``vllm-router --policy power_of_two`` (the wheel
of the test extra) in front of two stub "vLLM" workers wrapped in the middleware and served by
uvicorn, with Redis holding loads 5 and 50 for their endpoints: the traffic goes to the light one,
and follows when the loads swap."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.get_load import TTL, GetLoadMiddleware
from redis_stats.integrations.vllm.load import VLLM_LOAD
from tests.asgi import asgi_get, asgi_request
from tests.routers.procs import Router, StubWorker, router_binary, sent_to

pytestmark = pytest.mark.redis_server


class Endpoint:
    """One vLLM pod: its endpoint, two API-server writers (as the plugin makes them: the load feed
    on) of *per_writer* engines each."""

    def __init__(self, cfg: StatsConfig, endpoint: str, first: int, per_writer: int = 2) -> None:
        self.endpoint = endpoint
        config = cfg.replace(endpoint=endpoint)
        self.engines = [list(range(first + i * per_writer, first + (i + 1) * per_writer)) for i in range(2)]
        self.writers = [
            StatsWriter(config, vllm_catalog(), engines=engines, start=False, role=f"api{i}", load=VLLM_LOAD)
            for i, engines in enumerate(self.engines)
        ]

    def set(self, loads: dict[int, tuple[float, float]]) -> None:
        """Engine -> (running, waiting), flushed."""
        for writer, engines in zip(self.writers, self.engines):
            for e in engines:
                running, waiting = loads[e]
                writer.metric("vllm:num_requests_running").labels(e, model_name="m").set(running)
                writer.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(waiting)
            assert writer.flush()

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def load_of(app: Any) -> tuple[int, dict[str, Any]]:
    status, headers, body = asgi_get(app, "/get_load")
    assert headers["content-type"] == "application/json"
    return status, json.loads(body)


async def inner_app(scope: Any, receive: Any, send: Any) -> None:
    """The app behind the middleware (vLLM's): answers every path with its own body."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-inner", b"1")]})
    await send({"type": "http.response.body", "body": b"inner " + scope["path"].encode()})


def test_each_endpoint_answers_its_live_engines_running_plus_waiting(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    a = Endpoint(cfg, "10.0.0.1:8000", 0)  # engines 0-3
    b = Endpoint(cfg, "10.0.0.2:8000", 4, per_writer=3)  # engines 4-9
    try:
        a.set({0: (1, 2), 1: (3, 4), 2: (5, 0), 3: (0, 7)})
        b.set({e: (10, e) for e in range(4, 10)})
        mw_a = GetLoadMiddleware(inner_app, cfg.replace(endpoint=a.endpoint), ttl=0)
        mw_b = GetLoadMiddleware(inner_app, cfg.replace(endpoint=b.endpoint), ttl=0)
        status, doc = load_of(mw_a)
        # every engine of the endpoint, over both of its API servers (one engine's would be 3)
        assert (status, doc["load"], doc["running"], doc["waiting"]) == (200, 22, 9, 13)
        assert isinstance(doc["load"], int)  # vllm-router reads it with as_i64: 22.0 would be nothing
        assert doc["engines"] == [0, 1, 2, 3] and doc["endpoint"] == a.endpoint
        status, doc = load_of(mw_b)
        assert (status, doc["load"]) == (200, 60 + sum(range(4, 10)))
        # one API server of endpoint a closes: its engines 0 and 1 are down, left out at once
        a.writers[0].close()
        status, doc = load_of(mw_a)
        assert (status, doc["load"], doc["engines"], doc["engines_down"]) == (200, 12, [2, 3], [0, 1])
        # both closed: no load known, and said so (never a 0 a router would pile requests on)
        a.writers[1].close()
        status, doc = load_of(mw_a)
        assert status == 503 and doc["error"] == "endpoint_down" and "load" not in doc
        assert load_of(mw_b)[1]["load"] == 60 + sum(range(4, 10))  # the other endpoint unmoved
        # an endpoint no writer records
        status, doc = load_of(GetLoadMiddleware(inner_app, cfg.replace(endpoint="10.9.9.9:8000")))
        assert status == 503 and doc["error"] == "unknown_endpoint" and "10.9.9.9:8000" in doc["detail"]
    finally:
        a.close()
        b.close()


def test_an_engine_without_request_counts_is_a_503_not_a_zero(redis_server, namespace):
    """A live engine whose writer stores no load feed (a writer without ``load=``): its share is
    not known, so neither is the endpoint's load."""
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, endpoint="10.0.0.1:8000")
    writer = StatsWriter(cfg, vllm_catalog(), engines=[0], start=False)
    try:
        writer.metric("vllm:num_requests_running").labels(0, model_name="m").set(4)
        assert writer.flush()
        status, doc = load_of(GetLoadMiddleware(inner_app, cfg, ttl=0))
        assert status == 503 and doc["error"] == "no_load" and "[0]" in doc["detail"]
        # counts past the float range (two engines at 1.7e308): no load, not an exception
        big = StatsWriter(cfg, vllm_catalog(), engines=[1, 2], start=False, load=VLLM_LOAD)
        try:
            for e in (1, 2):
                big.metric("vllm:num_requests_running").labels(e, model_name="m").set(1.7e308)
                big.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(0)
            assert big.flush()
            writer.close()
            status, doc = load_of(GetLoadMiddleware(inner_app, cfg, ttl=0))
            assert status == 503 and doc["error"] == "no_load", doc
        finally:
            big.close()
        # HEAD: the same status, no body
        status, headers, body = asgi_get(GetLoadMiddleware(inner_app, cfg, ttl=0), "/get_load", method="HEAD")
        assert (status, body) == (503, b"") and int(headers["content-length"]) > 0
    finally:
        writer.close()


def test_answers_are_kept_for_the_ttl(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, endpoint="10.0.0.1:8000")
    a = Endpoint(cfg, "10.0.0.1:8000", 0)
    try:
        a.set({0: (1, 0), 1: (1, 0), 2: (1, 0), 3: (1, 0)})
        mw = GetLoadMiddleware(inner_app, cfg, ttl=0.5)
        assert load_of(mw)[1]["load"] == 4
        a.set({0: (9, 0), 1: (9, 0), 2: (9, 0), 3: (9, 0)})
        assert load_of(mw)[1]["load"] == 4  # within the ttl: the kept answer, no read of Redis
        time.sleep(0.6)
        assert load_of(mw)[1]["load"] == 36
    finally:
        a.close()


def exec_calls(url: str) -> int:
    """How many transactions the server has run (a load-feed read is one ``MULTI``/``EXEC``)."""
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    return int(stats.get("cmdstat_exec", {}).get("calls", 0))


def test_many_concurrent_polls_share_one_read_off_the_event_loop(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, endpoint="10.0.0.1:8000")
    a = Endpoint(cfg, "10.0.0.1:8000", 0)
    try:
        a.set({0: (1, 1), 1: (1, 1), 2: (1, 1), 3: (1, 1)})
        before = exec_calls(redis_server.url)
        assert load_of(GetLoadMiddleware(inner_app, cfg, ttl=60))[1]["load"] == 8
        one = exec_calls(redis_server.url) - before  # what one cold answer reads (the map too)
        mw = GetLoadMiddleware(inner_app, cfg, ttl=60)
        import redis

        async def many() -> tuple[list[tuple[int, dict[str, str], bytes]], float, float]:
            gaps, last = [0.0], time.monotonic()

            async def tick() -> None:
                nonlocal last
                while True:
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.ensure_future(tick())
            started = time.monotonic()
            got = await asyncio.gather(*(asgi_request(mw, "/get_load") for _ in range(50)))
            took = time.monotonic() - started
            await asyncio.sleep(0.05)  # the ticker's next tick, late if the loop was held
            ticker.cancel()
            return got, took, max(gaps)

        before = exec_calls(redis_server.url)
        # Redis holds every command for 0.5 s: the read waits in the middleware's thread while
        # the event loop (vLLM's) goes on.
        redis.Redis.from_url(redis_server.url).execute_command("CLIENT", "PAUSE", "500", "ALL")
        got, took, gap = asyncio.run(many())
        assert {json.loads(body)["load"] for _, _, body in got} == {8}
        assert exec_calls(redis_server.url) - before == one  # 50 polls, one answer's reads
        assert took >= 0.4 and gap < 0.2, (took, gap)
    finally:
        a.close()


def test_redis_stopped_answers_503_with_the_reason_and_recovers(own_redis_server, namespace):
    cfg = StatsConfig(
        url=own_redis_server.url,
        namespace=namespace,
        endpoint="10.0.0.1:8000",
        connect_timeout_ms=300,
        socket_timeout_ms=300,
    )
    a = Endpoint(cfg, "10.0.0.1:8000", 0)
    mw = GetLoadMiddleware(inner_app, cfg, ttl=0)
    try:
        a.set({0: (2, 0), 1: (2, 0), 2: (2, 0), 3: (2, 0)})
        status, doc = load_of(mw)
        assert (status, doc["load"]) == (200, 8)
        own_redis_server.stop(keep_data=True)
        started = time.monotonic()
        status, doc = load_of(mw)
        assert status == 503 and doc["error"] == "connection" and "load" not in doc
        assert time.monotonic() - started < 5
        # the rest of vLLM is not held by Redis
        assert asgi_get(mw, "/v1/models")[0] == 200
        own_redis_server.start()
        a.set({0: (3, 0), 1: (3, 0), 2: (3, 0), 3: (3, 0)})
        assert load_of(mw)[1]["load"] == 12
    finally:
        a.close()


def test_other_requests_pass_through_untouched(redis_server, namespace):
    mw = GetLoadMiddleware(inner_app, StatsConfig(url=redis_server.url, namespace=namespace))
    for path, method in (
        ("/v1/completions", "POST"),
        ("/metrics", "GET"),
        ("/get_load/x", "GET"),
        ("/get_load", "POST"),
    ):
        status, headers, body = asgi_get(mw, path, method=method)
        assert (status, headers.get("x-inner"), body) == (200, "1", b"inner " + path.encode())

    async def lifespan() -> list[str]:
        seen = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            seen.append(scope["type"])

        await GetLoadMiddleware(app)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
        return seen

    assert asyncio.run(lifespan()) == ["lifespan"]


def test_without_a_config_it_answers_for_the_plugins(redis_server, namespace):
    """Under vLLM the middleware is built with no config (``--middleware`` passes none): it
    answers for the config the plugin of its process registered, and says so until there is one."""
    from redis_stats.integrations.vllm import get_load

    mw = GetLoadMiddleware(inner_app, ttl=0)
    get_load.register_config(None)
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, endpoint="10.0.0.1:8000")
    a = Endpoint(cfg, "10.0.0.1:8000", 0)
    try:
        status, doc = load_of(mw)
        assert status == 503 and doc["error"] == "not_configured" and "REDIS_STATS_URL" in doc["detail"]
        a.set({0: (1, 0), 1: (1, 0), 2: (1, 0), 3: (1, 0)})
        get_load.register_config(cfg)
        status, doc = load_of(mw)
        assert (status, doc["load"]) == (200, 4)
    finally:
        get_load.register_config(None)  # no plugin in this process
        a.close()


def test_vllm_adds_it_by_its_import_path(redis_server, namespace):
    """What ``vllm serve --middleware <path>`` does with a class (api_server.py's loop): import
    it by path, ``app.add_middleware(cls)`` on its FastAPI app, no arguments; the app's own
    routes still answer, ``/get_load`` answers for the plugin's registered config."""
    fastapi = pytest.importorskip("fastapi")  # vLLM's app (a dependency of the router wheel)
    import importlib
    import inspect

    from redis_stats.integrations.vllm import get_load

    app = fastapi.FastAPI()

    @app.get("/v1/models")
    def models() -> dict[str, str]:
        return {"object": "list"}

    module_path, object_name = "redis_stats.integrations.vllm.get_load.GetLoadMiddleware".rsplit(".", 1)
    imported = getattr(importlib.import_module(module_path), object_name)
    assert inspect.isclass(imported)
    app.add_middleware(imported)
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, endpoint="10.0.0.1:8000")
    a = Endpoint(cfg, "10.0.0.1:8000", 0)
    try:
        a.set({0: (1, 1), 1: (0, 0), 2: (2, 0), 3: (0, 3)})
        get_load.register_config(cfg)
        status, doc = load_of(app)
        assert (status, doc["load"]) == (200, 7)
        status, _, body = asgi_get(app, "/v1/models")
        assert (status, json.loads(body)) == (200, {"object": "list"})
    finally:
        get_load.register_config(None)  # no plugin in this process
        a.close()


def test_a_bad_ttl_is_refused_by_name():
    with pytest.raises(ValueError, match="ttl=-1"):
        GetLoadMiddleware(inner_app, ttl=-1)


# (b) The real router.


@pytest.mark.slow
def test_vllm_router_power_of_two_sends_to_the_lightly_loaded_endpoint(redis_server, namespace, tmp_path):
    binary = router_binary()
    if binary is None:
        pytest.skip("vllm-router is not installed (the test extra installs it on Linux x86_64/aarch64)")
    pytest.importorskip("uvicorn")
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    light, heavy = StubWorker("light", cfg).start(), StubWorker("heavy", cfg).start()
    pods = {
        w.name: Endpoint(cfg, f"127.0.0.1:{w.port}", first, per_writer=1)
        for w, first in ((light, 0), (heavy, 2))
    }

    def load(name: str, total: int) -> None:  # two engines of the endpoint: total split over them
        pod = pods[name]
        e0, e1 = pod.engines[0][0], pod.engines[1][0]
        pod.set({e0: (total // 2, 0), e1: (0, total - total // 2)})

    load("light", 5)
    load("heavy", 50)
    router = Router([binary], [light.url, heavy.url], tmp_path / "router.log", "warning")
    url = router.url

    def polled_after(before: tuple[int, int]) -> None:
        """Wait until the router has read both workers' /get_load since *before*."""
        router.wait_polled(lambda: (light.polls, heavy.polls), before, timeout=15, settle=0.2)

    try:
        polled_after((0, 0))  # it polls every 5 s (measured), the first time at its start
        assert sent_to(url, 40) == {"light": 40}
        assert light.completions == 40 and heavy.completions == 0
        # The loads swap in Redis: after the router's next poll the traffic follows.
        load("light", 50)
        load("heavy", 5)
        time.sleep(TTL)  # the answers the middleware keeps have aged out
        polled_after((light.polls, heavy.polls))
        assert sent_to(url, 40) == {"heavy": 40}
    finally:
        router.close()
        light.close()
        heavy.close()
        for pod in pods.values():
            pod.close()


PLUGIN_RUN = """
import asyncio
from types import SimpleNamespace as NS

from redis_stats.integrations.vllm.get_load import GetLoadMiddleware
from redis_stats.integrations.vllm.plugin import RedisStatLogger

config = NS(
    model_config=NS(served_model_name="org/m", max_model_len=4096),
    cache_config=NS(metrics_info=lambda: {"block_size": "16", "num_gpu_blocks": "100"}),
    parallel_config=NS(_api_process_rank=0, _api_process_count=1),
    observability_config=None, kv_transfer_config=None, lora_config=None, speculative_config=None,
)
logger = RedisStatLogger(config, [0, 1])  # as vLLM builds it in the API-server process
for e, (running, waiting) in {0: (2, 3), 1: (4, 0)}.items():
    logger.writer.metric("vllm:num_requests_running").labels(e, model_name="org/m").set(running)
    logger.writer.metric("vllm:num_requests_waiting").labels(e, model_name="org/m").set(waiting)
assert logger.writer.flush()
sent = []

async def send(message):
    sent.append(message)

async def receive():
    return {"type": "http.request"}

async def app(scope, receive, send):
    raise AssertionError("/get_load is not passed through")

scope = {"type": "http", "method": "GET", "path": "/get_load"}
asyncio.run(GetLoadMiddleware(app)(scope, receive, send))  # as --middleware builds it: no config
print(sent[0]["status"], sent[1]["body"].decode())
logger.writer.close()
"""


def test_under_the_plugin_it_answers_for_the_plugins_endpoint(redis_server, python_env, tmp_path):
    """The plugin (built as vLLM builds it; vLLM's one base class stubbed: this suite has no
    vLLM) registers its config, and a middleware built with none reads its namespace (the served
    model's) and endpoint."""
    stub = tmp_path / "vllm" / "v1" / "metrics"
    stub.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "v1", stub):
        (d / "__init__.py").write_text("")
    (stub / "loggers.py").write_text("class AggregateStatLoggerBase:\n    pass\n")
    env = dict(python_env, REDIS_STATS_URL=redis_server.url, REDIS_STATS_ENDPOINT="10.1.2.3:8000")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    env.pop("REDIS_STATS_NAMESPACE", None)
    done = subprocess.run(
        [sys.executable, "-c", PLUGIN_RUN], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    status, body = done.stdout.strip().split(" ", 1)
    doc = json.loads(body)
    assert (status, doc["load"], doc["endpoint"], doc["engines"]) == ("200", 9, "10.1.2.3:8000", [0, 1])
