"""Attack (issue 39): arbitrary label values and amounts through the endpoint and engine views
(``/metrics?endpoint=``, ``?engine=``, their OpenMetrics form, ``/get_load``, ``/endpoints``),
which the every-view suite (tests/store/test_every_view.py) does not reach.

Two engines of one endpoint carry the hostile values in every Model Server Protocol family (the
label values of ``vllm:lora_requests_info`` and ``vllm:cache_config_info`` too); a control
endpoint beside it carries plain ones. Each view must parse, must never black out (``redis_stats_up
1``), must serve the control endpoint exactly, must never serve a protocol total that is not a
number (the rule ``/get_load`` follows), and an engine's view must be the whole ``/metrics`` of
that engine without its ``engine`` label.
"""

from __future__ import annotations

import json
import math
import sys

import fakeredis
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats import CatalogError, StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter
from redis_stats.server.http import Request, answer

MAX = sys.float_info.max
HOSTILE, CONTROL = "10.0.0.1:8000", "10.0.0.2:8000"
PROTOCOL = {r.family for r in VLLM_ROLES}
OPENMETRICS = "application/openmetrics-text; version=1.0.0"

LABELS = st.one_of(
    st.sampled_from(["100%", "%s", "{}", '"', "\\", "\n", "a\nb", "", ",", "²", "١٢", "1_0", "+Inf", "NaN"]),
    st.text(max_size=14),
)
AMOUNTS = st.one_of(
    st.sampled_from([0, 1.7e308, -1.7e308, MAX, math.inf, -math.inf, math.nan, 2**53 + 1, 2**64 + 1, 5e-324]),
    st.floats(),
    st.integers(-(2**70), 2**70),
)


def catalog():
    return vllm_catalog(cache_config_labels=("block_size", "num_gpu_blocks"))


def record(writer: StatsWriter, engine: int, model: str, lora: str, blocks: str, amounts) -> None:
    waiting, running, kv = amounts
    try:
        writer.metric("vllm:num_requests_waiting").labels(engine, model_name=model).set(waiting)
        writer.metric("vllm:num_requests_running").labels(engine, model_name=model).set(running)
        writer.metric("vllm:kv_cache_usage_perc").labels(engine, model_name=model).set(kv)
        writer.metric("vllm:cache_config_info").labels(engine, block_size="16", num_gpu_blocks=blocks).set(1)
        writer.metric("vllm:lora_requests_info").labels(
            engine, max_lora=lora, waiting_lora_adapters=lora, running_lora_adapters="a"
        ).set(1_700_000_000 + engine)
        writer.metric("vllm:prompt_tokens").labels(engine, model_name=model).inc(7)
    except CatalogError:  # a label value that is not text: refused where it enters
        pass


class Fleet:
    """A fakeredis store: the hostile endpoint (engines 0, 1) and the control one (engine 2)."""

    def __init__(self, model, lora, blocks, amounts) -> None:
        self.server = fakeredis.FakeServer()
        self.config = StatsConfig(namespace="attack", flush_interval=0.05)
        hostile = self._writer(HOSTILE, [0, 1])
        for engine, a in zip((0, 1), amounts):
            record(hostile, engine, model, lora, blocks, a)
        control = self._writer(CONTROL, [2])
        record(control, 2, "m", "2", "100", (2, 3, 0.5))
        for w in (hostile, control):
            assert w.flush()
            w._closed = True  # stay live
        reader = StatsReader(self.config, catalog(), client=self._client())
        self.exporter = Exporter(reader, port=0, roles=VLLM_ROLES)

    def _client(self):
        return fakeredis.FakeRedis(server=self.server, decode_responses=True, encoding_errors="replace")

    def _writer(self, endpoint: str, engines: list[int]) -> StatsWriter:
        config = self.config.replace(endpoint=endpoint)
        return StatsWriter(
            config, catalog(), engines=engines, client=self._client(), start=False, load=VLLM_LOAD
        )

    def get(self, path: str, query: str = "", accept: str = "") -> tuple[int, str]:
        headers = {"Accept": accept} if accept else {}
        response = answer(self.exporter.app, Request("GET", path, query, headers))
        return response.status, response.body.decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in parse_text(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"a series twice: {key}"
            out[key] = s.value
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# -- the defects found, one test each ---------------------------------------------------------------


def test_a_unicode_digit_in_one_engines_max_lora_never_blacks_out_its_endpoint_view():
    fleet = Fleet("m", "²", "9", ((2, 3, 0.5), (2, 3, 0.5)))
    try:
        for query in ("endpoint=" + HOSTILE, "engine=0"):
            status, text = fleet.get("/metrics", query)
            assert status == 200
            view = samples(text)
            assert view[("redis_stats_up", ())] == 1.0, f"?{query} blacked out by one label value"
            if query.startswith("endpoint"):
                assert view[("vllm:num_requests_waiting", (("model_name", "m"),))] == 4.0
    finally:
        fleet.exporter.close()


def test_a_protocol_total_that_is_not_a_number_is_withheld_as_get_load_refuses_it():
    fleet = Fleet("m", "2", "9", ((math.inf, 3, 0.5), (-math.inf, 3, 0.5)))
    try:
        status, body = fleet.get("/get_load", "endpoint=" + HOSTILE)
        assert status == 503 and json.loads(body)["error"] == "no_load"
        view = samples(fleet.get("/metrics", "endpoint=" + HOSTILE)[1])
        waiting = [v for (name, _), v in view.items() if name == "vllm:num_requests_waiting"]
        assert not any(math.isnan(v) for v in waiting), "a NaN served as the endpoint's queue"
        withheld = {dict(k[1]).get("family") for k in view if k[0] == "redis_stats_endpoint_withheld"}
        assert "vllm:num_requests_waiting" in withheld
    finally:
        fleet.exporter.close()


@pytest.mark.parametrize("separator", ["\u2028", "\x85", "\r", "\x1c"])
def test_a_line_separator_in_a_protocol_label_value_leaves_the_views_parseable(separator):
    fleet = Fleet("a" + separator + "b", "2", "9", ((2, 3, 0.5), (2, 3, 0.5)))
    try:
        status, whole = fleet.get("/metrics")
        assert status == 200 and samples(whole)  # the whole /metrics parses
        for query in ("endpoint=" + HOSTILE, "engine=0"):
            status, text = fleet.get("/metrics", query)
            assert status == 200
            view = samples(text)  # raises when a line was cut in two
            assert view[("redis_stats_up", ())] == 1.0
    finally:
        fleet.exporter.close()


# -- every value, every endpoint and engine view ------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=LABELS,
    lora=LABELS,
    blocks=LABELS,
    amounts=st.tuples(st.tuples(AMOUNTS, AMOUNTS, AMOUNTS), st.tuples(AMOUNTS, AMOUNTS, AMOUNTS)),
)
@example(model="100%", lora="2", blocks="9", amounts=((1.7e308, 1, 0.1), (1.7e308, 1, 0.2)))
@example(model="a\u2028b", lora="²", blocks="9", amounts=((math.inf, 1, 0.1), (-math.inf, 1, 0.2)))
def test_arbitrary_values_through_the_endpoint_and_engine_views(model, lora, blocks, amounts):
    fleet = Fleet(model, lora, blocks, amounts)
    try:
        status, whole = fleet.get("/metrics")
        assert status == 200
        everything = samples(whole)
        for endpoint in (HOSTILE, CONTROL):
            status, text = fleet.get("/metrics", "endpoint=" + endpoint)
            assert status == 200, text
            view = samples(text)
            assert view[("redis_stats_up", ())] == 1.0, "the view blacked out"
            status, om = fleet.get("/metrics", "endpoint=" + endpoint, OPENMETRICS)
            assert status == 200 and list(parse_om(om))
            for family in PROTOCOL:
                served = [v for (name, _), v in view.items() if name == family]
                assert len(served) <= 1, (family, served)
                assert not any(math.isnan(v) for v in served), f"{family} served as NaN"
        control = samples(fleet.get("/metrics", "endpoint=" + CONTROL)[1])
        assert control[("vllm:num_requests_waiting", (("model_name", "m"),))] == 2.0
        assert control[("vllm:num_requests_running", (("model_name", "m"),))] == 3.0
        # an engine's view: the whole /metrics of that engine, without its engine label
        for engine in ("0", "2"):
            status, text = fleet.get("/metrics", "engine=" + engine)
            assert status == 200
            view = {
                k: v
                for k, v in samples(text).items()
                if not k[0].startswith("redis_stats") and k[0] not in PROTOCOL
            }
            want = {
                (name, tuple(p for p in labels if p[0] != "engine")): v
                for (name, labels), v in everything.items()
                if ("engine", engine) in labels
                and not name.startswith("redis_stats")
                and name not in PROTOCOL
            }
            assert view.keys() == want.keys()
            assert all(same(view[k], want[k]) for k in want)
        status, body = fleet.get("/get_load", "endpoint=" + HOSTILE)
        assert status in (200, 503)
        doc = json.loads(body)
        if status == 200:
            assert isinstance(doc["load"], int)
        status, body = fleet.get("/endpoints")
        assert status == 200 and sorted(json.loads(body)["endpoints"]) == [HOSTILE, CONTROL]
    finally:
        fleet.exporter.close()
