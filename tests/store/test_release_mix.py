"""A rolling upgrade between this release and the last one (f5ee21c, issue 39 item 4): writers of
both share one namespace (schema 2 both) while readers of both read it. Each reader shows every
engine with the totals of both versions' writers, and a stored line with a part more than a
reader knows (what the next release adding one would write) is read, never dropped."""

from __future__ import annotations

import json

import pytest
import redis

from redis_stats import StatsConfig, StatsReader
from tests.conftest import ROOT, sample_catalog
from tests.store.test_attack_versions import READ, WRITE, _checkout, _run, _totals

pytestmark = pytest.mark.redis_server

LAST_RELEASE = "f5ee21c"


def test_writers_of_the_last_release_and_this_one_add_up_for_readers_of_both(
    redis_server, namespace, tmp_path
):
    old = _checkout(LAST_RELEASE, tmp_path / "old")
    for root in (old, ROOT, old, ROOT):  # a StatefulSet being rolled: both versions write
        _run(WRITE, root, redis_server.url, namespace)
    for reader in (ROOT, old):
        got = json.loads(_run(READ, reader, redis_server.url, namespace).strip().splitlines()[-1])
        expected = _totals(4)
        assert got.keys() == expected.keys(), (str(reader), got)
        for e, values in expected.items():
            assert got[e] == pytest.approx(values), (str(reader), e, got[e])


def test_a_line_with_a_part_more_than_this_reader_knows_is_read_not_dropped(redis_server, namespace):
    _run(WRITE, ROOT, redis_server.url, namespace)
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    reader = StatsReader(config, sample_catalog(), client=client)
    before = reader.snapshot()
    for engine in (0, 1):
        key = reader.keys.counters(engine)
        for field in client.hkeys(key):
            if not field.startswith("@|") or field.endswith("|n"):
                continue
            kinds = [line.split("|")[0] for line in client.hget(key, field + "|n").split("\n")]
            lines = client.hget(key, field).split("\n")
            grown = [
                line + "|9" if kind == "inflight" else line + " 9" if kind == "latency_seconds" else line
                for kind, line in zip(kinds, lines)
            ]
            client.hset(key, field, "\n".join(grown))
    after = StatsReader(config, sample_catalog(), client=client).snapshot()
    assert "bad_value" not in after.skipped, after.skipped
    for engine in (0, 1):
        was, now = before.engines[engine], after.engines[engine]
        assert now.gauge("inflight") == was.gauge("inflight") == 2
        assert now.histogram("latency_seconds") == was.histogram("latency_seconds")
