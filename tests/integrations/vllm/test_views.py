"""One true total however the views are scraped: the view inside vLLM serves every engine
(``REDIS_STATS_VIEW=all``, scrape one) or only its instance's engines (``local``, scrape every node)."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsWriter
from redis_stats.config import ConfigError
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.serve import maybe_serve, view_engines


def scrape_tokens(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:generation_tokens_total":
                out[s.labels["engine"]] = out.get(s.labels["engine"], 0.0) + s.value
    return out


@pytest.fixture
def two_instances(redis_server, namespace):
    """Two independent instances (dense external LB): each calls its engine 0, offsets 0 and 2."""
    config = StatsConfig(url=redis_server.url, namespace=namespace)
    writers = []
    for offset, tokens in ((0, 100), (2, 250)):
        cfg = config.replace(engine_offset=offset)
        w = StatsWriter(cfg, vllm_catalog(), engines=[0], start=False)
        w.counter("vllm:generation_tokens").labels(engine=0, model_name="m").inc(tokens)
        assert w.flush()
        writers.append(w)
    yield config
    for w in writers:
        w.close()


@pytest.mark.parametrize(("view", "factor"), [("all", 2), ("local", 1)])
def test_every_node_scraped_sums_to_the_truth_only_with_local_views(two_instances, monkeypatch, view, factor):
    monkeypatch.setenv("REDIS_STATS_PORT", "0")
    monkeypatch.setenv("REDIS_STATS_ADDR", "127.0.0.1")
    monkeypatch.setenv("REDIS_STATS_VIEW", view)
    views = [maybe_serve(two_instances, vllm_catalog(), [0 + offset]) for offset in (0, 2)]
    try:
        assert all(v is not None for v in views)
        scraped = [scrape_tokens(v.url) for v in views]
    finally:
        for v in views:
            v.close()
    if view == "local":
        assert scraped == [{"0": 100.0}, {"2": 250.0}]  # each node: its own engine only
    else:
        assert scraped == [{"0": 100.0, "2": 250.0}] * 2  # each node: the whole fleet
    # What `sum(vllm:generation_tokens_total)` over a job that scrapes every node returns:
    assert sum(sum(s.values()) for s in scraped) == factor * 350.0


def test_view_defaults_to_all_and_refuses_an_unknown_value(monkeypatch):
    monkeypatch.delenv("REDIS_STATS_VIEW", raising=False)
    assert view_engines([3, 1]) is None
    monkeypatch.setenv("REDIS_STATS_VIEW", "LOCAL ")
    assert view_engines([3, 1, 3]) == [1, 3]
    monkeypatch.setenv("REDIS_STATS_VIEW", "node")
    with pytest.raises(ConfigError, match=r"REDIS_STATS_VIEW='node' is not one of all, local"):
        view_engines([0])


def test_no_port_no_view(monkeypatch, two_instances):
    monkeypatch.delenv("REDIS_STATS_PORT", raising=False)
    assert maybe_serve(two_instances, vllm_catalog(), [0]) is None
