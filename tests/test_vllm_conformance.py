"""Conformance with vLLM itself (needs vLLM: `make test-vllm`).

The same stats objects go through vLLM's own PrometheusStatLogger and through redis_stats (two
recorders, as two API servers, via Redis): every vLLM family must exist here with the same type,
help, label names and buckets, and every vLLM sample must have the same value here.
"""

import random
from types import SimpleNamespace as NS

import pytest

pytest.importorskip("vllm.v1.metrics.loggers")

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.stats import (
    FinishedRequestStats,
    IterationStats,
    PrefixCacheStats,
    SchedulerStats,
)
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from redis_stats import StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog

from .test_collector import scrape

pytestmark = pytest.mark.vllm

MODEL = "tiny"
MAX_LEN = 1000
SPEC_TOKENS = 3


def vllm_config():
    return NS(
        observability_config=NS(
            show_hidden_metrics=False,
            kv_cache_metrics=False,
            custom_histogram_buckets=None,
            enable_mfu_metrics=False,
            cudagraph_metrics=False,
        ),
        model_config=NS(served_model_name=MODEL, max_model_len=MAX_LEN, is_diffusion=False),
        speculative_config=NS(num_speculative_tokens=SPEC_TOKENS),
        kv_transfer_config=None,
        ec_transfer_config=None,
        lora_config=None,
        watermark_config=None,
        parallel_config=NS(),
        cache_config=NS(),
        scheduler_config=NS(),
    )


def vllm_families():
    return {m.name: m for m in prometheus_client.REGISTRY.collect() if m.name.startswith("vllm:")}


@pytest.fixture
def vllm_logger():
    return PrometheusStatLogger(vllm_config(), [0, 1])


def test_every_vllm_family_has_the_same_type_help_labels_and_buckets(vllm_logger):
    ours = vllm_catalog(MAX_LEN)
    skipped = {
        "vllm:estimated_flops_per_gpu",
        "vllm:estimated_read_bytes_per_gpu",
        "vllm:estimated_write_bytes_per_gpu",
    }  # MFU estimates: documented as not covered
    for name, fam in vllm_families().items():
        if name in skipped:
            continue
        spec = ours.get(name)
        assert spec is not None, f"{name} is missing from the catalogue"
        assert spec.kind == fam.type, name
        assert spec.help == fam.documentation, name
        theirs = {k for s in fam.samples for k in s.labels if k != "le"}
        assert {"engine", *spec.labels} >= theirs, name
        assert set(spec.labels) == theirs - {"engine"}, name
        if fam.type == "histogram":
            les = sorted({float(s.labels["le"]) for s in fam.samples if "le" in s.labels})
            assert [*spec.buckets, float("inf")] == les, name


def steps(seed: int = 7):
    """A realistic run: per step, one engine's scheduler and iteration stats."""
    rng = random.Random(seed)
    reasons = list(FinishReason)
    for step in range(200):
        engine = step % 2
        prefix = PrefixCacheStats(requests=1, queries=rng.randint(0, 500))
        prefix.hits = rng.randint(0, prefix.queries)
        spec = SpecDecodingStats.new(SPEC_TOKENS)
        spec.num_drafts = rng.randint(0, 4)
        spec.num_draft_tokens = spec.num_drafts * SPEC_TOKENS
        spec.num_accepted_tokens_per_pos = [rng.randint(0, spec.num_drafts) for _ in range(SPEC_TOKENS)]
        spec.num_accepted_tokens = sum(spec.num_accepted_tokens_per_pos)
        sched = SchedulerStats(
            num_running_reqs=rng.randint(0, 64),
            num_waiting_reqs=rng.randint(0, 9),
            num_skipped_waiting_reqs=rng.randint(0, 2),
            kv_cache_usage=rng.random(),
            prefix_cache_stats=prefix,
            spec_decoding_stats=spec,
        )
        it = IterationStats()
        it.num_generation_tokens = rng.randint(0, 64)
        cached = rng.randint(0, 100)
        it.prompt_token_stats.computed = rng.randint(0, 900)
        it.prompt_token_stats.local_cache_hit = cached
        it.prompt_token_stats.cached_tokens = cached
        it.prompt_token_stats.total = it.prompt_token_stats.computed + cached
        it.num_preempted_reqs = rng.randint(0, 1)
        it.time_to_first_tokens_iter = [rng.expovariate(10) for _ in range(rng.randint(0, 3))]
        it.inter_token_latencies_iter = [rng.expovariate(30) for _ in range(rng.randint(0, 20))]
        it.n_params_iter = [rng.choice([1, 2, 4]) for _ in range(rng.randint(0, 2))]
        it.max_num_generation_tokens_iter = [rng.randint(1, 999) for _ in range(rng.randint(0, 2))]
        for _ in range(rng.randint(0, 2)):
            it.finished_requests.append(
                FinishedRequestStats(
                    finish_reason=rng.choice(reasons),
                    e2e_latency=rng.expovariate(0.5),
                    num_prompt_tokens=rng.randint(1, 999),
                    num_preemptions=rng.randint(0, 3),
                    num_generation_tokens=rng.randint(1, 999),
                    max_tokens_param=rng.choice([None, 256]),
                    queued_time=rng.expovariate(5),
                    prefill_time=rng.expovariate(5),
                    inference_time=rng.expovariate(1),
                    decode_time=rng.expovariate(1),
                    mean_time_per_output_token=rng.expovariate(30),
                    num_cached_tokens=rng.randint(0, 50),
                )
            )
        yield engine, sched, it


def compare_with_vllm(reader) -> int:
    """Assert every vLLM sample has the same value in our exposition; return how many were compared."""
    _, text = scrape(reader)
    ours = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            if fam.name == "vllm:admission_rejections":
                labels.pop("engine")  # vLLM's has no engine label
            ours[(s.name, tuple(sorted(labels.items())))] = s.value
    compared = 0
    for fam in vllm_families().values():
        if fam.name.startswith("vllm:estimated_"):
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key in ours, f"missing sample {key}"
            assert ours[key] == pytest.approx(s.value, rel=1e-9, abs=1e-9), key
            compared += 1
    return compared


def test_same_stats_give_the_same_samples_as_vllm(vllm_logger, config, fake_client):
    cat = vllm_catalog(MAX_LEN)
    writers = [StatsWriter(config, cat, engines=[0, 1], client=fake_client(), start=False) for _ in range(2)]
    recorders = [VllmRecorder(w, MODEL, [0, 1]) for w in writers]
    reader = StatsReader(config, cat, client=fake_client())
    checkpoints = 0
    for i, (engine, sched, it) in enumerate(steps()):
        vllm_logger.record(sched, it, engine_idx=engine)
        recorders[i % 3 % 2].record(sched, it, engine_idx=engine)  # two API servers, uneven split
        if i % 23 == 22:  # compare mid-run too, so gauges are checked at many different values
            for w in writers:
                assert w.flush()
            assert compare_with_vllm(reader) > 500
            checkpoints += 1
    for r in recorders:
        r.record_admission_rejection("max_num_queued_reqs")
    vllm_logger.record_admission_rejection("max_num_queued_reqs")
    vllm_logger.record_admission_rejection("max_num_queued_reqs")
    for w in writers:
        assert w.flush()
    assert compare_with_vllm(reader) > 500
    assert checkpoints >= 8
    for w in writers:
        w._closed = True
