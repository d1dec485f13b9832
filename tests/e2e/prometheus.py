"""A real Prometheus for the end-to-end tests (Debian's package: ``make test-e2e`` installs it), the
processes of a run around it, and PromQL over its HTTP API.

``Fleet(tmp_path)`` starts the run's processes (each logging to a file of *tmp_path*, every one
stopped by pid); ``fleet.prometheus(config)`` starts Prometheus over a ``prometheus.yml`` given as
a dict, on a free loopback port, its data in *tmp_path*, and returns its :class:`PromQL` once it
is ready."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from redis_stats.tools.embedded import free_port

from ..conftest import ROOT

__all__ = ["PROMETHEUS", "PROMTOOL", "Fleet", "PromQL", "free_port", "get", "needs_prometheus", "wait_for"]

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus (make test-e2e installs it)")
"""A test that runs a real Prometheus skips without one (``make test-e2e`` installs it)."""


def get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def wait_for(url: str, what: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            get(url, timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{what} did not answer {url} within {timeout} s")


class PromQL:
    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            doc = json.loads(get(f"{self.base}/api/v1/query?{urllib.parse.urlencode(params)}"))
        except urllib.error.HTTPError as exc:  # a PromQL error: 400 or 422, its message in the body
            raise AssertionError(f"{expr}: {exc.code} {exc.read().decode(errors='replace')}") from None
        assert doc["status"] == "success", (expr, doc)
        return doc["data"]["result"]

    def label_values(self, grafana_query: str) -> set[str]:
        """What Grafana's ``label_values(selector, label)`` lists, from /api/v1/series."""
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", grafana_query)
        assert m, grafana_query
        url = f"{self.base}/api/v1/series?{urllib.parse.urlencode({'match[]': m.group(1)})}"
        doc = json.loads(get(url))
        return {series[m.group(2)] for series in doc["data"] if m.group(2) in series}

    def by(self, expr: str, label: str, at: float | None = None) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(expr, at)}

    def scalar(self, expr: str, at: float | None = None) -> float:
        (result,) = self.query(expr, at)
        return float(result["value"][1])


class Fleet:
    """The processes of one run; every one stopped by pid."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], env: dict[str, str], name: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.procs.append(proc)
        return proc

    def prometheus(self, config: dict[str, Any], *args: str) -> PromQL:
        """A real Prometheus over *config* (its ``prometheus.yml``: JSON is YAML) with *args* (more
        flags), on a free loopback port, ready when this returns."""
        assert PROMETHEUS is not None, "no prometheus (make test-e2e installs it)"
        (self.tmp / "prometheus.yml").write_text(json.dumps(config))
        port = free_port()
        proc = self.start(
            [
                PROMETHEUS,
                f"--config.file={self.tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                *args,
                "--log.level=warn",
            ],
            dict(os.environ),
            "prometheus",
        )
        api = PromQL(f"http://127.0.0.1:{port}")
        wait_for(f"{api.base}/-/ready", "prometheus", proc)
        return api

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
