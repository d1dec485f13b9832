"""An honest install: the wheel builds, and installs into a clean virtualenv with its Lua scripts,
its live page, the ``redis-stats`` command and the vLLM entry point (docs/install in the README)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


def run(args: list[str], cwd: Path, timeout: float = 600) -> str:
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.mark.slow
def test_the_wheel_installs_into_a_clean_virtualenv_with_scripts_page_and_entry_point(tmp_path):
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "redis_stats", src / "redis_stats", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    # pip builds it as `python -m build` would (an isolated build with setuptools from the index).
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], tmp_path)
    (wheel,) = dist.glob("redis_stats-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for script in ("common", "flush", "gc", "lease", "read", "shards"):
        assert f"redis_stats/_scripts/{script}.lua" in names
    assert "redis_stats/server/web/index.html" in names and "redis_stats/py.typed" in names

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "-q", str(wheel)], tmp_path)  # its dependencies from the index
    elsewhere = tmp_path / "elsewhere"  # not the checkout: the installed package is imported
    elsewhere.mkdir()
    assert "Usage: redis-stats" in run([str(venv / "bin" / "redis-stats"), "--help"], elsewhere)
    check = (
        "import importlib.metadata as m, redis_stats, redis_stats._scripts as s;"
        "import redis_stats.server.views.page as e;"
        "print(redis_stats.__file__);"
        "print(sorted(e.value for e in m.entry_points(group='vllm.stat_logger_plugins')));"
        "print(len(s.load_script('flush')) > 1000, e.live_page().startswith(b'<!doctype html>'))"
    )
    where, plugins, loaded = run([str(py), "-c", check], elsewhere).splitlines()
    assert where.startswith(str(venv))
    assert plugins == "['redis_stats.integrations.vllm.plugin:RedisStatLogger']"
    assert loaded == "True True"


@pytest.mark.slow
def test_make_demo_installs_what_the_demo_needs_and_not_the_test_tools(tmp_path):
    # `make demo` on a fresh checkout: the package and its runtime dependencies (about 49 MB of
    # .venv), not the test extras (504 MB: pytest, mypy, the routers' binaries); the demo runs.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "Makefile"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "redis_stats", src / "redis_stats", ignore=shutil.ignore_patterns("__pycache__"))
    run(["make", "--no-print-directory", ".venv/.installed-demo", f"PYTHON={sys.executable}"], src)
    listed = run([str(src / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"], src)
    installed = {line.split("==")[0].lower().replace("_", "-") for line in listed.split()}
    assert {"redis", "prometheus-client", "click", "rich"} <= installed, installed
    assert not installed & {"pytest", "mypy", "vllm-router", "sglang-router", "fakeredis", "ruff"}, installed
    size = sum(f.stat().st_size for f in (src / ".venv").rglob("*") if f.is_file() and not f.is_symlink())
    assert size < 120 * 2**20, size  # 504 MB with the test extras
    help_text = run([str(src / ".venv" / "bin" / "redis-stats"), "demo", "--help"], src)
    assert "--engines-per-endpoint" in help_text
