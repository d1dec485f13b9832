"""What the command prints works as printed: the demo's "in another terminal" lines in a new shell,
a closed stdout (`| head`), a mistyped variable name, `top --once` within COLUMNS, `inspect` in
the nouns of docs/architecture.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from redis_stats import StatsConfig, StatsWriter, config
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.options import warn_mistyped_variables
from redis_stats.tools.cli import main
from redis_stats.tools.top import COLUMNS
from tests.conftest import PYTHON, ROOT
from tests.vllm_shapes import iteration, scheduler

SCRIPT = Path(sys.executable).parent / "redis-stats"


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test sees the once-per-process warnings as a new process would."""
    monkeypatch.setattr(config, "_warned_variables", set())


def test_a_mistyped_variable_gets_one_warning_naming_the_closest_known_one(fresh_warnings):
    env = {"REDIS_STATS_NAMESPCE": "prod", "REDIS_STATS_ULR": "redis://x", "REDIS_STATS_ZZZZZ": "1"}
    result = CliRunner().invoke(main, ["inspect", "--help"], env=env)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: REDIS_STATS_NAMESPCE is not a variable redis_stats reads (did you mean "
        "REDIS_STATS_NAMESPACE?); it is ignored",
        "warning: REDIS_STATS_ULR is not a variable redis_stats reads (did you mean REDIS_STATS_URL?); "
        "it is ignored",
        "warning: REDIS_STATS_ZZZZZ is not a variable redis_stats reads (no variable of that name is "
        "read); it is ignored",
    ]
    # Names some part of redis_stats reads are not warned about (the plugin's, the demo's).
    known = {"REDIS_STATS_PORT": "9400", "REDIS_STATS_VIEW": "local", "REDIS_STATS_SERVER_BINARY": "x"}
    result = CliRunner().invoke(main, ["inspect", "--help"], env=known)
    assert "warning:" not in result.stderr


def test_the_vllm_plugin_warns_once_about_its_mistyped_variables(fresh_warnings, caplog):
    env = {
        "REDIS_STATS_PROT": "9400",  # the plugin's port variable, mistyped
        "REDIS_STATS_VEIW": "local",
        "VLLM_LOG_STAT_INTERVAL": "5",  # the vLLM variable the plugin reads, mistyped
        "VLLM_LOGGING_LEVEL": "INFO",  # vLLM's own: not ours to judge
        "VLLM_SOMETHING_NEW": "1",  # unknown to this list of vLLM's, but like nothing the plugin reads
    }
    messages = warn_mistyped_variables(env, vllm_names=["VLLM_LOGGING_LEVEL"])
    assert messages == [
        "REDIS_STATS_PROT is not a variable redis_stats reads (did you mean REDIS_STATS_PORT?); "
        "it is ignored",
        "REDIS_STATS_VEIW is not a variable redis_stats reads (did you mean REDIS_STATS_VIEW?); "
        "it is ignored",
        "VLLM_LOG_STAT_INTERVAL is not a variable redis_stats reads (did you mean "
        "VLLM_LOG_STATS_INTERVAL?); it is ignored",
    ]
    assert [r.getMessage() for r in caplog.records if r.name == "redis_stats.config"] == messages
    # One warning per process: every API server builds a stat logger per engine group.
    assert warn_mistyped_variables(env, vllm_names=["VLLM_LOGGING_LEVEL"]) == []


def test_a_mistyped_prefix_is_named_too_and_other_programs_redis_variables_are_not(fresh_warnings):
    """REDIS_STAT_URL was silent: the URL fell back to 127.0.0.1:6379 (the vLLM plugin stayed
    off) with no word of why. Names that are nearly ours but for the prefix are warned about;
    REDIS_URL, REDIS_HOST, REDIS_TLS_URL (other programs') are not."""
    env = {
        "REDIS_STAT_URL": "redis://x",
        "REDISSTATS_NAMESPACE": "prod",
        "REDIS_STATUS_VIEW": "local",
        "REDIS_URL": "redis://cache",
        "REDIS_HOST": "cache",
        "REDIS_TLS_URL": "rediss://cache",
    }
    result = CliRunner().invoke(main, ["inspect", "--help"], env=env)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: REDISSTATS_NAMESPACE is not a variable redis_stats reads (did you mean "
        "REDIS_STATS_NAMESPACE?); it is ignored",
        "warning: REDIS_STATUS_VIEW is not a variable redis_stats reads (did you mean "
        "REDIS_STATS_VIEW?); it is ignored",
        "warning: REDIS_STAT_URL is not a variable redis_stats reads (did you mean REDIS_STATS_URL?); "
        "it is ignored",
    ]
    # ... and under vLLM, where a mistyped URL leaves the plugin off.
    config._warned_variables.clear()
    messages = warn_mistyped_variables({"REDIS_STAT_URL": "redis://x"}, vllm_names=[])
    assert messages == [
        "REDIS_STAT_URL is not a variable redis_stats reads (did you mean REDIS_STATS_URL?); it is ignored"
    ]


@pytest.fixture
def busy_namespace(redis_server, namespace):
    """Two writers, two engines with traffic, in a real Redis; the command's environment."""
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    writers = [StatsWriter(cfg, vllm_catalog(), engines=[0, 1], start=False) for _ in range(2)]
    for w in writers:
        rec = VllmRecorder(w, "m", [0, 1])
        for e in (0, 1):
            rec.record(
                scheduler(running=3, waiting=1, kv=0.5), iteration(prompt=90, generation=30), engine_idx=e
            )
        assert w.flush()
    yield {"REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    for w in writers:
        w._closed = True


def test_inspect_speaks_the_nouns_of_the_architecture_page(busy_namespace):
    result = CliRunner().invoke(main, ["inspect"], env=busy_namespace)
    assert result.exit_code == 0, result.output
    engine0 = next(line for line in result.output.splitlines() if line.strip().startswith("engine 0:"))
    # Before: "... 8 current series, 4 fields: 2 chunks of 2 writers, 0 base fields".
    assert re.search(r"\d+ series, stored by 2 writers in 2 chunks$", engine0), engine0
    assert "fields" not in result.output.split("writers:")[0]


@pytest.mark.parametrize("columns", [None, "80", "60"])
def test_top_once_fits_the_width_without_cutting_a_cell(busy_namespace, columns):
    env = dict(busy_namespace)
    if columns is None:
        env["COLUMNS"] = ""  # unset for CliRunner: 80, as a terminal would be
    else:
        env["COLUMNS"] = columns
    result = CliRunner().invoke(main, ["top", "--once", "--interval", "0.2"], env=env)
    assert result.exit_code == 0, result.output
    width = int(columns or 80)
    lines = result.output.splitlines()
    assert all(len(line) <= width for line in lines), [len(line) for line in lines]
    header = next(line for line in lines if line.startswith("engine"))
    shown = re.split(r"\s{2,}", header.strip())
    assert set(shown) <= set(COLUMNS) and {"engine", "up", "gen tok/s"} <= set(shown)  # whole names
    row0 = next(line for line in lines if line.startswith("0 "))
    assert len(re.split(r"\s{2,}", row0.strip())) == len(shown)  # a cell for every column shown


def test_a_closed_stdout_ends_the_command_quietly_with_exit_0(redis_server, namespace):
    # Enough engines that inspect's lines outgrow the pipe's buffer: it writes after `head` left.
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    w = StatsWriter(cfg, vllm_catalog(), engines=list(range(1500)), start=False)
    assert w.flush()
    env = {**os.environ, "REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "inspect"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().startswith(b"namespace ")
    proc.stdout.close()  # `| head -1`
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err == b""  # before: "reading ... failed (connection: [Errno 32] Broken pipe) / is Redis running?"
    w._closed = True


@pytest.mark.redis_server
@pytest.mark.slow
def test_the_demos_commands_for_another_terminal_work_in_a_new_shell(python_env, tmp_path):
    proc = subprocess.Popen(
        [str(SCRIPT), "demo", "--port", "0", "--nodes", "1", "--api-servers", "1", "--duration", "40"],
        cwd=ROOT, env=python_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(
        target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout), daemon=True
    ).start()
    try:
        deadline = time.monotonic() + 30
        while not any(line.startswith("periodic log lines") for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "\n".join(lines)
            time.sleep(0.1)
        at = next(i for i, line in enumerate(lines) if "in another terminal" in line)
        export, top, inspect = (line.strip() for line in lines[at + 1 : at + 4])
        assert export.startswith("export REDIS_STATS_URL=") and top.endswith(" top"), lines
        # A new shell: no virtualenv activated, another directory, the system's PATH only.
        shell = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)}
        for _ in range(20):
            done = subprocess.run(
                ["bash", "-c", f"{export}\n{inspect}"],
                cwd=tmp_path,
                env=shell,
                capture_output=True,
                text=True,
            )
            if done.returncode != 3:  # 3: the namespace holds nothing yet (the first flush is coming)
                break
            time.sleep(0.5)
        assert done.returncode == 0, done.stderr
        assert "engines: 1" in done.stdout
        top_once = subprocess.run(
            ["bash", "-c", f"{export}\n{top} --once --interval 0.5"],
            cwd=tmp_path, env=shell, capture_output=True, text=True,
        )  # fmt: skip
        assert top_once.returncode == 0, top_once.stderr
    finally:
        proc.terminate()
        proc.wait(30)
