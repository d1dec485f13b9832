"""bench/usage_faults.py at a reduced size, as a test: 4 writer processes through a proxy that
holds 3 % of Redis' replies past the clients' timeout, 3 writers killed with SIGKILL, Redis killed
and restarted from its AOF: the ledger equals, per tenant, what the writers acknowledged plus the
killed writers' batches the ledger's sequence shows applied — no phantom, nothing lost — and the
prefill/decode pair is counted once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.redis_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_ledger_is_exact_under_late_replies_kills_and_restarts(tmp_path):
    out = tmp_path / "faults.json"
    args = ["--writers", "4", "--requests", "16000", "--tenants", "2000", "--seconds", "8"]
    args += ["--kills", "3", "--restarts", "1", "--late", "0.03", "--out", str(out)]
    subprocess.run(
        [sys.executable, "bench/usage_faults.py", *args],
        cwd=ROOT,
        check=True,
        timeout=300,
        capture_output=True,
    )
    got = json.loads(out.read_text())
    assert got["writer_kills"] == 3 and got["replies_held_past_timeout"] > 0
    assert got["exact_tenants_off"] == got["exact_phantom_tenants"] == got["exact_lost_tenants"] == 0, got
    assert got["acknowledged_not_in_ledger"] == 0
    applied = got["requests_acknowledged"]  # + the killed writers' applied batches, resolved
    assert applied <= got["requests_in_ledger"] <= got["requests_issued"]
    assert got["pd_exact"] and got["pd_naive_requests"] == 2 * got["pd_requests"]
