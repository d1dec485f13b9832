"""Attack (issue 39 item 2): garbage in every key and field of a namespace, one at a time, through
every view (the endpoint and engine views, ``/get_load`` and ``/endpoints`` included, which the
reader's own bad-data tests do not reach). No view answers 500, every ``/metrics`` body parses
and is read (``redis_stats_up 1``), and a key of one pod never costs the other pod its numbers.
"""

from __future__ import annotations

import json
import random

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter
from redis_stats.server.http import Request, answer

pytestmark = pytest.mark.redis_server

GARBAGE = ["", "x", "nan", "inf", "-1", "1e999", "\n", "%s", '{"a":1}', "9" * 400, "a|b|c", "\x00", "1 2 3"]
ONE, OTHER = "10.0.0.1:8000", "10.0.0.2:8000"  # engines 0, 1 and 2, 3
VIEWS = [
    ("/metrics", ""),
    ("/metrics", "endpoint=" + ONE),
    ("/metrics", "endpoint=" + OTHER),
    ("/metrics", "engine=0"),
    ("/metrics", "slice=1/2"),
    ("/snapshot", ""),
    ("/load", ""),
    ("/get_load", "endpoint=" + ONE),
    ("/get_load", "endpoint=" + OTHER),
    ("/endpoints", ""),
    ("/healthz", ""),
]


def pods(url: str, namespace: str) -> dict[str, list[int]]:
    """Two pods of two engines, two API servers each; their writer ids by endpoint."""
    ids: dict[str, list[int]] = {}
    for endpoint, engines in ((ONE, [0, 1]), (OTHER, [2, 3])):
        cfg = StatsConfig(url=url, namespace=namespace, endpoint=endpoint, stale_after=3600)
        for role in ("a", "b"):
            w = StatsWriter(cfg, vllm_catalog(), engines=engines, start=False, role=role, load=VLLM_LOAD)
            for e in engines:
                w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(3)
                w.metric("vllm:num_requests_running").labels(e, model_name="m").set(2)
                w.metric("vllm:prompt_tokens").labels(e, model_name="m").inc(5)
                w.metric("vllm:e2e_request_latency_seconds").labels(e, model_name="m").observe(0.3)
            assert w.flush()
            w._closed = True  # stays live
            ids.setdefault(endpoint, []).append(w.writer_id)
    return ids


def mutations(client: redis.Redis, key: str, rng: random.Random) -> list[tuple[str, object]]:
    """Ways to spoil *key*: another type, and garbage in a few of its fields or members."""
    out: list[tuple[str, object]] = [("a string", lambda: (client.delete(key), client.set(key, "x")))]
    kind = client.type(key)
    if kind == "hash":
        # (the catalogue's schema: a namespace of a schema this reader does not know is refused
        # whole, on purpose, with a message saying why)
        fields = sorted(f for f in client.hkeys(key) if not (key.endswith(":meta") and f == "schema"))
        for field in rng.sample(fields, min(4, len(fields))):
            for junk in rng.sample(GARBAGE, 3):
                out.append((f"{field[:30]!r}={junk[:10]!r}", lambda f=field, j=junk: client.hset(key, f, j)))
        out.append(("a field of nothing", lambda: client.hset(key, "@|zz|qqq", "garbage")))
    elif kind == "zset":
        out.append(("a member", lambda: client.zadd(key, {"garbage member\n": 1e300})))
        out.append(("an infinite score", lambda: client.zadd(key, {"7": float("inf")})))
    return out


def test_garbage_in_any_key_costs_that_key_only_in_every_view(redis_server, namespace):
    ids = pods(redis_server.url, namespace)
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    raw = redis.Redis.from_url(redis_server.url)
    config = StatsConfig(url=redis_server.url, namespace=namespace, stale_after=3600)
    keys = sorted(client.scan_iter(f"rs:{{{namespace}}}:*"))
    assert len(keys) == 13
    rng = random.Random(39)
    wrong: list[str] = []
    for key in keys:
        kept = raw.dump(key)
        # a key of pod ONE's alone: its engines' hashes, its writers' stats
        ones = key.endswith((":e:0:c", ":e:1:c")) or any(key.endswith(w) for w in ids[ONE])
        for name, spoil in mutations(client, key, rng):
            raw.delete(key)
            raw.restore(key, 0, kept)
            spoil()  # type: ignore[operator]
            exporter = Exporter(StatsReader(config, vllm_catalog()), port=0, roles=VLLM_ROLES)
            try:
                for path, query in VIEWS:
                    response = answer(exporter.app, Request("GET", path, query))
                    where = f"{key} {name}: {path}?{query}"
                    if response.status >= 500 and path != "/get_load":
                        wrong.append(f"{where} {response.status}")
                    elif (
                        path == "/metrics"
                        and response.status == 404
                        and key.endswith((":engines", ":writers"))
                    ):
                        pass  # the list of engines (or of writers: their endpoints) unreadable
                    elif path == "/metrics" and response.status != 200:
                        wrong.append(f"{where} {response.status} {response.body[:90]!r}")
                    elif path == "/metrics":
                        body = response.body.decode()
                        list(text_string_to_metric_families(body))
                        if "redis_stats_up 0" in body:
                            wrong.append(f"{where} redis_stats_up 0")
                        if ones and query == "endpoint=" + OTHER:
                            waiting = [
                                x for x in body.splitlines() if x.startswith("vllm:num_requests_waiting{")
                            ]
                            if waiting != ['vllm:num_requests_waiting{model_name="m"} 6.0']:
                                wrong.append(f"{where} the other pod's waiting: {waiting}")
                    elif path == "/get_load" and ones and query == "endpoint=" + OTHER:
                        if response.status != 200 or json.loads(response.body)["load"] != 10:
                            wrong.append(f"{where} the other pod's load: {response.body[:100]!r}")
            finally:
                exporter.close()
        raw.delete(key)
        raw.restore(key, 0, kept)
    assert not wrong, "\n".join(wrong[:20])
