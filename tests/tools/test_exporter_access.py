"""`redis-stats exporter`'s access control as an operator runs it: a broken file refused at start
naming the flag, SIGHUP reloading, and no secret on any process's command line or output; the
vLLM pod's view configured by REDIS_STATS_WEB_* variables, checked at start."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import time
import urllib.error

import pytest
from click.testing import CliRunner

from redis_stats.config import ConfigError
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.serve import maybe_serve
from redis_stats.tools.cli import main
from redis_stats.tools.embedded import free_port
from tests.certs import bcrypt_hash, http_get
from tests.conftest import PYTHON, ROOT

PASSWORD = "cli-pw-Planted-77"
NEW_PASSWORD = "cli-pw-Rotated-88"


def basic(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--web-config-file", "{dir}/missing.yml"], "--web-config-file: cannot read"),
        (["--web-token-file", "{dir}/empty"], "--web-token-file: {dir}/empty holds no"),
        (["--web-config-file", "{dir}/web.yml", "--web-open", "/helthz"], "--web-open: web_open ['/helthz']"),
    ],
)
def test_the_exporter_refuses_access_control_it_cannot_use_naming_the_flag(tmp_path, args, said):
    (tmp_path / "empty").write_text("")
    (tmp_path / "web.yml").write_text(f"basic_auth_users: {{prometheus: {bcrypt_hash(PASSWORD)}}}\n")
    args = [a.format(dir=tmp_path) for a in args]
    result = CliRunner().invoke(
        main, ["exporter", "--redis-url", "redis://127.0.0.1:1/0", "--port", "0", *args]
    )
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split()).replace("'--", "--").replace("':", ":")  # click's quotes vary
    assert "Invalid value for " + said.format(dir=tmp_path) in text, result.output


def test_sighup_reloads_and_no_secret_is_on_a_command_line_or_in_the_output(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD)}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    env.update(REDIS_STATS_URL=f"redis://127.0.0.1:{free_port()}/0", REDIS_STATS_WEB_CONFIG_FILE=str(web))
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "redis_stats",
            "exporter",
            "--port",
            "0",
            "--gc-interval",
            "0",
            "--web-open",
            "/healthz",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"on http://[\d.]+:(\d+)/metrics \(plain HTTP, 1 basic-auth users\)", line)
        assert match, line
        port = int(match.group(1))
        cmdline = (f"/proc/{proc.pid}/cmdline", f"/proc/{proc.pid}/environ")
        with open(cmdline[0], "rb") as f:
            assert PASSWORD.encode() not in f.read()
        assert http_get(port, "/metrics", basic(PASSWORD))[0] == 200
        # A new password, and SIGHUP at once (the change is also seen by itself within a second;
        # SIGHUP is how systemd's reload says it)
        web.write_text(f"basic_auth_users:\n  prometheus: {bcrypt_hash(NEW_PASSWORD)}\n")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while http_get(port, "/metrics", basic(NEW_PASSWORD))[0] != 200:
            assert time.monotonic() < deadline, "SIGHUP did not reload"
            time.sleep(0.1)
        assert http_get(port, "/metrics", basic(PASSWORD))[0] == 401
        assert proc.poll() is None, "SIGHUP ended the exporter"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert PASSWORD not in out + err and NEW_PASSWORD not in out + err


@pytest.fixture
def serve(monkeypatch, config):
    started = []

    def run(**env):
        for key in (
            "REDIS_STATS_PORT",
            "REDIS_STATS_WEB_CONFIG_FILE",
            "REDIS_STATS_WEB_TOKEN_FILE",
            "REDIS_STATS_WEB_OPEN",
        ):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        exporter = maybe_serve(config, vllm_catalog())
        if exporter is not None:
            started.append(exporter)
        return exporter

    yield run
    for exporter in started:
        exporter.close()


def test_the_vllm_pods_view_takes_its_access_control_from_the_environment(serve, tmp_path):
    (tmp_path / "tokens").write_text("a-token-of-the-pod-1234\n")
    exporter = serve(
        REDIS_STATS_PORT="0",
        REDIS_STATS_WEB_TOKEN_FILE=str(tmp_path / "tokens"),
        REDIS_STATS_WEB_OPEN="/healthz",
    )
    assert http_get(exporter.port, "/metrics")[0] == 401
    assert http_get(exporter.port, "/metrics", {"Authorization": "Bearer a-token-of-the-pod-1234"})[0] == 200
    try:
        status = http_get(exporter.port, "/healthz")[0]
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status in (200, 503)


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"REDIS_STATS_WEB_CONFIG_FILE": "{dir}/none.yml"}, "REDIS_STATS_WEB_CONFIG_FILE: cannot read"),
        ({"REDIS_STATS_WEB_TOKEN_FILE": "{dir}/bad"}, "REDIS_STATS_WEB_TOKEN_FILE: {dir}/bad: line 1 is not"),
        (
            {"REDIS_STATS_WEB_TOKEN_FILE": "{dir}/good", "REDIS_STATS_WEB_OPEN": "/nope"},
            "REDIS_STATS_WEB_OPEN: web_open",
        ),
        (
            {"REDIS_STATS_WEB_OPEN": "healthz"},
            "REDIS_STATS_WEB_OPEN: web_open=('healthz',) must be a list of paths",
        ),
    ],
)
def test_the_vllm_pods_view_refuses_what_it_cannot_use_naming_the_variable(serve, tmp_path, env, said):
    (tmp_path / "bad").write_text("short\n")
    (tmp_path / "good").write_text("a-token-of-the-pod-1234\n")
    with pytest.raises(ConfigError) as caught:
        serve(REDIS_STATS_PORT="0", **{k: v.format(dir=tmp_path) for k, v in env.items()})
    assert said.format(dir=tmp_path) in str(caught.value)
    assert "short" not in str(caught.value)
