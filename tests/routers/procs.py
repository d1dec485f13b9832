"""The real routers the tests run (vllm-router, sglang-router: the test extra's wheels) and the stub
"vLLM" workers behind them, wrapped in the middleware as ``vllm serve --middleware`` wraps vLLM."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from redis_stats import StatsConfig
from redis_stats.integrations.vllm.get_load import GetLoadMiddleware
from redis_stats.tools.embedded import free_port

__all__ = ["Router", "StubWorker", "free_port", "post", "router_binary", "sent_to"]


class StubWorker:
    """A tiny "vLLM": the OpenAI completion route, /health, /v1/models, wrapped in the middleware
    exactly as ``vllm serve --middleware`` wraps vLLM's app, served by uvicorn (what vLLM runs)."""

    def __init__(
        self, name: str, cfg: StatsConfig, middleware: type[GetLoadMiddleware] = GetLoadMiddleware
    ) -> None:
        import uvicorn

        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.completions = 0
        self.polls = 0  # /get_load answered (counted outside the middleware)
        self.paths: collections.Counter[str] = collections.Counter()  # every path asked for
        wrapped = middleware(self.app, cfg.replace(endpoint=f"127.0.0.1:{self.port}"))

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await wrapped(scope, receive, send)
            if scope["type"] == "http":
                self.paths[scope["path"]] += 1
                self.polls += scope["path"] == "/get_load"

        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/v1/completions":
            self.completions += 1
            doc: Any = {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": int(time.time()),
                "model": "m",
                "choices": [{"index": 0, "text": self.name, "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        elif scope["path"] == "/v1/models":
            doc = {"object": "list", "data": [{"id": "m", "object": "model"}]}
        else:
            doc = {}
        body = json.dumps(doc).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def start(self) -> StubWorker:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the stub worker did not start"
            time.sleep(0.02)
        return self

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)


def router_binary(name: str = "vllm-router") -> str | None:
    """The router's command (``vllm-router``, ``sglang-router``: the test extra's wheels), on the
    PATH or in this virtualenv (not on the PATH when its ``bin`` is not), or None."""
    found = shutil.which(name)
    here = os.path.join(os.path.dirname(sys.executable), name)
    return found or (here if os.path.exists(here) else None)


def post(url: str) -> str:
    data = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["choices"][0]["text"]


def sent_to(router: str, n: int) -> collections.Counter[str]:
    return collections.Counter(post(router + "/v1/completions") for _ in range(n))


class Router:
    """A real router process (*command*: vllm-router's, or sglang-router's ``launch``) on a free
    loopback port, routing by ``power_of_two`` over *workers*, its output in *log_path*; stopped
    by :meth:`close`. Its own Prometheus listener gets a free loopback port too: both routers
    default to 29000, and two at once (xdist workers) made the second panic on start."""

    def __init__(self, command: list[str], workers: list[str], log_path: Path, log_level: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [
                *command,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                "power_of_two",
                "--worker-urls",
                *workers,
                "--worker-startup-check-interval",
                "1",
                "--log-level",
                log_level,
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_polled(
        self, polls: Callable[[], Sequence[int]], before: Sequence[int], timeout: float, settle: float
    ) -> None:
        """Wait until the router has polled every worker since *before* (their counts, as
        *polls* gives them), then *settle* s for its answers to reach the policy; the router
        must stay up meanwhile (else its log is the failure)."""
        deadline = time.monotonic() + timeout
        while any(n <= b for n, b in zip(polls(), before)):
            assert self.process.poll() is None and time.monotonic() < deadline, self.log_path.read_text()
            time.sleep(0.05)
        time.sleep(settle)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()
