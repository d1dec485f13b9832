"""Conformance with vLLM itself (needs vLLM: `make test-vllm`).

The same stats objects go through vLLM's own PrometheusStatLogger and through redis_stats (two
recordings, as two API servers, via Redis): every vLLM family must exist here with the same type,
help, label names and buckets, the view must show no family vLLM does not, and every vLLM sample
must have the same value here. Configurations: vLLM's defaults; every optional family switched on
(spec decoding, --kv-cache-metrics, watermark, LoRA, NaN counting, custom buckets, and vLLM's CPU
OffloadingConnector as a KV consumer); a diffusion model; and every KV connector vLLM registers whose
metrics build on the CPU build.
"""

import random
import time
from types import SimpleNamespace as NS

import pytest

pytest.importorskip("vllm.v1.metrics.loggers")

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.perf import PerfStats
from vllm.v1.metrics.stats import (
    FinishedRequestStats,
    IterationStats,
    KVCacheEvictionEvent,
    PrefixCacheStats,
    SchedulerStats,
)
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from redis_stats import StatsReader, StatsWriter
from redis_stats.integrations.vllm.plugin import VllmRecording, catalog_for
from tests.prometheus.test_collector import scrape

pytestmark = pytest.mark.vllm

MODEL = "tiny"
MAX_LEN = 1000
SPEC_TOKENS = 3
ENGINES = [0, 1]
# vLLM's families with no engine label: redis_stats keeps them under the API server's first engine.
NO_ENGINE_LABEL = {"vllm:admission_rejections", "vllm:lora_requests_info"}
# A gauge set to the wall-clock time of the step (set_to_current_time): compared by labels only.
TIMESTAMP_GAUGES = {"vllm:lora_requests_info"}


def cache_config():
    info = {"block_size": "16", "cache_dtype": "auto", "enable_prefix_caching": "True"}
    info["num_gpu_blocks"] = "64"
    return NS(metrics_info=lambda: dict(info), num_gpu_blocks=64)


def vllm_config(*, full=False, diffusion=False, kv_connector=None, extra_config=None, role="kv_both"):
    """A VllmConfig as far as PrometheusStatLogger reads it (its tests build it the same way)."""
    kv = None
    if full and kv_connector is None:
        kv_connector = "OffloadingConnector"
    if kv_connector is not None:
        kv = KVTransferConfig(
            kv_connector=kv_connector, kv_role=role, kv_connector_extra_config=extra_config or {}
        )
    return NS(
        observability_config=NS(
            show_hidden_metrics=False,
            kv_cache_metrics=full,
            custom_histogram_buckets=(
                {"time_to_first_token": [0.1, 1.0, 10.0], "kv_cache_residency": [1.0, 60.0, 600.0]}
                if full
                else None
            ),
            enable_mfu_metrics=full,
            cudagraph_metrics=full,
        ),
        model_config=NS(served_model_name=MODEL, max_model_len=MAX_LEN, is_diffusion=diffusion),
        speculative_config=None if diffusion else NS(num_speculative_tokens=SPEC_TOKENS),
        kv_transfer_config=kv,
        ec_transfer_config=None,
        lora_config=NS(max_loras=4) if full else None,
        watermark_config=NS() if full else None,
        parallel_config=NS(),
        cache_config=cache_config(),
        scheduler_config=NS(),
    )


CONFIGS = {
    "defaults": {},
    "every-optional-family": {"full": True},
    "diffusion": {"diffusion": True},
}


@pytest.fixture(params=list(CONFIGS))
def setup(request, monkeypatch):
    full = CONFIGS[request.param].get("full", False)
    if full:
        monkeypatch.setenv("VLLM_COMPUTE_NANS_IN_LOGITS", "1")
    else:
        monkeypatch.delenv("VLLM_COMPUTE_NANS_IN_LOGITS", raising=False)
    cfg = vllm_config(**CONFIGS[request.param])
    theirs = PrometheusStatLogger(cfg, ENGINES)
    theirs.log_engine_initialized()
    return cfg, theirs, full


def vllm_families():
    return {m.name: m for m in prometheus_client.REGISTRY.collect() if m.name.startswith("vllm:")}


def vllm_definitions() -> dict:
    """{family: (type, help, label names, buckets)} as vLLM registered them, bound or not (a
    connector binds some series only when its first stats arrive)."""
    out = {}
    for collector in prometheus_client.REGISTRY._collector_to_names:
        name = getattr(collector, "_name", "")
        if name.startswith("vllm:"):
            bounds = tuple(getattr(collector, "_upper_bounds", ()))
            out[name] = (collector._type, collector._documentation, tuple(collector._labelnames), bounds)
    return out


@pytest.fixture
def two_api_servers(config, fake_client):
    """Two writers with the plugin's recording each, as two API servers of one instance."""
    made = []

    def make(cfg):
        for _ in range(2):
            writer = StatsWriter(config, catalog_for(cfg), engines=ENGINES, client=fake_client(), start=False)
            recording = VllmRecording(cfg, writer, ENGINES)
            recording.record_cache_config()
            made.append((writer, recording))
        return made

    yield make
    for writer, _ in made:
        writer._closed = True


def assert_same_definitions(catalog) -> int:
    theirs = vllm_definitions()
    for name, (kind, help_text, labels, bounds) in theirs.items():
        spec = catalog.get(name)
        assert spec is not None, f"{name} is missing"
        assert spec.kind == kind, name
        assert spec.help == help_text, name
        if name in NO_ENGINE_LABEL:
            assert set(spec.labels) == set(labels), name
        else:
            assert "engine" in labels, name
            assert set(spec.labels) == set(labels) - {"engine"}, name
        if kind == "histogram":
            assert (*spec.buckets, float("inf")) == bounds, name
    return len(theirs)


def test_every_vllm_family_has_the_same_type_help_labels_and_buckets(setup, two_api_servers):
    cfg, _, full = setup
    (writer, _), _ = two_api_servers(cfg)
    checked = assert_same_definitions(writer.catalog)
    theirs = vllm_definitions()
    if full:
        for name in (
            "vllm:estimated_flops_per_gpu",
            "vllm:kv_block_lifetime_seconds",
            "vllm:watermark_requests",
            "vllm:lora_requests_info",
            "vllm:kv_offload_load_bytes",
            "vllm:num_requests_kv_fetch_by_stage",
            "vllm:spec_decode_num_accepted_tokens_per_pos",
        ):
            assert name in theirs, name  # the configuration really switched them on
        assert checked >= 60


def steps(cfg, seed: int = 7):
    """A realistic run: per step, one engine's scheduler and iteration stats, with every optional
    part the configuration has (connector stats as OffloadingConnectorStats builds them)."""
    rng = random.Random(seed)
    reasons = list(FinishReason)
    for step in range(120):
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
        full = cfg.observability_config.kv_cache_metrics
        if full:
            sched.num_kv_fetch_reqs_by_stage = {"in_progress": rng.randint(0, 3)}
            sched.kv_cache_eviction_events = [
                KVCacheEvictionEvent(
                    lifetime_seconds=rng.expovariate(0.01),
                    idle_seconds=rng.expovariate(0.1),
                    reuse_gaps_seconds=tuple(rng.expovariate(1) for _ in range(rng.randint(0, 3))),
                )
                for _ in range(rng.randint(0, 2))
            ]
            sched.perf_stats = PerfStats(
                num_flops_per_gpu=rng.randint(0, 10**12),
                num_read_bytes_per_gpu=rng.randint(0, 10**9),
                num_write_bytes_per_gpu=rng.randint(0, 10**9),
            )
            kv = OffloadingConnectorStats()
            kv.increase_counter("vllm:kv_offload_load_bytes", rng.randint(0, 10**8))
            kv.increase_counter("vllm:kv_offload_store_time", rng.random())
            kv.set_gauge("vllm:kv_offload_cpu_cache_usage_perc", rng.random())
            for _ in range(rng.randint(0, 3)):
                kv.observe_histogram("vllm:kv_offload_store_size", rng.uniform(0, 3e8))
                kv.observe_histogram("vllm:kv_offload_lookup_sync_delay_seconds", rng.expovariate(1000))
            if rng.random() < 0.2:
                kv.increase_counter("vllm:kv_offload_allocation_failure")
            sched.kv_connector_stats = kv.data
            sched.running_lora_adapters = {"sql": 1} if rng.random() < 0.5 else {}
            sched.waiting_lora_adapters = {"chat": 2} if rng.random() < 0.3 else {}
        it = IterationStats()
        it.num_generation_tokens = rng.randint(0, 64)
        cached = rng.randint(0, 100)
        it.prompt_token_stats.computed = rng.randint(0, 900)
        it.prompt_token_stats.local_cache_hit = cached
        it.prompt_token_stats.cached_tokens = cached
        it.prompt_token_stats.total = it.prompt_token_stats.computed + cached
        it.num_preempted_reqs = rng.randint(0, 1)
        it.num_corrupted_reqs = rng.randint(0, 1)
        it.num_watermarked_reqs = rng.randint(0, 2)
        it.num_watermark_skipped_reqs = rng.randint(0, 1)
        it.num_not_watermarked_reqs = rng.randint(0, 2)
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


def exposition(reader) -> dict:
    """{(sample, labels): value} of the Redis view, without redis_stats' own metrics."""
    _, text = scrape(reader)
    ours = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("redis_stats_"):
            continue
        for s in fam.samples:
            labels = dict(s.labels)
            if fam.name in NO_ENGINE_LABEL:
                labels.pop("engine")  # vLLM's has none: see docs/vllm-metrics.md
            value = 1.0 if fam.name in TIMESTAMP_GAUGES else s.value
            ours[(s.name, tuple(sorted(labels.items())))] = value
    return ours


def compare_with_vllm(reader) -> int:
    """Assert the Redis view has every vLLM sample with the same value, and no family vLLM lacks;
    return how many samples were compared."""
    ours = exposition(reader)
    theirs = {}
    for fam in vllm_families().values():
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            value = 1.0 if fam.name in TIMESTAMP_GAUGES else s.value
            theirs[(s.name, tuple(sorted(s.labels.items())))] = value
    for key, value in theirs.items():
        assert key in ours, f"missing sample {key}"
        assert ours[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
    extra = {name for name, _ in ours} - {name for name, _ in theirs}
    assert not extra, f"the Redis view shows samples vLLM does not: {sorted(extra)}"
    return len(theirs)


GAUGE_ORDER_S = 0.01  # steps this far apart: more than a loaded machine's flush round trip


def test_same_stats_give_the_same_samples_as_vllm(setup, two_api_servers, config, fake_client):
    cfg, theirs, full = setup
    servers = two_api_servers(cfg)
    reader = StatsReader(config, catalog_for(cfg), client=fake_client())
    checkpoints = 0
    for i, (engine, sched, it) in enumerate(steps(cfg)):
        theirs.record(sched, it, engine_idx=engine)
        servers[i % 3 % 2][1].record(sched, it, engine_idx=engine)  # two API servers, uneven split
        # A gauge two writers set is ordered by the server's clock, each writer's anchored within
        # its last flush's round trip (docs/key-schema.md): steps microseconds apart, as this loop
        # makes them, would not be ordered; vLLM's engine steps are milliseconds apart.
        time.sleep(GAUGE_ORDER_S)
        if i % 23 == 22:  # compare mid-run too, so gauges are checked at many different values
            for w, _ in servers:
                assert w.flush()
            assert compare_with_vllm(reader) > 300
            checkpoints += 1
    for _, recording in servers:
        recording.recorder.record_admission_rejection("max_num_queued_reqs")
    theirs.record_admission_rejection("max_num_queued_reqs")
    theirs.record_admission_rejection("max_num_queued_reqs")
    for w, _ in servers:
        assert w.flush()
    compared = compare_with_vllm(reader)
    assert compared > (700 if full else 500)
    assert checkpoints >= 4


def kv_connectors():
    """Every KV connector vLLM registers, and a MultiConnector of two of them."""
    # MultiConnector needs its list of connectors: given below.
    out = [(name, {}) for name in sorted(KVConnectorFactory._registry) if name != "MultiConnector"]
    out.append(
        (
            "MultiConnector",
            {
                "connectors": [
                    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"},
                    {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                ]
            },
        )
    )
    return out


@pytest.mark.parametrize(
    ("connector", "extra"), kv_connectors(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_kv_connector_family_lands_in_redis_as_vllm_defines_it(connector, extra, two_api_servers):
    cfg = vllm_config(kv_connector=connector, extra_config=extra)
    try:
        PrometheusStatLogger(cfg, ENGINES)
    except (ImportError, AssertionError, AttributeError, ValueError, TypeError) as exc:
        pytest.skip(f"vLLM's own logger cannot build {connector} here: {type(exc).__name__}: {exc}")
    (writer, recording), _ = two_api_servers(cfg)
    assert recording.own_metrics.kv_connector is not None
    assert_same_definitions(writer.catalog)


def test_a_connector_that_rejects_its_stats_never_raises_into_vllm(
    two_api_servers, caplog, config, fake_client
):
    cfg = vllm_config(kv_connector="OffloadingConnector")
    (writer, recording), _ = two_api_servers(cfg)
    bad = SchedulerStats(kv_connector_stats={"types": {}, "data": {"vllm:unknown": {(): 1}}})
    recording.record(bad, None, engine_idx=0)
    recording.record(bad, None, engine_idx=0)
    assert sum("KV connector" in r.getMessage() for r in caplog.records) == 1  # logged once
    good = OffloadingConnectorStats()
    good.increase_counter("vllm:kv_offload_load_bytes", 5)
    recording.record(SchedulerStats(kv_connector_stats=good.data), None, engine_idx=1)
    assert writer.flush()
    fams, _ = scrape(StatsReader(config, catalog_for(cfg), client=fake_client()))
    loaded = {s.labels["engine"]: s.value for s in fams["vllm:kv_offload_load_bytes"].samples}
    assert loaded == {"1": 5.0}  # the next stats still land


def test_bucket_families_unknown_here_keep_their_defaults_and_never_stop_vllm(caplog):
    cfg = vllm_config()
    buckets = {"request_latency": [1.0, 2.0], "from_the_future": [1.0]}
    cfg.observability_config.custom_histogram_buckets = buckets
    cat = catalog_for(cfg)
    assert cat["vllm:e2e_request_latency_seconds"].buckets == (1.0, 2.0)
    assert any("from_the_future" in r.getMessage() for r in caplog.records)
