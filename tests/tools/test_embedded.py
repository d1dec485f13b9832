"""The private servers the demo and the tests start: ports that a restart in place can take again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redis_stats.tools.embedded import free_port
from tests.conftest import PYTHON, ROOT

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="Linux only: the kernel's ephemeral port range")
def test_free_ports_are_below_the_ephemeral_range():
    """A port in the kernel's ephemeral range can become the local end of any process's outgoing
    connection while a server is stopped, and the restart in place then fails with "Address
    already in use" (CI failed so on a Cluster node's bus port). Free ports come from below it."""
    low = int(RANGE.read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(1024 < p < low and p != 6379 for p in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random, not one port handed to every caller


# A process that starts servers as the suite does (a Redis, a Valkey, master + replica + three
# sentinels), prints their pids and waits to be killed.
PARENT = """
import json, sys, time
from redis_stats.tools.embedded import EmbeddedRedis, binary_of_kind
from tests.servers import SentinelSetup
servers = [EmbeddedRedis(binary_of_kind(k)).start() for k in ("redis", "valkey") if binary_of_kind(k)]
sentinels = SentinelSetup().start()
pids = [s.pid for s in servers] + [sentinels.master.pid, sentinels.replica.pid]
pids += [p.pid for p in sentinels.sentinels]
print(json.dumps(pids), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has ended: its state is Z)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent-death signal is Linux's")
def test_no_server_outlives_the_process_that_started_it_killed_with_sigkill(python_env):
    """A suite killed mid-run (a CI time-out: SIGKILL, no finally, no atexit) left servers running
    for over an hour: each server the package or the suite starts now ends with its parent."""
    parent = subprocess.Popen(
        [PYTHON, "-c", PARENT], cwd=ROOT, env=python_env, stdout=subprocess.PIPE, text=True
    )
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        pids = json.loads(line)
        assert len(pids) >= 6 and all(_alive(p) for p in pids), line
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30  # at once in practice; a margin no machine misses
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for pid in left:  # never leave one behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"servers left running after their parent was killed: {left}"


def test_die_with_parent_kills_at_once_a_child_whose_parent_is_already_gone(python_env):
    """The request covers only a parent alive when it is made: one that ended before is found."""
    code = "from redis_stats.tools.embedded import die_with_parent; die_with_parent(1); print('alive')"
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=python_env, capture_output=True, text=True)
    assert out.returncode == -signal.SIGKILL and "alive" not in out.stdout
