"""The endpoint views read as their consumers read them (issue 34 item 1-2).

The endpoint picker (llm-d-router's ``metrics-data-source``) scrapes a URL, parses the Prometheus
text, keeps the families of its ``families`` list and, of each, ONE series (``getLatestMetric``,
:func:`picker_read`): the one with the newest timestamp, else the FIRST one it parsed. Against
``/metrics`` of a data-parallel pod that is one engine's number; against
``/metrics?endpoint=<id>`` it must be the endpoint's true aggregate over its live engines, while
engines die and come back. Writers of several endpoints with several engines each, through the
public API only; parsed by prometheus_client's own parser."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import Catalog, StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.bridge.roles import BRIDGE_ROLES
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.roles import VLLM_ROLES
from redis_stats.server import Exporter
from tests.server import states

pytestmark = pytest.mark.redis_server

# The families the endpoint picker reads (its Model Server Protocol defaults for vLLM).
FAMILIES = [
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
]


def picker_read(text: str, families: list[str]) -> dict[str, tuple[dict[str, str], float]]:
    """What the endpoint picker keeps of a body: per family of *families*, ONE series.

    llm-d-router's rule (``pkg/epp/framework/plugins/datalayer/extractor/metrics/spec.go``,
    ``Spec.getLatestMetric``): of the family's series, the one whose timestamp is strictly
    greater than every one before it, a missing timestamp read as 0 (``GetTimestampMs``), so for
    vLLM's untimestamped lines the FIRST series in the body. The LoRA family has a rule of its own
    (``loraspec.go``, ``LoRASpec.getLatestMetric``): the series with the strictly greatest VALUE
    (vLLM's creation time), the first of equal ones. An endpoint view serves one series per
    family, so what it serves is read alike under this rule and the "last series" one the tests
    emulated before (``test_the_picker_reads_each_endpoints_true_load_as_engines_die_and_return``
    checks the one series)."""
    kept: dict[str, tuple[dict[str, str], float]] = {}
    best: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in families:
            continue
        by_value = family.name == "vllm:lora_requests_info"
        for sample in family.samples:
            if by_value:
                rank = sample.value
            else:  # a Timestamp (OpenMetrics) or seconds; the picker compares milliseconds
                rank = float(sample.timestamp) * 1000.0 if sample.timestamp is not None else 0.0
            if family.name not in kept or rank > best[family.name]:  # strictly newer: ties keep the first
                kept[family.name] = (dict(sample.labels), sample.value)
                best[family.name] = rank
    return kept


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def catalog() -> Catalog:
    return vllm_catalog(cache_config_labels=("block_size", "num_gpu_blocks"))


class Pod:
    """One vLLM pod: an endpoint, two API-server writers of two engines each (DP 4)."""

    def __init__(self, cfg: StatsConfig, index: int, *, quick: bool = False) -> None:
        self.endpoint = f"10.0.0.{index}:8000"
        config = cfg.replace(endpoint=self.endpoint)
        if quick:
            config = config.replace(flush_interval=0.2, stale_after=1.0, retention=2.0)
        base = 4 * index
        self.engines = [base, base + 1, base + 2, base + 3]
        self.writers = [
            StatsWriter(config, catalog(), engines=self.engines[:2], start=False, role=f"api{index}a"),
            StatsWriter(config, catalog(), engines=self.engines[2:], start=False, role=f"api{index}b"),
        ]
        self.load: dict[int, tuple[float, float, float, int]] = {}
        self.closed: set[int] = set()

    def close_writer(self, i: int) -> None:
        self.writers[i].close()
        self.closed.add(i)

    def record(self) -> None:
        for i, (w, engines) in enumerate(zip(self.writers, (self.engines[:2], self.engines[2:]))):
            if i in self.closed:
                continue
            for e in engines:
                waiting, running, kv, blocks = e % 5 + 1, 3 * e + 2, (e % 7 + 1) / 10, 1000 + e
                self.load[e] = (waiting, running, kv, blocks)
                w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(waiting)
                w.metric("vllm:num_requests_running").labels(e, model_name="m").set(running)
                w.metric("vllm:kv_cache_usage_perc").labels(e, model_name="m").set(kv)
                w.metric("vllm:cache_config_info").labels(e, block_size="16", num_gpu_blocks=str(blocks)).set(
                    1
                )
                w.metric("vllm:lora_requests_info").labels(
                    e, max_lora="2", waiting_lora_adapters="", running_lora_adapters=f"lora{e}"
                ).set(1_700_000_000 + e)
            assert w.flush()

    def expected(self, engines: list[int]) -> dict[str, tuple[dict[str, str], float]]:
        got = [self.load[e] for e in engines]
        return {
            "vllm:num_requests_waiting": ({"model_name": "m"}, sum(g[0] for g in got)),
            "vllm:num_requests_running": ({"model_name": "m"}, sum(g[1] for g in got)),
            "vllm:kv_cache_usage_perc": ({"model_name": "m"}, max(g[2] for g in got)),
            "vllm:cache_config_info": (
                {"block_size": "16", "num_gpu_blocks": str(sum(g[3] for g in got))},
                1.0,
            ),
            "vllm:lora_requests_info": (
                {
                    "max_lora": "2",
                    "waiting_lora_adapters": "",
                    "running_lora_adapters": ",".join(f"lora{e}" for e in sorted(engines)),
                },
                1_700_000_000 + max(engines),
            ),
        }

    def close(self) -> None:
        for w in self.writers:
            w.close()


@pytest.fixture
def cfg(redis_server, namespace):
    return StatsConfig(url=redis_server.url, namespace=namespace)


def test_the_picker_reads_each_endpoints_true_load_as_engines_die_and_return(cfg):
    pods = [Pod(cfg, i) for i in range(3)]
    for pod in pods:
        pod.record()
    exporter = Exporter(StatsReader(cfg, catalog()), port=0, roles=VLLM_ROLES).start()
    try:
        # The bug this view is for: /metrics of a DP pod, read the picker's way, is one engine's.
        whole = picker_read(fetch(exporter.url + "/metrics"), FAMILIES)
        assert whole["vllm:num_requests_waiting"][1] != sum(p.load[e][0] for p in pods for e in p.engines)
        for pod in pods:
            body = fetch(exporter.url + "/metrics?endpoint=" + pod.endpoint)
            assert picker_read(body, FAMILIES) == pod.expected(pod.engines)
            for family in text_string_to_metric_families(body):
                if family.name in FAMILIES:  # exactly one series per family, no engine label
                    assert len(family.samples) == 1 and "engine" not in family.samples[0].labels
            # every other family as /metrics shows it, for this endpoint's engines only
            engines = {
                s.labels.get("engine")
                for f in text_string_to_metric_families(body)
                if f.name == "vllm:num_requests_waiting_by_reason"
                for s in f.samples
            }
            assert engines <= {str(e) for e in pod.engines}
        # one API server of pod 1 closes: its two engines are left out at once
        pods[1].close_writer(0)
        body = fetch(exporter.url + "/metrics?endpoint=" + pods[1].endpoint)
        assert picker_read(body, FAMILIES) == pods[1].expected(pods[1].engines[2:])
        assert 'redis_stats_endpoint_up{endpoint="10.0.0.1:8000"} 1' in body
        doc = json.loads(fetch(exporter.url + "/endpoints"))
        states = {e: v["state"] for e, v in doc["endpoints"]["10.0.0.1:8000"]["engines"].items()}
        assert states == {"4": "down", "5": "down", "6": "up", "7": "up"}
        assert doc["endpoints"]["10.0.0.1:8000"]["up"] is True
        # the whole pod gone: no protocol family at all (never a zero), endpoint_up 0
        pods[1].close_writer(1)
        body = fetch(exporter.url + "/metrics?endpoint=" + pods[1].endpoint)
        assert picker_read(body, FAMILIES) == {}
        assert 'redis_stats_endpoint_up{endpoint="10.0.0.1:8000"} 0' in body
        assert json.loads(fetch(exporter.url + "/endpoints"))["endpoints"]["10.0.0.1:8000"]["up"] is False
        # it comes back (a new process, the same endpoint): counted again
        back = Pod(cfg, 1)
        back.record()
        body = fetch(exporter.url + "/metrics?endpoint=" + pods[1].endpoint)
        assert picker_read(body, FAMILIES) == back.expected(back.engines)
        back.close()
        # the other endpoints never moved
        assert picker_read(fetch(exporter.url + "/metrics?endpoint=10.0.0.2:8000"), FAMILIES) == pods[
            2
        ].expected(pods[2].engines)
    finally:
        exporter.close()
        for pod in pods:
            pod.close()


def test_an_engine_whose_heartbeat_aged_is_left_out(cfg):
    """A writer that stops flushing (killed, SIGSTOPped) without closing: its engines leave the
    endpoint's numbers once past stale_after (1 s here)."""
    pod = Pod(cfg, 0, quick=True)
    pod.record()
    exporter = Exporter(StatsReader(cfg, catalog()), port=0, roles=VLLM_ROLES).start()
    try:
        deadline = time.monotonic() + 1.6
        while time.monotonic() < deadline:  # writer b keeps flushing, writer a is silent
            assert pod.writers[1].flush()
            time.sleep(0.1)
        body = fetch(exporter.url + "/metrics?endpoint=" + pod.endpoint)
        assert picker_read(body, FAMILIES) == pod.expected(pod.engines[2:])
    finally:
        exporter.close()
        pod.close()


def test_one_engines_view_has_no_engine_label(cfg):
    pod = Pod(cfg, 0)
    pod.record()
    exporter = Exporter(StatsReader(cfg, catalog()), port=0, roles=VLLM_ROLES).start()
    try:
        body = fetch(exporter.url + "/metrics?engine=2")
        kept = picker_read(body, FAMILIES)
        waiting, _, kv, _ = pod.load[2]
        assert kept["vllm:num_requests_waiting"] == ({"model_name": "m"}, waiting)
        assert kept["vllm:kv_cache_usage_perc"] == ({"model_name": "m"}, kv)
        assert all("engine" not in s.labels for f in text_string_to_metric_families(body) for s in f.samples)
    finally:
        exporter.close()
        pod.close()


def test_the_self_endpoint_and_unknown_ones(cfg):
    pod = Pod(cfg, 3)
    pod.record()
    reader = StatsReader(cfg, catalog())
    exporter = Exporter(reader, port=0, roles=VLLM_ROLES, self_endpoint=pod.endpoint).start()
    bare = Exporter(StatsReader(cfg, catalog()), port=0, roles=VLLM_ROLES).start()
    try:
        body = fetch(exporter.url + "/metrics?endpoint=self")
        assert picker_read(body, FAMILIES) == pod.expected(pod.engines)
        for url, status, words in (
            (exporter.url + "/metrics?endpoint=10.9.9.9:8000", 404, "no engine of namespace"),
            (exporter.url + "/metrics?engine=99", 404, "has no engine 99"),
            (exporter.url + "/metrics?engine=x", 400, "not an engine index"),
            (exporter.url + "/metrics?endpoint=a%20b", 400, "not an endpoint id"),
            (exporter.url + "/metrics?endpoint=self&engine=1", 400, "give one of"),
            (bare.url + "/metrics?endpoint=self", 404, "REDIS_STATS_ENDPOINT"),
        ):
            with pytest.raises(urllib.error.HTTPError) as err:
                fetch(url)
            assert err.value.code == status
            assert words in json.loads(err.value.read())["error"]
    finally:
        exporter.close()
        bare.close()
        pod.close()


def test_sglang_families_by_the_bridges_roles(cfg):
    """A bridged SGLang server's families, named as SGLang names them, are one series each too."""
    cat = Catalog()
    for name in ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"):
        cat.gauge(name, name + ".", labels=["model_name"])
    ws = []
    for e, (queued, running, usage) in enumerate(((3, 10, 0.5), (4, 20, 0.75))):
        w = StatsWriter(cfg.replace(endpoint="sglang-0:30000"), cat, engines=[e], start=False)
        w.metric("sglang:num_queue_reqs").labels(e, model_name="m").set(queued)
        w.metric("sglang:num_running_reqs").labels(e, model_name="m").set(running)
        w.metric("sglang:token_usage").labels(e, model_name="m").set(usage)
        assert w.flush()
        ws.append(w)
    exporter = Exporter(StatsReader(cfg, cat), port=0, roles=BRIDGE_ROLES).start()
    try:
        body = fetch(exporter.url + "/metrics?endpoint=sglang-0:30000")
        kept = picker_read(body, ["sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"])
        assert kept == {
            "sglang:num_queue_reqs": ({"model_name": "m"}, 7.0),
            "sglang:num_running_reqs": ({"model_name": "m"}, 30.0),
            "sglang:token_usage": ({"model_name": "m"}, 0.75),
        }
    finally:
        exporter.close()
        for w in ws:
            w.close()


def test_the_view_inside_a_vllm_pod_serves_its_own_endpoint(cfg, monkeypatch):
    """The plugin's in-pod view (REDIS_STATS_PORT) answers ?endpoint=self with the endpoint its
    writers record (the plugin's config), whichever pods share the namespace."""
    from redis_stats.integrations.vllm.serve import maybe_serve

    pods = [Pod(cfg, 5), Pod(cfg, 6)]
    for pod in pods:
        pod.record()
    monkeypatch.setenv("REDIS_STATS_PORT", "0")
    monkeypatch.setenv("REDIS_STATS_VIEW", "local")
    view = maybe_serve(cfg.replace(endpoint=pods[1].endpoint), catalog(), pods[1].engines)
    assert view is not None
    try:
        body = fetch(view.url + "/metrics?endpoint=self")
        assert picker_read(body, FAMILIES) == pods[1].expected(pods[1].engines)
    finally:
        view.close()
        for pod in pods:
            pod.close()


def test_an_exporter_of_several_namespaces_serves_each_ones_endpoints(cfg):
    pod = Pod(cfg, 2)
    pod.record()
    exporter = Exporter(
        StatsReader(cfg, catalog()), port=0, roles=VLLM_ROLES, namespaces=[cfg.namespace]
    ).start()
    try:
        body = fetch(f"{exporter.url}/metrics?namespace={cfg.namespace}&endpoint={pod.endpoint}")
        kept = picker_read(body, FAMILIES)
        assert (
            kept["vllm:num_requests_waiting"][1] == pod.expected(pod.engines)["vllm:num_requests_waiting"][1]
        )
        assert kept["vllm:num_requests_waiting"][0]["redis_stats_namespace"] == cfg.namespace
        doc = json.loads(fetch(f"{exporter.url}/endpoints?namespace={cfg.namespace}"))
        assert list(doc["endpoints"]) == [pod.endpoint]
        for path in ("/metrics?endpoint=" + pod.endpoint, "/endpoints"):
            with pytest.raises(urllib.error.HTTPError) as err:
                fetch(exporter.url + path)
            assert err.value.code == 400 and "?namespace=" in json.loads(err.value.read())["error"]
    finally:
        exporter.close()
        pod.close()


def test_an_endpoint_view_is_one_series_per_family_in_every_openmetrics_version(cfg):
    """Asked for an OpenMetrics version other than 1.0.0, an endpoint view still serves the
    endpoint's one series per family (as OpenMetrics 1.0.0, said in its Content-Type): before,
    prometheus_client wrote that version from the engines' own series, with their engine label."""
    pod = Pod(cfg, 1)
    pod.record()
    exporter = Exporter(StatsReader(cfg, catalog()), port=0, roles=VLLM_ROLES).start()
    try:
        request = urllib.request.Request(
            exporter.url + "/metrics?endpoint=" + pod.endpoint,
            headers={"Accept": "application/openmetrics-text; version=2.0.0"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            body, content_type = r.read().decode(), r.headers["Content-Type"]
        assert "version=1.0.0" in content_type
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families

        families = {f.name: f for f in om_families(body)}
        waiting = families["vllm:num_requests_waiting"].samples
        assert [(s.labels, s.value) for s in waiting] == [
            ({"model_name": "m"}, pod.expected(pod.engines)["vllm:num_requests_waiting"][1])
        ]
        assert [s.value for s in families["redis_stats_endpoint_up"].samples] == [1.0]
    finally:
        exporter.close()
        pod.close()


def test_asking_again_and_again_for_an_unknown_endpoint_reads_the_map_at_most_once_a_second(cfg):
    """A client polling a mistyped ``?endpoint=`` every few ms must not make each request a read
    of the whole namespace: after the kept map, at most one read again a second."""
    pod = Pod(cfg, 2)
    pod.record()
    reader = StatsReader(cfg, catalog())
    exporter = Exporter(reader, port=0, roles=VLLM_ROLES).start()
    mapping = states.endpoint_map(exporter)
    reads = []
    load = mapping.reader.load
    mapping.reader.load = lambda *a, **k: reads.append(1) or load(*a, **k)  # type: ignore[method-assign]
    try:
        started = time.monotonic()
        for _ in range(20):
            with pytest.raises(urllib.error.HTTPError) as err:
                fetch(exporter.url + "/metrics?endpoint=10.9.9.9:8000")
            assert err.value.code == 404
        assert len(reads) <= 2 + (time.monotonic() - started)  # the first map, then once a second
    finally:
        exporter.close()
        pod.close()
