"""Attack: a rolling upgrade. Writers of the previous version and of this one share a namespace
(a StatefulSet being rolled, one pod at a time), and readers of both versions read it.

The previous versions (schema 1) are taken from this repository's history (``git archive``): the
one before issues 12/13 (060b7b5) and the last one before schema 2 (0ed1547). Schema 2 keeps its
data under ``rs:{NS}:v2:`` (docs/key-schema.md), so during the upgrade each version reads exactly
the totals of its own version's writers: neither refuses the namespace, neither miscounts or
overwrites the other's data, and every flush of either version is applied.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.redis_server

PREVIOUS = {"before-issue-12": "060b7b5", "before-schema-2": "0ed1547"}

WRITE = """
import sys
from redis_stats import StatsConfig, StatsWriter
from tests.conftest import sample_catalog
cfg = StatsConfig(url=sys.argv[1], namespace=sys.argv[2])
w = StatsWriter(cfg, sample_catalog(), engines=[0, 1], start=False)
for e in (0, 1):
    w.counter("tokens").labels(engine=e).inc(10 + e)
    w.counter("requests").labels(engine=e, reason='we"ird\\\\n\\n').inc(2)
    w.gauge("inflight").labels(engine=e).set(2)
    for v in (0.05, 0.3, 0.7, 2, 9):
        w.histogram("latency_seconds").labels(engine=e).observe(v)
assert w.flush()
w._closed = True  # stay live: its gauges count
"""

READ = """
import json, sys
from redis_stats import StatsConfig, StatsReader
from tests.conftest import sample_catalog
snap = StatsReader(StatsConfig(url=sys.argv[1], namespace=sys.argv[2]), sample_catalog()).snapshot()
out = {}
for e, eng in sorted(snap.engines.items()):
    h = eng.histogram("latency_seconds")
    out[str(e)] = [eng.counter("tokens"), eng.counter("requests", 'we"ird\\\\n\\n'), eng.gauge("inflight"),
                   h.count, h.sum]
print(json.dumps(out))
"""


def _checkout(commit: str, into: Path) -> Path:
    into.mkdir()
    try:
        archive = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "archive",
                commit,
                "redis_stats",
                "tests/conftest.py",
                "tests/__init__.py",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"no git history with {commit} here")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=60)
    return into


def _run(code: str, root: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _totals(writers: int) -> dict[str, list[float]]:
    """What *writers* runs of WRITE add up to, per engine (tokens, requests, inflight, count, sum)."""
    return {
        str(e): [writers * (10 + e), writers * 2, writers * 2, writers * 5, writers * 12.05] for e in (0, 1)
    }


@pytest.mark.parametrize("previous", list(PREVIOUS))
def test_a_rolling_upgrade_keeps_each_versions_totals_exact(redis_server, namespace, tmp_path, previous):
    old = _checkout(PREVIOUS[previous], tmp_path / "old")
    new = ROOT
    for root in (old, new, old, new, new):  # writers of both versions, alternating, one namespace
        _run(WRITE, root, redis_server.url, namespace)  # WRITE asserts its flush was applied
    for reader, writers in ((new, 3), (old, 2)):
        got = json.loads(_run(READ, reader, redis_server.url, namespace).strip().splitlines()[-1])
        expected = _totals(writers)
        assert got.keys() == expected.keys(), (str(reader), got)
        for e, values in expected.items():
            assert got[e] == pytest.approx(values), (str(reader), e, got[e])


def test_namespaces_names_a_namespace_that_holds_only_the_previous_versions_data(
    redis_server, namespace, tmp_path
):
    old = _checkout(PREVIOUS["before-schema-2"], tmp_path / "old")
    _run(WRITE, old, redis_server.url, namespace)
    listing = _run(
        "import sys; from redis_stats.tools.cli import main; main()",
        ROOT,
        "namespaces",
        "--redis-url",
        redis_server.url,
    )
    line = next(ln for ln in listing.splitlines() if ln.startswith(namespace + ":"))
    assert "older redis_stats (schema 1" in line, listing
