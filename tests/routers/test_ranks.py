"""Ranks are the pod's ranks (issue 46, item 2): an engine's ``dp_rank`` in ``/v1/loads`` and
``/loads`` is its place in its endpoint, never its place in a list of what answered, while ranks
start, fall silent, report NaN or an impossible count, and die; every rank without load is named.

Every body is decoded as SGLang's gateway decodes it (``tests/smg_decode.py``: the struct's field
names and types), from the vLLM middleware (a pod's own port) and from the exporter, one writer
per engine through the public API."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.get_load import GetLoadMiddleware
from redis_stats.server import Exporter
from tests import smg_decode
from tests.asgi import asgi_get
from tests.routers.test_v1_loads import LOAD_MAP, QUERY, inner_app

pytestmark = pytest.mark.redis_server

ENDPOINT = "10.0.7.1:8000"


def writer_of(cfg: StatsConfig, engine: int) -> StatsWriter:
    return StatsWriter(
        cfg, vllm_catalog(), engines=[engine], start=False, role=f"rank{engine}", load=LOAD_MAP
    )


def record(writer: StatsWriter, engine: int, running: float, waiting: float) -> None:
    writer.metric("vllm:num_requests_running").labels(engine, model_name="m").set(running)
    writer.metric("vllm:num_requests_waiting").labels(engine, model_name="m").set(waiting)
    writer.metric("vllm:kv_cache_usage_perc").labels(engine, model_name="m").set(0.25)
    assert writer.flush()


def middleware(cfg: StatsConfig) -> dict[str, Any]:
    status, _, body = asgi_get(GetLoadMiddleware(inner_app, config=cfg, ttl=0), "/v1/loads", QUERY)
    verdict, response = smg_decode.probe(status, body)
    assert verdict == "available", (status, body)
    assert response is not None
    return {**json.loads(body), "decoded": response}


def exporter_doc(url: str, path: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url + path, timeout=10) as r:
            body = r.read()
            status = r.status
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    verdict, response = smg_decode.probe(status, body)
    assert verdict == "available", (status, body)
    return {**json.loads(body), "decoded": response}


def ranks(doc: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """rank -> (running, waiting), as the gateway decoded them."""
    return {s["dp_rank"]: (s["num_running_reqs"], s["num_waiting_reqs"]) for s in doc["decoded"]["loads"]}


def test_ranks_keep_their_place_while_engines_start_fall_silent_report_nan_and_die(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, endpoint=ENDPOINT, stale_after=30.0)
    writers = {e: writer_of(cfg, e) for e in (0, 2, 3)}  # engine 1 not started yet
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05).start()

    def both() -> list[dict[str, Any]]:
        time.sleep(0.3)  # the exporter's feed refreshes every 50 ms
        fleet = exporter_doc(exporter.url, "/loads")
        assert {s["worker"] for s in fleet["loads"]} == {ENDPOINT}
        return [middleware(cfg), exporter_doc(exporter.url, f"/v1/loads?endpoint={ENDPOINT}"), fleet]

    try:
        for e, w in writers.items():
            record(w, e, running=10 + e, waiting=e)
        for doc in both():  # engines {0, 2, 3}: ranks 0, 2, 3 (never 0, 1, 2); rank 1 named
            assert ranks(doc) == {0: (10, 0), 2: (12, 2), 3: (13, 3)}
        middle, by_endpoint, fleet = both()
        assert middle["ranks_without_load"] == by_endpoint["ranks_without_load"] == [1]
        assert fleet["ranks_not_reported"] == {ENDPOINT: [1]}
        assert middle["withheld"] == {"1": {"engine": "not_stored"}}

        writers[1] = writer_of(cfg, 1)  # rank 1 starts, and reports only NaN
        record(writers[1], 1, running=math.nan, waiting=math.nan)
        for doc in both():
            assert ranks(doc) == {0: (10, 0), 2: (12, 2), 3: (13, 3)}
        unreported = {"requests_running": "not_reported", "requests_waiting": "not_reported"}
        assert middleware(cfg)["withheld"] == {"1": unreported}

        record(writers[1], 1, running=11, waiting=1)  # it records: every rank
        record(writers[3], 3, running=13, waiting=-5)  # rank 3: a count no engine can have
        for doc in both():
            assert ranks(doc) == {0: (10, 0), 1: (11, 1), 2: (12, 2)}
        middle = middleware(cfg)
        assert middle["ranks_without_load"] == [3]
        assert middle["withheld"] == {"3": {"requests_waiting": "negative"}}
        record(writers[3], 3, running=2.5, waiting=0)  # a fractional count: withheld too
        assert middleware(cfg)["withheld"]["3"] == {"requests_running": "not_whole"}

        writers.pop(0).close()  # rank 0 dies: down, the others keep their numbers
        record(writers[2], 2, running=12, waiting=2)
        for doc in both():
            assert ranks(doc) == {1: (11, 1), 2: (12, 2)}
        middle, by_endpoint, fleet = both()
        assert middle["ranks_down"] == by_endpoint["ranks_down"] == [0]
        assert middle["ranks_without_load"] == [3]
        assert fleet["ranks_not_reported"] == {ENDPOINT: [0, 3]}
    finally:
        exporter.close()
        for w in writers.values():
            w.close()
