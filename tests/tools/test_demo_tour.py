"""The demo is the tour (issue 50, item 1): it records endpoints (two engines behind each), every
view a router reads answers on it, and the commands it prints to try them work as printed: each
curl line, the stream of /watch, the example router following the feed."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import PYTHON, ROOT
from tests.tools.test_doc_samples import Step, compare, samples_of

pytestmark = pytest.mark.redis_server


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def printed_curl_urls(lines: list[str]) -> list[tuple[list[str], str]]:
    """(curl arguments, URL) of each printed curl command (before its comment and pipe)."""
    found = []
    for line in lines:
        command = line.split("#")[0].split("|")[0].strip().removeprefix("try:").strip()
        if command.startswith("curl "):
            args = shlex.split(command)
            found.append((args, next(a for a in args if a.startswith("http://"))))
    return found


def test_every_router_view_answers_on_the_demo_as_printed(python_env):
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "demo", "--port", "0", "--duration", "40"],
        cwd=ROOT, env=python_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("periodic log lines"):
                break
        text = "".join(lines)
        (sample,) = [s for s in samples_of(ROOT / "docs" / "cli.md") if s.mode == "demo"]
        (step,) = sample.steps  # docs/cli.md's sample: what the demo printed, its first log lines too
        # vLLM prints an engine's SpecDecoding line only when it drafted in the interval: compared
        # where printed, never counted on
        spec = [x for x in step.output if "SpecDecoding metrics" in x]
        shown = [x for x in step.output if x not in spec]
        logged = [line.rstrip("\n") for line in lines]
        while len(logged) < len(shown):
            line = proc.stdout.readline().rstrip("\n")
            if "SpecDecoding metrics" in line:
                compare(Step(step.command, spec[:1]), [line])
            else:
                logged.append(line)
        compare(Step(step.command, shown), logged)
        view = re.search(r"Redis view of every engine: (http://\S+)/metrics", text).group(1)
        assert "engines 0, 1 behind endpoint demo-0:8000" in text, text
        curls = printed_curl_urls(lines)
        paths = {url[len(view) :].split("?")[0] for _, url in curls}
        assert {"/get_load", "/v1/loads", "/loads", "/pool", "/watch", "/load", "/metrics"} <= paths, paths
        deadline = time.monotonic() + 30  # the first flushes of every node process (both engines)
        while time.monotonic() < deadline:
            status, body = fetch(view + "/get_load?endpoint=demo-0:8000")
            if status == 200 and json.loads(body)["engines"] == [0, 1]:
                break
            time.sleep(0.2)
        for args, url in curls:
            headers = {}
            if "-H" in args:
                name, _, value = args[args.index("-H") + 1].partition(": ")
                headers[name] = value
            if url.endswith("/watch"):  # a stream: its first event is the whole state
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
                    assert r.headers["Content-Type"].startswith("text/event-stream")
                    assert r.readline() == b"event: state\n"
                continue
            status, body = fetch(url, headers)
            assert status == 200, (url, body[:300])
            if "/get_load" in url:
                doc = json.loads(body)
                assert doc["engines"] == [0, 1] and isinstance(doc["load"], int), doc
            if "/v1/loads" in url:
                assert [e["dp_rank"] for e in json.loads(body)["loads"]] == [0, 1]
        (router,) = [line.split("#")[0].split() for line in lines if "load_router.py" in line]
        out = subprocess.run(
            [PYTHON, *router[1:], "--count", "2"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0 and out.stdout.count("send to engine") == 2, out.stdout + out.stderr
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_dev_redis_serves_the_library_until_ctrl_c_then_removes_its_data(python_env):
    import os
    import signal
    import socket

    from redis_stats import StatsConfig, StatsReader, StatsWriter
    from redis_stats.integrations.vllm import vllm_catalog

    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "dev-redis"],
        cwd=ROOT, env=python_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        data_dir = re.search(r"\(data in (\S+),", lines[0]).group(1)
        (export,) = [line.split() for line in lines if line.strip().startswith("export ")]
        name, _, url = export[1].partition("=")
        assert name == "REDIS_STATS_URL" and os.path.isdir(data_dir), lines
        # docs/library.md: the exported URL is what from_env() reads
        config = StatsConfig.from_env({name: url}, namespace="tour")
        writer = StatsWriter(config, vllm_catalog(), engines=[0], start=False)
        writer.metric("vllm:num_requests_running").labels(0, model_name="m").set(3)
        assert writer.flush()
        writer.close()
        assert StatsReader(config, vllm_catalog()).snapshot().engines[0] is not None
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "stopped; its data is removed" in out
    assert not os.path.exists(data_dir)
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
        pass


def test_dev_redis_on_a_taken_port_says_so_in_one_line(python_env):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [PYTHON, "-m", "redis_stats", "dev-redis", "--port", str(port)],
            cwd=ROOT, env=python_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == (
        f"Error: cannot serve on 127.0.0.1:{port}: Address already in use: give another --port, or 0 "
        "for a free one\n"
    )
