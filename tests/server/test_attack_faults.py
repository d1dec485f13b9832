"""Attack (issue 39): the exporter closed while requests are in flight on a frozen Redis (a pod
terminated during an outage): close() returns at once, every request in flight ends (an answer,
or its connection closed), and no thread of the exporter is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter
from tests.server.test_kept_views import fleet

pytestmark = pytest.mark.redis_server


def ask(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
            return str(r.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except OSError as exc:  # the connection closed: fine, the server is gone
        return type(exc).__name__


def test_closing_with_requests_in_flight_on_a_frozen_redis_returns_at_once(own_redis_server, namespace):
    writers = fleet(own_redis_server.url, namespace, 2)
    before = {t.ident for t in threading.enumerate()}
    config = StatsConfig(url=own_redis_server.url, namespace=namespace)
    exporter = Exporter(StatsReader(config, vllm_catalog()), port=0, roles=VLLM_ROLES).start()
    paths = ["/metrics", "/metrics?endpoint=10.0.1.1:8000", "/metrics?engine=2", "/metrics?slice=1/2"]
    paths += ["/snapshot", "/load", "/get_load?endpoint=10.0.1.1:8000", "/endpoints", "/healthz"]
    for path in paths:  # every view made, every plan read
        assert ask(exporter.url + path) == "200", path
    os.kill(own_redis_server.pid, signal.SIGSTOP)
    frozen = True
    try:
        with ThreadPoolExecutor(len(paths) * 2) as pool:
            flying = [pool.submit(ask, exporter.url + p) for p in paths * 2]
            time.sleep(0.3)  # in flight: the reads wait on Redis
            started = time.monotonic()
            exporter.close()
            took = time.monotonic() - started
            os.kill(own_redis_server.pid, signal.SIGCONT)
            frozen = False
            answers = [f.result(timeout=30) for f in flying]
    finally:
        if frozen:
            os.kill(own_redis_server.pid, signal.SIGCONT)
        for w in writers:
            w._closed = True
    assert took < 1.0, f"close() took {took:.1f} s"
    assert len(answers) == len(paths) * 2
    deadline = time.monotonic() + 10
    while left := [t.name for t in threading.enumerate() if t.ident not in before]:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)
