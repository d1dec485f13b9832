"""Attack (issue 39 item 2): request parameters and stored names the views must take or refuse
cleanly. A parameter is a ``400`` naming it, never a ``500``; a name a listing offers is one the
views accept; what the config refuses (an id with a newline) it refuses whole."""

from __future__ import annotations

import json

import fakeredis
import pytest

from redis_stats import ConfigError, StatsConfig, StatsReader, StatsWriter
from redis_stats.codec import ENDPOINT_FIELD
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.keys import Keys
from redis_stats.server import Exporter
from redis_stats.server.http import Request, answer


class Store:
    """A fakeredis store with one pod (endpoint ``10.0.0.1:8000``, engines 0 and 1) and an
    exporter of it."""

    def __init__(self) -> None:
        self.server = fakeredis.FakeServer()
        self.config = StatsConfig(namespace="params", flush_interval=0.05)
        self.writer = StatsWriter(
            self.config.replace(endpoint="10.0.0.1:8000"),
            vllm_catalog(),
            engines=[0, 1],
            client=self.client(),
            start=False,
            load=VLLM_LOAD,
        )
        for e in (0, 1):
            self.writer.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(2)
            self.writer.metric("vllm:num_requests_running").labels(e, model_name="m").set(1)
        assert self.writer.flush()
        self.writer._closed = True  # stays live
        reader = StatsReader(self.config, vllm_catalog(), client=self.client())
        self.exporter = Exporter(reader, port=0, roles=VLLM_ROLES)

    def client(self) -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=self.server, decode_responses=True)

    def get(self, path: str, query: str = "") -> tuple[int, bytes]:
        response = answer(self.exporter.app, Request("GET", path, query))
        return response.status, response.body

    def close(self) -> None:
        self.exporter.close()


@pytest.fixture
def store():
    made = Store()
    yield made
    made.close()


def test_an_engine_of_thousands_of_digits_is_a_400_not_a_500(store, caplog):
    status, body = store.get("/metrics", "engine=" + "1" * 4400)
    assert status == 400, body
    assert "Traceback" not in caplog.text


def test_an_endpoint_or_namespace_with_a_trailing_newline_is_refused_where_it_enters(store):
    for bad in ({"endpoint": "10.0.0.1:8000\n"}, {"namespace": "model\n"}):
        with pytest.raises(ConfigError):
            StatsConfig(**bad)
    assert store.get("/metrics", "endpoint=10.0.0.1:8000%0A")[0] == 400
    assert store.get("/load", "namespace=params%0A")[0] == 400


def test_every_endpoint_listed_is_one_the_endpoint_views_accept(store):
    # A stored endpoint no config accepts (written by hand: a space) is no endpoint: its engines
    # are unassigned, never listed under an id every view would refuse.
    client = store.client()
    client.hset(Keys("params").writer_stats(store.writer.writer_id), ENDPOINT_FIELD, "pod a:8000")
    status, body = store.get("/endpoints")
    assert status == 200
    doc = json.loads(body)
    assert "pod a:8000" not in doc["endpoints"] and doc["unassigned"], body
    for endpoint in doc["endpoints"]:
        query = "endpoint=" + endpoint.replace(" ", "%20")
        assert store.get("/metrics", query)[0] == 200, endpoint
        assert store.get("/get_load", query)[0] == 200, endpoint
