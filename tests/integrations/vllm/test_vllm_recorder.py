"""vLLM-shaped stats through several recorders (as several API servers) -> the vllm:* exposition."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

from redis_stats import StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, namespace_for_model, vllm_catalog
from redis_stats.integrations.vllm.catalog import build_1_2_5_buckets
from redis_stats.integrations.vllm.recorder import VllmFeatures
from tests.prometheus.test_collector import scrape
from tests.vllm_shapes import finished, iteration, scheduler

MODEL = "org/tiny-model"


@pytest.fixture
def api_servers(config, fake_client):
    cat = vllm_catalog(max_model_len=1000)
    writers = [StatsWriter(config, cat, engines=[0, 1], client=fake_client(), start=False) for _ in range(2)]
    recorders = [VllmRecorder(w, MODEL, [0, 1]) for w in writers]
    yield writers, recorders, cat
    for w in writers:
        w._closed = True


def flush_and_scrape(writers, config, cat, fake_client):
    for w in writers:
        assert w.flush()
    fams, _ = scrape(StatsReader(config, cat, client=fake_client()))
    return fams


def by_engine(fams, name, sample=None, **labels):
    out = {}
    for s in fams[name].samples:
        if sample and s.name != sample:
            continue
        if all(s.labels.get(k) == v for k, v in labels.items()):
            assert s.labels["model_name"] == MODEL
            out[s.labels["engine"]] = s.value
    return out


def test_counters_from_two_api_servers_sum_per_engine(api_servers, config, fake_client):
    writers, (a, b), cat = api_servers
    a.record(None, iteration(prompt=100, generation=7, done=[finished("stop")]), engine_idx=0)
    b.record(
        None, iteration(prompt=50, generation=3, done=[finished("length"), finished("stop")]), engine_idx=0
    )
    b.record(None, iteration(prompt=5, generation=1), engine_idx=1)
    fams = flush_and_scrape(writers, config, cat, fake_client)
    assert by_engine(fams, "vllm:prompt_tokens") == {"0": 150.0, "1": 5.0}
    assert by_engine(fams, "vllm:generation_tokens") == {"0": 10.0, "1": 1.0}
    assert {s.name for s in fams["vllm:prompt_tokens"].samples} == {"vllm:prompt_tokens_total"}
    # Every known finish reason exists for every engine from the start, as in vLLM.
    assert by_engine(fams, "vllm:request_success", finished_reason="stop") == {"0": 2.0, "1": 0.0}
    assert by_engine(fams, "vllm:request_success", finished_reason="length") == {"0": 1.0, "1": 0.0}
    assert by_engine(fams, "vllm:request_success", finished_reason="repetition") == {"0": 0.0, "1": 0.0}


def test_scheduler_gauges_take_the_newest_step_across_api_servers(api_servers, config, fake_client):
    writers, (a, b), cat = api_servers
    a.record(scheduler(running=3, waiting=1, kv=0.25, queries=40, hits=10), None, engine_idx=0)
    b.record(scheduler(running=5, waiting=0, kv=0.5, queries=60, hits=30), None, engine_idx=0)
    a.record(scheduler(running=1, waiting=2, kv=0.75), None, engine_idx=1)
    fams = flush_and_scrape(writers, config, cat, fake_client)
    assert by_engine(fams, "vllm:num_requests_running") == {"0": 5.0, "1": 1.0}
    assert by_engine(fams, "vllm:num_requests_waiting") == {"0": 0.0, "1": 2.0}
    assert by_engine(fams, "vllm:kv_cache_usage_perc") == {"0": 0.5, "1": 0.75}
    assert by_engine(fams, "vllm:prefix_cache_queries") == {"0": 100.0, "1": 0.0}
    assert by_engine(fams, "vllm:prefix_cache_hits") == {"0": 40.0, "1": 0.0}


def test_latency_histograms_have_vllm_buckets_cumulative(api_servers, config, fake_client):
    writers, (a, b), cat = api_servers
    a.record(None, iteration(ttft=[0.03, 0.3], itl=[0.02, 0.02, 0.5]), engine_idx=1)
    b.record(None, iteration(ttft=[3.0]), engine_idx=1)
    fams = flush_and_scrape(writers, config, cat, fake_client)
    ttft = {
        s.labels["le"]: s.value
        for s in fams["vllm:time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["engine"] == "1"
    }
    assert list(ttft) == [
        *(
            str(b)
            for b in (
                0.001,
                0.005,
                0.01,
                0.02,
                0.04,
                0.06,
                0.08,
                0.1,
                0.25,
                0.5,
                0.75,
                1.0,
                2.5,
                5.0,
                7.5,
                10.0,
                20.0,
                40.0,
                80.0,
                160.0,
                640.0,
                2560.0,
            )
        ),
        "+Inf",
    ]
    assert ttft["0.02"] == 0 and ttft["0.04"] == 1 and ttft["0.5"] == 2 and ttft["+Inf"] == 3
    assert by_engine(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == {
        "0": 0.0,
        "1": 3.0,
    }  # every bound engine is exposed from the start, as in vLLM
    assert by_engine(fams, "vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count") == {
        "0": 0.0,
        "1": 2.0,
    }


def test_finished_request_histograms_and_token_buckets_follow_max_model_len(api_servers, config, fake_client):
    writers, (a, _), cat = api_servers
    a.record(None, iteration(done=[finished(prompt=120, generation=30)]), engine_idx=0)
    fams = flush_and_scrape(writers, config, cat, fake_client)
    les = [
        s.labels["le"]
        for s in fams["vllm:request_prompt_tokens"].samples
        if s.name.endswith("_bucket") and s.labels["engine"] == "0"
    ]
    assert les == [*(str(float(b)) for b in build_1_2_5_buckets(1000)), "+Inf"]
    assert by_engine(fams, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum") == {
        "0": 120.0,
        "1": 0.0,
    }
    for name in (
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds",
    ):
        assert by_engine(fams, name, name + "_count") == {"0": 1.0, "1": 0.0}, name


def test_spec_decoding_sleep_and_admission(api_servers, config, fake_client):
    writers, (a, _), cat = api_servers
    spec = SimpleNamespace(
        num_drafts=2, num_draft_tokens=6, num_accepted_tokens=4, num_accepted_tokens_per_pos=[2, 1, 1]
    )
    a.record(scheduler(spec=spec), None, engine_idx=0)
    a.record_sleep_state(1, 1)
    a.record_admission_rejection("max_num_queued_reqs")
    fams = flush_and_scrape(writers, config, cat, fake_client)
    assert by_engine(fams, "vllm:spec_decode_num_drafts") == {"0": 2.0, "1": 0.0}
    assert by_engine(fams, "vllm:spec_decode_num_accepted_tokens_per_pos", position="0") == {"0": 2.0}
    assert by_engine(fams, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == {"0": 1.0, "1": 1.0}
    assert by_engine(fams, "vllm:engine_sleep_state", sleep_state="awake") == {"0": 0.0, "1": 0.0}
    # vLLM's counter has no engine label; it is kept under the first engine of the API server.
    assert by_engine(fams, "vllm:admission_rejections", reason="max_num_queued_reqs") == {"0": 1.0}
    assert by_engine(fams, "vllm:admission_rejections", reason="max_num_queued_tokens") == {"0": 0.0}


def test_namespace_from_model_name_is_always_valid():
    from redis_stats import StatsConfig

    for name in ("meta-llama/Llama-3-8B", "a b{c}*", ""):
        StatsConfig(namespace=namespace_for_model(name))


def test_importing_redis_stats_never_imports_vllm():
    code = "import sys, redis_stats, redis_stats.integrations.vllm; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_optional_families_only_when_switched_on_as_in_vllm(config, fake_client):
    """Watermark counts, KV-cache residency and KV-fetch stages exist only with their vLLM option;
    spec decoding and NaN counting can be switched off."""
    cat = vllm_catalog(max_model_len=1000)
    on = VllmFeatures(
        spec_decoding=False, corrupted=False, kv_consumer=True, watermark=True, kv_cache_metrics=True
    )
    writers = [StatsWriter(config, cat, engines=[0], client=fake_client(), start=False) for _ in range(2)]
    plain, full = VllmRecorder(writers[0], MODEL, [0]), VllmRecorder(writers[1], "full", [0], features=on)
    sched = scheduler(running=1)
    sched.num_kv_fetch_reqs_by_stage = {"in_progress": 2}
    sched.kv_cache_eviction_events = [
        SimpleNamespace(lifetime_seconds=90.0, idle_seconds=0.5, reuse_gaps_seconds=(0.004, 3.0))
    ]
    it = iteration(prompt=3)
    it.num_watermarked_reqs, it.num_watermark_skipped_reqs, it.num_not_watermarked_reqs = 2, 1, 0
    it.num_corrupted_reqs = 1
    for r in (plain, full):
        r.record(sched, it, engine_idx=0)
    fams = flush_and_scrape(writers, config, cat, fake_client)

    def of(name, model, sample=None):
        return (
            {
                tuple(
                    sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name"))
                ): s.value
                for s in fams[name].samples
                if s.labels["model_name"] == model and (sample is None or s.name == sample)
            }
            if name in fams
            else {}
        )

    assert of("vllm:watermark_requests", "full") == {
        (("status", "watermarked"),): 2.0,
        (("status", "skipped"),): 1.0,
        (("status", "not_watermarked"),): 0.0,
    }
    assert of("vllm:watermark_requests", MODEL) == {}
    assert of("vllm:num_requests_kv_fetch_by_stage", "full") == {
        (("stage", "waiting_to_start"),): 0.0,
        (("stage", "in_progress"),): 2.0,
        (("stage", "completed_waiting"),): 0.0,
    }
    assert of("vllm:num_requests_kv_fetch_by_stage", MODEL) == {}
    count = "vllm:kv_block_reuse_gap_seconds_count"
    assert of("vllm:kv_block_reuse_gap_seconds", "full", count) == {(): 2.0}
    assert of("vllm:kv_block_lifetime_seconds", "full", "vllm:kv_block_lifetime_seconds_sum") == {(): 90.0}
    assert of("vllm:kv_block_idle_before_evict_seconds", MODEL) == {}
    assert of("vllm:corrupted_requests", MODEL) == {(): 1.0}
    assert of("vllm:corrupted_requests", "full") == {}
    assert of("vllm:spec_decode_num_drafts", MODEL) == {(): 0.0}
    assert of("vllm:spec_decode_num_drafts", "full") == {}


def test_custom_histogram_buckets_replace_a_family_as_in_vllm():
    cat = vllm_catalog(1000, bucket_overrides={"request_latency": [1, 10], "request_tokens": [5, 50]})
    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_decode_time_seconds"):
        assert cat[name].buckets == (1.0, 10.0)
    assert cat["vllm:request_prompt_tokens"].buckets == (5.0, 50.0)
    assert (
        cat["vllm:time_to_first_token_seconds"].buckets
        == vllm_catalog(1000)["vllm:time_to_first_token_seconds"].buckets
    )
    with pytest.raises(ValueError, match="request_latencies"):
        vllm_catalog(1000, bucket_overrides={"request_latencies": [1]})


def test_a_reason_that_is_not_text_is_recorded_never_raised(api_servers, config, fake_client):
    """A finish or rejection reason holding a lone surrogate raised CatalogError out of record()
    (vLLM's stat loop); it is recorded with the surrogate as "?" (found by
    tests/store/test_every_view.py)."""
    writers, recorders, cat = api_servers
    recorders[0].record(scheduler(), iteration(done=[finished(reason="odd\ud800")]), engine_idx=0)
    recorders[0].record_admission_rejection("full\udfff")
    fams = flush_and_scrape(writers, config, cat, fake_client)
    assert by_engine(fams, "vllm:request_success", finished_reason="odd?") == {"0": 1.0}
    assert by_engine(fams, "vllm:admission_rejections", reason="full?") == {"0": 1.0}


def test_a_reader_of_vllms_catalogue_shows_the_cache_config_its_writers_stored(config, fake_client, caplog):
    """vLLM's cache config labels are known only inside vLLM (the plugin builds its catalogue
    from `CacheConfig.metrics_info()`); the exporter, top and inspect read with `vllm_catalog()`,
    which defined the gauge with no labels: every reader logged that its definition differed
    and counted a catalog_conflict on every read. A reader's catalogue now leaves it out, and
    shows the stored definition."""
    import logging

    labels = ("block_size", "num_gpu_blocks")
    writer = StatsWriter(
        config, vllm_catalog(cache_config_labels=labels), engines=[0], client=fake_client(), start=False
    )
    VllmRecorder(writer, "m", [0]).record_cache_config({"block_size": 16, "num_gpu_blocks": 1000})
    assert writer.flush()
    with caplog.at_level(logging.WARNING):
        snap = StatsReader(config, vllm_catalog(), client=fake_client()).snapshot()
    assert "catalog_conflict" not in snap.skipped and "defines it as" not in caplog.text
    assert snap.engines[0].gauge("vllm:cache_config_info", "16", "1000") == 1.0
