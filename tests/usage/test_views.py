"""``GET /usage`` and the top tenants in ``/metrics``: served only with ``usage=True``, only
with credentials (or the operator's explicit ``insecure_private_views``), exact (the top and
``(other)`` add up to the ledger's total), every hostile name safe in JSON, CSV and Prometheus
text, every bad query a 400 that says why."""

from __future__ import annotations

import csv
import io
import json
import time
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsReader, StatsWriter
from redis_stats.errors import WebConfigError
from redis_stats.server import Exporter
from redis_stats.usage import Usage, UsageRecorder
from tests.certs import http_get
from tests.conftest import sample_catalog

TOKEN = "planted-usage-token-41d2"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOW = time.time()
EVIL = ['x"y\\z\nw</script><b>', "=HYPERLINK(1)", "é😀\u2028", "(other)"]


@pytest.fixture
def ledger(config, fake_client):
    """A ledger of 30 tenants (t00 .. t29, t29 the largest) and the hostile names."""
    writer = StatsWriter(config, client=fake_client(), start=False)
    rec = UsageRecorder(writer)
    for i in range(30):
        for _ in range(i + 1):
            rec.record(
                Usage(tenant=f"t{i:02d}", adapter=None, model="m", prompt_tokens=i, generation_tokens=2)
            )
    for name in EVIL:
        rec.record(Usage(tenant=name, adapter=name, model="m", prompt_tokens=1, generation_tokens=1))
    rec.record(
        Usage(tenant=None, adapter=None, model="m", prompt_tokens=3, generation_tokens=0, outcome="abort")
    )
    assert writer.flush()
    yield writer
    writer.close()


@pytest.fixture
def serve(config, fake_client, ledger, tmp_path):
    started: list[Exporter] = []
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")

    def run(**options) -> Exporter:
        options.setdefault("web_token_file", str(tokens))
        reader = StatsReader(config, sample_catalog(), client=fake_client())
        exporter = Exporter(reader, port=0, request_timeout=5, **options).start()
        started.append(exporter)
        return exporter

    yield run
    for exporter in started:
        exporter.close()


def _get(exporter: Exporter, path: str, headers: dict[str, str] | None = None):
    status, _, body, _ = http_get(exporter.port, path, AUTH if headers is None else headers)
    return status, body


def test_usage_is_refused_without_access_control_and_served_only_with_credentials(serve, config, fake_client):
    reader = StatsReader(config, sample_catalog(), client=fake_client())
    with pytest.raises(WebConfigError, match="business data"):
        Exporter(reader, port=0, usage=True)
    with pytest.raises(WebConfigError, match="cannot be opened"):
        serve(usage=True, web_open=["/usage"])
    off = serve()
    assert _get(off, "/usage")[0] == 404  # not turned on
    on = serve(usage=True)
    assert _get(on, "/usage", {})[0] == 401
    assert _get(on, "/metrics", {})[0] == 401  # it carries the top tenants now
    assert _get(on, "/usage")[0] == 200
    insecure = serve(usage=True, web_token_file=None, insecure_private_views=True)
    assert _get(insecure, "/usage", {})[0] == 200


def test_the_top_tenants_and_other_add_up_to_the_exact_total(serve):
    exporter = serve(usage=True, usage_top=5)
    status, body = _get(exporter, "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    gen = families["redis_stats_usage_generation_tokens"].samples
    assert [s.labels["tenant"] for s in gen][:5] == ["t29", "t28", "t27", "t26", "t25"]
    assert len(gen) == 6 and gen[-1].labels["tenant"] == "(other)"
    expected = sum(2 * (i + 1) for i in range(30)) + len(EVIL)
    assert sum(s.value for s in gen) == expected
    prompt = families["redis_stats_usage_prompt_tokens"].samples
    assert sum(s.value for s in prompt) == sum(i * (i + 1) for i in range(30)) + len(EVIL) + 3
    assert families["redis_stats_usage_tenants"].samples[0].value == 30 + len(EVIL) + 1
    doc = json.loads(_get(exporter, "/usage?sort=generation_tokens&limit=3")[1])
    assert [r["tenant"] for r in doc["rows"]] == ["t29", "t28", "t27"]
    assert doc["count"] == 30 + len(EVIL) + 1 and doc["total"]["generation_tokens"] == expected


def test_a_tenants_budget_answer_and_windows(serve):
    exporter = serve(usage=True)
    doc = json.loads(_get(exporter, "/usage?tenant=t03")[1])
    assert doc["tenant"] == "t03" and doc["total"]["requests"] == 4 and doc["day"] == doc["total"]
    assert doc["hour"]["prompt_tokens"] == 12
    doc = json.loads(_get(exporter, "/usage?by=tenant,model&since=2h&tenant=t03")[1])
    assert doc["rows"] == [{"tenant": "t03", "model": "m"} | doc["total"]] and doc["total"]["requests"] == 4
    assert doc["buckets"] and all(b.startswith("h:") for b in doc["buckets"])
    whole = json.loads(_get(exporter, "/usage?limit=10000")[1])
    page = json.loads(_get(exporter, "/usage?offset=10&limit=5")[1])
    assert [r["tenant"] for r in page["rows"]] == ["t07", "t08", "t09", "t10", "t11"]  # by name
    assert page["rows"] == whole["rows"][10:15] and page["count"] == whole["count"] == len(whole["rows"])


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("by=tenant,color", "by='color'"),
        ("sort=colour", "sort='colour'"),
        ("since=yesterday-ish", "not understood"),
        ("since=2h&until=4h", "not after"),
        ("since=2020-01-01T00:30:00&until=2020-01-02", "day buckets are kept"),
        ("since=2020-01-01", "more than 1000 buckets"),
        ("since=30d", "hour buckets are kept"),
        ("limit=-1", "limit="),
        ("limit=99999", "limit="),
        ("by=tenant&by=model", "given 2 times"),
    ],
)
def test_a_bad_query_is_a_400_that_says_why(serve, query, says):
    status, body = _get(serve(usage=True), f"/usage?{query}")
    assert status == 400 and says in json.loads(body)["error"], body


def test_hostile_names_are_safe_in_json_csv_and_prometheus_text(serve):
    exporter = serve(usage=True, usage_top=100)
    rows = json.loads(_get(exporter, "/usage?by=tenant,adapter")[1])["rows"]
    names = {r["tenant"] for r in rows}
    assert {'x"y\\z\nw</script><b>', "=HYPERLINK(1)", "é😀\u2028", "((other)", "(none)"} <= names
    _status, body = _get(exporter, "/usage?by=tenant,adapter&format=csv")
    parsed = list(csv.reader(io.StringIO(body.decode())))
    assert parsed[0][:3] == ["tenant", "adapter", "requests"] and len(parsed) == len(rows) + 1
    assert ["'=HYPERLINK(1)", "'=HYPERLINK(1)"] in [r[:2] for r in parsed]  # no formula
    text = _get(exporter, "/metrics")[1].decode()
    tenants = [
        s.labels["tenant"]
        for f in text_string_to_metric_families(text)
        if f.name == "redis_stats_usage_requests"
        for s in f.samples
    ]
    assert 'x"y\\z\nw</script><b>' in tenants and tenants.count("(other)") == 1
    one = json.loads(_get(exporter, "/usage?tenant=" + quote('x"y\\z\nw</script><b>'))[1])
    assert one["total"]["requests"] == 1


def test_with_redis_down_metrics_still_answers_and_usage_says_503(tmp_path):
    from redis_stats import StatsConfig

    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    config = StatsConfig(url="redis://127.0.0.1:1/0", namespace="down", socket_timeout_ms=300)
    exporter = Exporter(
        StatsReader(config, sample_catalog()), port=0, usage=True, web_token_file=str(tokens)
    ).start()
    try:
        status, body = _get(exporter, "/metrics")
        assert status == 200 and b"redis_stats_up 0" in body and b"redis_stats_usage" not in body
        status, body = _get(exporter, "/usage?tenant=acme")
        assert status == 503 and "cannot be read" in json.loads(body)["error"]
        assert _get(exporter, "/usage")[0] == 503
    finally:
        exporter.close()
