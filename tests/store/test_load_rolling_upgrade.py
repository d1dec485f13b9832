"""The load feed in a rolling upgrade (issue 40): writers and readers of the last release (f5ee21c,
``git archive``) and of this one share a namespace on a real Redis, both directions.

This release appends fields to a writer's load entry (``redis_stats/load.py``, ``FIELDS``). Before,
a reader refused an entry one field short as ``bad_entry``: a reader upgraded before the writers
blanked ``/load`` (and ``/get_load``, the endpoint views) for every engine of an older writer for
the whole upgrade. Now each reads the fields it knows: an older writer's entries give their six
fields (the fields appended since: null), a newer writer's give the older reader its six."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.store.test_attack_versions import _checkout, _run

pytestmark = pytest.mark.redis_server

LAST_RELEASE = "f5ee21c"
OLD_FIELDS = (
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "kv_cache_capacity_tokens",
    "prompt_tokens_per_second",
    "generation_tokens_per_second",
)

# argv: url, namespace, engine, role, base: sets running = base, waiting = base + 1, KV usage
# base / 100, 256 blocks of 16 tokens; counts prompt tokens and prefix-cache queries and hits
WRITE = """
import sys
from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
url, ns, engine, role, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
w = StatsWriter(StatsConfig(url=url, namespace=ns), vllm_catalog(8192, ("block_size", "num_gpu_blocks")),
                engines=[engine], start=False, role=role, load=VLLM_LOAD)
w.metric("vllm:num_requests_running").labels(engine, model_name="m").set(base)
w.metric("vllm:num_requests_waiting").labels(engine, model_name="m").set(base + 1)
w.metric("vllm:kv_cache_usage_perc").labels(engine, model_name="m").set(base / 100)
w.metric("vllm:cache_config_info").labels(engine, block_size="16", num_gpu_blocks="256").set(1)
w.metric("vllm:prompt_tokens").labels(engine, model_name="m").inc(1000)
w.metric("vllm:prefix_cache_queries").labels(engine, model_name="m").inc(400)
w.metric("vllm:prefix_cache_hits").labels(engine, model_name="m").inc(100)
assert w.flush()
w._closed = True  # exit without closing: the writer stays live (its entries count) until stale_after
"""

READ = """
import json, sys
from redis_stats import StatsConfig, StatsReader
doc = StatsReader(StatsConfig(url=sys.argv[1], namespace=sys.argv[2])).load().to_dict()
print(json.dumps(doc))
"""


def _read(root: Path, url: str, namespace: str) -> dict:
    return json.loads(_run(READ, root, url, namespace).strip().splitlines()[-1])


def _check_old_fields(engine: dict, base: int) -> None:
    assert engine["state"] in ("up", "stale")  # live (stale: 2 s past its one flush, a slow machine)
    assert engine["requests_running"] == base and engine["requests_waiting"] == base + 1
    assert engine["kv_cache_usage"] == round(base / 100, 4)
    assert engine["kv_cache_capacity_tokens"] == 4096
    assert engine["prompt_tokens_per_second"] > 0


def test_each_release_reads_the_others_load_entries(redis_server, namespace, tmp_path):
    old = _checkout(LAST_RELEASE, tmp_path / "old")
    url = redis_server.url
    _run(WRITE, old, url, namespace, "0", "api0", "10")  # engine 0: the last release's writer only
    _run(WRITE, ROOT, url, namespace, "1", "api0", "20")  # engine 1: this release's only
    # engine 2: one API server of each release (an upgrade half done); this one's wrote last
    _run(WRITE, old, url, namespace, "2", "api0", "30")
    _run(WRITE, ROOT, url, namespace, "2", "api1", "40")

    new_view = _read(ROOT, url, namespace)
    assert new_view["skipped"] == {}  # before: {"bad_entry": 2}, engines 0 and 2 without numbers
    engines = new_view["engines"]
    _check_old_fields(engines["0"], 10)
    assert engines["0"]["prefix_cache_queries_per_second"] is None  # the old writer has no such field
    assert engines["0"]["max_running_requests"] is None
    for e, base in (("1", 20), ("2", 40)):  # engine 2: mostrecent, the newer writer's values
        _check_old_fields(engines[e], base)
        assert engines[e]["prefix_cache_hits_per_second"] > 0
        assert engines[e]["prefix_cache_queries_per_second"] == pytest.approx(
            4 * engines[e]["prefix_cache_hits_per_second"], rel=1e-3
        )
    assert engines["2"]["prompt_tokens_per_second"] > engines["1"]["prompt_tokens_per_second"]  # 2 writers

    old_view = _read(old, url, namespace)  # the last release's reader: this release's longer entries
    assert old_view["skipped"] == {}
    for e, base in (("0", 10), ("1", 20), ("2", 40)):
        _check_old_fields(old_view["engines"][e], base)
        assert set(OLD_FIELDS) <= set(old_view["engines"][e])
    assert old_view["fleet"]["requests_running"]["sum"] == 70
