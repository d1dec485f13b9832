"""Fixtures of the bridge's tests: a Redis config, sources in their own process (`helpers`:
they can be killed, stopped, restarted) and in this one (`inproc`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from redis_stats import StatsConfig
from redis_stats.tools.embedded import free_port
from tests.conftest import ROOT
from tests.helpers.metrics_source import SyntheticCatalogue, serve


@pytest.fixture
def inproc():
    """An in-process source (faster than a process where no kill is needed)."""
    servers = []

    def make(catalog: str = "sglang", engines: int = 1, auth: str | None = None, process: bool = False):
        cat = SyntheticCatalogue(catalog, engines, seed=len(servers), process=process)
        server = serve(cat, auth=auth)
        servers.append(server)
        return cat, f"http://127.0.0.1:{server.server_port}/metrics"

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def cfg(redis_server, namespace) -> StatsConfig:
    return StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.2)


class Helper:
    """tests/helpers/metrics_source.py in its own process (so it can be killed, stopped, restarted)."""

    def __init__(
        self,
        port: int | None = None,
        catalog: str = "sglang",
        seed: int = 0,
        engines: int = 1,
        process: bool = False,
    ) -> None:
        self.port = port or free_port()
        args = [
            "--port",
            str(self.port),
            "--catalog",
            catalog,
            "--seed",
            str(seed),
            "--engines",
            str(engines),
            *(["--process"] if process else []),
        ]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.metrics_source", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == b"ready\n"
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def call(self, path: str) -> None:
        urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10).read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def helpers():
    made: list[Helper] = []

    def make(**kw: object) -> Helper:
        made.append(Helper(**kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for h in made:
        h.kill()
