"""Attack (issue 39 item 4): the views during a rolling upgrade. Pods of the last release
(f5ee21c) and of this one write one namespace, each with its load feed and its endpoint; the
exporter of each release serves ``/load``, ``/endpoints`` and the endpoint views of every pod
(this release's ``/get_load`` too), with the numbers both releases' writers stored.
(tests/store/test_release_mix.py compares the snapshots; this compares what routers read.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.bridge.roles import BRIDGE_ROLES
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter
from redis_stats.tools.embedded import free_port
from tests.conftest import ROOT
from tests.probes import fetch
from tests.store.test_attack_versions import _checkout, _run
from tests.store.test_release_mix import LAST_RELEASE

pytestmark = pytest.mark.redis_server

POD = """
import sys
from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
cfg = StatsConfig(url=sys.argv[1], namespace=sys.argv[2], endpoint=sys.argv[3], stale_after=3600)
engines = [int(x) for x in sys.argv[4].split(",")]
for role in ("api0", "api1"):
    w = StatsWriter(cfg, vllm_catalog(), engines=engines, start=False, role=role, load=VLLM_LOAD)
    for e in engines:
        w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(3)
        w.metric("vllm:num_requests_running").labels(e, model_name="m").set(2)
        w.metric("vllm:kv_cache_usage_perc").labels(e, model_name="m").set(0.25 * (e + 1))
        w.metric("vllm:prompt_tokens").labels(e, model_name="m").inc(100)
    assert w.flush()
    w._closed = True  # stays live: its gauges count
"""

OLD, NEW = "10.0.0.1:8000", "10.0.0.2:8000"  # the last release's pod (engines 0, 1), this one's (2, 3)


def protocol(text: str) -> dict[str, str]:
    wanted = ("vllm:num_requests_waiting{", "vllm:num_requests_running{", "vllm:kv_cache_usage_perc{")
    wanted += ("redis_stats_endpoint_up{", "redis_stats_up ")
    return {
        line.split("{")[0].split(" ")[0]: line.rpartition(" ")[2]
        for line in text.splitlines()
        if line.startswith(wanted)
    }


def check(url: str, *, get_load: bool) -> None:
    status, body = fetch(url + "/load")
    assert status == 200, body
    doc = json.loads(body)
    assert doc["skipped"] == {}, doc["skipped"]
    for e in ("0", "1", "2", "3"):  # two writers each set the same gauges
        assert (doc["engines"][e]["requests_running"], doc["engines"][e]["requests_waiting"]) == (2, 3)
    status, body = fetch(url + "/endpoints")
    endpoints = json.loads(body)["endpoints"]
    assert {k: sorted(v["engines"]) for k, v in endpoints.items()} == {OLD: ["0", "1"], NEW: ["2", "3"]}
    for endpoint, kv in ((OLD, "0.5"), (NEW, "1.0")):
        status, body = fetch(url + "/metrics?endpoint=" + endpoint)
        assert status == 200
        assert protocol(body.decode()) == {
            "vllm:num_requests_waiting": "6.0",
            "vllm:num_requests_running": "4.0",
            "vllm:kv_cache_usage_perc": kv,
            "redis_stats_endpoint_up": "1",
            "redis_stats_up": "1.0",
        }, endpoint
        if get_load:
            status, body = fetch(url + "/get_load?endpoint=" + endpoint)
            assert status == 200 and json.loads(body)["load"] == 10, body


def test_the_views_of_both_releases_over_pods_of_both(redis_server, namespace, tmp_path):
    old = _checkout(LAST_RELEASE, tmp_path / "old")
    _run(POD, old, redis_server.url, namespace, OLD, "0,1")
    _run(POD, ROOT, redis_server.url, namespace, NEW, "2,3")
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    mine = Exporter(StatsReader(config, vllm_catalog()), port=0, roles=VLLM_ROLES + BRIDGE_ROLES).start()
    try:
        check(mine.url, get_load=True)
    finally:
        mine.close()
    port = free_port()
    args = [sys.executable, "-m", "redis_stats", "exporter", "--redis-url", redis_server.url]
    args += ["--namespace", namespace, "--port", str(port), "--gc-interval", "0"]
    theirs = subprocess.Popen(
        args,
        cwd=old,
        env={"PYTHONPATH": str(old), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while fetch_or_none(url + "/healthz") != 200:
            assert time.monotonic() < deadline and theirs.poll() is None, "the last release's exporter"
            time.sleep(0.1)
        check(url, get_load=False)  # (/get_load is this release's)
    finally:
        theirs.terminate()
        theirs.wait(10)


def fetch_or_none(url: str) -> int | None:
    try:
        return fetch(url)[0]
    except OSError:
        return None
