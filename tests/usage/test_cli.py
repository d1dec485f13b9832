"""``redis-stats usage``: the ledger as a table, JSON and CSV; a window; one tenant alone; a bad
window said as a usage error (exit 2), never a traceback."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from redis_stats import StatsConfig, StatsWriter
from redis_stats.tools.cli import main
from redis_stats.usage import Usage, UsageRecorder

pytestmark = pytest.mark.redis_server


@pytest.fixture
def ledger(redis_server, namespace):
    writer = StatsWriter(StatsConfig(url=redis_server.url, namespace=namespace), start=False)
    rec = UsageRecorder(writer)
    for i in range(6):
        rec.record(
            Usage(
                tenant=f"team-{i % 3}",
                adapter="sql-lora" if i % 2 else None,
                model="llama",
                prompt_tokens=100 * i,
                generation_tokens=10 * i,
            )
        )
    rec.record(
        Usage(tenant="[bold]x[/]\x1b[31m", adapter=None, model="llama", prompt_tokens=1, generation_tokens=1)
    )
    assert writer.flush()
    yield ["--redis-url", redis_server.url, "--namespace", namespace]
    writer.close()


def _run(args: list[str]) -> str:
    result = CliRunner().invoke(main, ["usage", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_json_csv_and_table_agree(ledger):
    doc = json.loads(_run([*ledger, "--by", "tenant,adapter", "--format", "json"]))
    assert doc["count"] == 7 and doc["total"]["prompt_tokens"] == 1501
    rows = list(csv.DictReader(io.StringIO(_run([*ledger, "--by", "tenant,adapter", "--format", "csv"]))))
    assert [(r["tenant"], r["adapter"], int(r["prompt_tokens"])) for r in rows] == [
        (r["tenant"], r["adapter"], r["prompt_tokens"]) for r in doc["rows"]
    ]
    table = _run([*ledger, "--since", "24h", "--sort", "generation_tokens", "--limit", "2"])
    assert table.index("team-2") < table.index("team-1") and "team-0" not in table
    assert "[bold]x[/]\\u001b[31m" in _run(ledger)  # shown as text: no markup, no escape code


def test_one_tenant_alone_and_a_bad_window(ledger):
    doc = json.loads(_run([*ledger, "--tenant", "team-1", "--format", "json"]))
    assert (
        doc["total"]["requests"] == 2 and doc["total"]["prompt_tokens"] == 500 and doc["hour"] == doc["total"]
    )
    result = CliRunner().invoke(main, ["usage", *ledger, "--since", "last tuesday"])
    assert result.exit_code == 2 and "not understood" in result.output
