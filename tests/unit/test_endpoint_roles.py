"""The one series per family of the endpoint views (redis_stats.endpoints), by role."""

import pytest

from redis_stats import Catalog
from redis_stats.endpoints import CACHE_CONFIG, KV_USAGE, LORA, RUNNING, WAITING, FamilyRole, aggregate
from redis_stats.integrations.bridge.roles import TRTLLM_ROLES
from redis_stats.snapshot import EngineSnapshot, Snapshot


def snapshot(gauges: dict[int, dict[tuple[str, tuple[str, ...]], float]]) -> Snapshot:
    cat = Catalog()
    cat.gauge("waiting", "Waiting.", labels=["model_name", "pod"])
    cat.gauge("kv", "KV usage.", labels=["model_name"])
    cat.gauge("cache", "Cache config.", labels=["block_size", "num_gpu_blocks"])
    cat.gauge("blocks", "Cache config without a block size.", labels=["num_gpu_blocks"])
    cat.gauge("lora", "LoRA.", labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
    cat.gauge("nv_trt_llm_request_metrics", "Requests.", labels=["request_type"])
    engines = {e: EngineSnapshot(e, 0.0, 0.0, True, gauges=g) for e, g in gauges.items()}
    return Snapshot(0.0, engines, {}, cat)


def test_sums_and_the_largest_keep_the_labels_every_series_shares():
    snap = snapshot(
        {
            0: {("waiting", ("m", "a")): 3.0, ("kv", ("m",)): 0.5},
            1: {("waiting", ("m", "b")): 4.0, ("kv", ("m",)): 0.9},
        }
    )
    engines = list(snap.engines.values())
    assert aggregate(snap, FamilyRole("waiting", WAITING), engines) == ({"model_name": "m"}, 7.0)
    assert aggregate(snap, FamilyRole("waiting", RUNNING), engines[:1]) == (
        {"model_name": "m", "pod": "a"},
        3.0,
    )
    assert aggregate(snap, FamilyRole("kv", KV_USAGE), engines) == ({"model_name": "m"}, 0.9)
    assert aggregate(snap, FamilyRole("kv", KV_USAGE), []) is None  # no live engine: no series


def test_cache_config_adds_blocks_of_one_block_size_only():
    snap = snapshot({0: {("cache", ("16", "100")): 1.0}, 1: {("cache", ("16", "250")): 1.0}})
    engines = list(snap.engines.values())
    assert aggregate(snap, FamilyRole("cache", CACHE_CONFIG), engines) == (
        {"block_size": "16", "num_gpu_blocks": "350"},
        1.0,
    )
    mixed = snapshot({0: {("cache", ("16", "100")): 1.0}, 1: {("cache", ("32", "250")): 1.0}})
    assert aggregate(mixed, FamilyRole("cache", CACHE_CONFIG), list(mixed.engines.values())) is None
    # no block size known: no series (it showed block_size="None")
    bare = snapshot({0: {("blocks", ("100",)): 1.0}, 1: {("blocks", ("250",)): 1.0}})
    assert aggregate(bare, FamilyRole("blocks", CACHE_CONFIG), list(bare.engines.values())) is None


def test_lora_is_the_union_of_each_engines_newest_lists():
    snap = snapshot(
        {
            0: {("lora", ("2", "", "a")): 10.0, ("lora", ("2", "", "old")): 5.0},  # the newest: a
            1: {("lora", ("4", "w", "b,a")): 12.0},
        }
    )
    labels, value = aggregate(snap, FamilyRole("lora", LORA), list(snap.engines.values()))  # type: ignore[misc]
    assert labels == {"max_lora": "4", "waiting_lora_adapters": "w", "running_lora_adapters": "a,b"}
    assert value == 12.0


def test_a_role_may_select_series_by_label_as_tensorrt_llms_do():
    snap = snapshot(
        {
            0: {
                ("nv_trt_llm_request_metrics", ("waiting",)): 2.0,
                ("nv_trt_llm_request_metrics", ("scheduled",)): 5.0,
            },
            1: {
                ("nv_trt_llm_request_metrics", ("waiting",)): 1.0,
                ("nv_trt_llm_request_metrics", ("context",)): 9.0,
            },
        }
    )
    engines = list(snap.engines.values())
    waiting, running = TRTLLM_ROLES[0], TRTLLM_ROLES[1]
    assert aggregate(snap, waiting, engines) == ({"request_type": "waiting"}, 3.0)
    # engine 1 has no "scheduled" series: not engine 0's 5 as the endpoint's (issue 39)
    from redis_stats.endpoints import NO_SERIES, Withheld

    assert aggregate(snap, running, engines) == Withheld("nv_trt_llm_request_metrics", 1, NO_SERIES)
    assert aggregate(snap, running, engines[:1]) == ({"request_type": "scheduled"}, 5.0)


def test_an_unknown_role_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="role 'queue' of family 'x' is not one of waiting, running"):
        FamilyRole("x", "queue")


def test_a_role_given_to_a_counter_family_makes_no_series():
    """The rules are of gauges: a role given to a counter aggregates nothing (and the endpoint
    view shows that family as ``/metrics`` does)."""
    cat = Catalog()
    cat.counter("waiting", "Not a gauge.")
    snap = Snapshot(0.0, {0: EngineSnapshot(0, 0.0, 0.0, True, gauges={("waiting", ()): 3.0})}, {}, cat)
    assert aggregate(snap, FamilyRole("waiting", WAITING), list(snap.engines.values())) is None


def test_a_live_engine_without_a_number_of_a_family_withholds_it_and_says_which():
    from redis_stats.endpoints import NO_SERIES, NOT_A_NUMBER, Withheld

    snap = snapshot(
        {
            0: {("waiting", ("m", "a")): 3.0, ("kv", ("m",)): 0.5, ("cache", ("16", "100")): 1.0},
            1: {("kv", ("m",)): float("nan")},  # no waiting yet, its KV usage no number
        }
    )
    engines = list(snap.engines.values())
    assert aggregate(snap, FamilyRole("waiting", WAITING), engines) == Withheld("waiting", 1, NO_SERIES)
    assert aggregate(snap, FamilyRole("kv", KV_USAGE), engines) == Withheld("kv", 1, NOT_A_NUMBER)
    assert aggregate(snap, FamilyRole("cache", CACHE_CONFIG), engines) == Withheld("cache", 1, NO_SERIES)
    # the engine that has it alone: its number (nothing withheld)
    alone = aggregate(snap, FamilyRole("waiting", WAITING), engines[:1])
    assert alone == ({"model_name": "m", "pod": "a"}, 3.0)
