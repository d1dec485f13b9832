"""The ``vllm:*`` metric catalogue: the names, help texts, labels, kinds and buckets of vLLM's
``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py), so dashboards work unchanged. Checked
against vLLM 0.32 by tests/integrations/vllm/test_vllm_conformance.py.

Every series also carries ``engine`` (added by redis_stats) and ``model_name``. The families vLLM
builds through classes it is handed (spec decoding, MFU estimates, KV/EC connectors) are not
listed here: the plugin lets vLLM's own code define them (``prom.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis_stats.catalog import Catalog

__all__ = [
    "ADMISSION_REASONS",
    "BUCKET_FAMILIES",
    "CACHE_HIT_SOURCES",
    "FINISH_REASONS",
    "ITERATION_TOKEN_BUCKETS",
    "ITL_BUCKETS",
    "KV_CACHE_RESIDENCY_BUCKETS",
    "PROMPT_TOKEN_SOURCES",
    "REQUEST_LATENCY_BUCKETS",
    "SLEEP_STATES",
    "TTFT_BUCKETS",
    "WAITING_REASONS",
    "WATERMARK_STATUSES",
    "build_1_2_5_buckets",
    "vllm_catalog",
]

MODEL = "model_name"

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_PARAM_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
KV_CACHE_RESIDENCY_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600,
    1200, 1800,
)  # fmt: skip
# vLLM's bucket families (vllm/v1/metrics/buckets.py): the keys of its
# ``--custom-histogram-buckets`` (ObservabilityConfig.custom_histogram_buckets).
BUCKET_FAMILIES = (
    "request_latency",
    "time_to_first_token",
    "inter_token_latency",
    "iteration_tokens",
    "request_params_n",
    "request_num_preemptions",
    "request_tokens",
    "kv_cache_residency",
)
WATERMARK_STATUSES = ("watermarked", "skipped", "not_watermarked")

# vLLM's FinishReason values as they appear in the finished_reason label.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
WAITING_REASONS = ("capacity", "deferred")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to *max_value* inclusive, as vLLM's ``build_1_2_5_buckets``."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out) or (1,)
            out.append(value)
        exponent += 1


def vllm_catalog(
    max_model_len: int = 8192,
    cache_config_labels: tuple[str, ...] | None = None,
    bucket_overrides: Mapping[str, Sequence[float]] | None = None,
) -> Catalog:
    """The vLLM catalogue; token-count buckets follow *max_model_len* as in vLLM.

    *cache_config_labels* are the keys of ``CacheConfig.metrics_info()`` (they vary by vLLM
    version), used for ``vllm:cache_config_info``; None (a reader's catalogue, which cannot know
    them) leaves that metric out, so a reader shows it as the writers stored it (with the labels
    of their vLLM) instead of warning, on every read, that its own definition differs.
    *bucket_overrides* is vLLM's ``custom_histogram_buckets`` (bucket family -> bounds,
    :data:`BUCKET_FAMILIES`): a family given there replaces its defaults, as in vLLM.
    """
    overrides = dict(bucket_overrides or {})
    unknown = sorted(set(overrides) - set(BUCKET_FAMILIES))
    if unknown:
        raise ValueError(
            f"custom histogram buckets for unknown families {unknown}; vLLM's families are "
            f"{list(BUCKET_FAMILIES)}"
        )

    def buckets(family: str, default: Sequence[float]) -> tuple[float, ...]:
        return tuple(overrides.get(family) or default)

    tokens = buckets("request_tokens", build_1_2_5_buckets(max_model_len))
    ttft_buckets = buckets("time_to_first_token", TTFT_BUCKETS)
    itl_buckets = buckets("inter_token_latency", ITL_BUCKETS)
    latency_buckets = buckets("request_latency", REQUEST_LATENCY_BUCKETS)
    cat = Catalog()
    m = (MODEL,)
    # Scheduler state: one value per engine step; the newest write wins across API servers.
    cat.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", m)
    cat.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", m)
    cat.gauge(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
        "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
        "status). Sum of all reasons equals vllm:num_requests_waiting.",
        (MODEL, "reason"),
    )
    cat.gauge(
        "vllm:num_requests_kv_fetch_by_stage",
        "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs "
        "an async KV load that has not started; 'in_progress' = load started and not yet reported "
        "finished; 'completed_waiting' = load finished, request not running yet.",
        (MODEL, "stage"),
    )
    cat.gauge(
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
        "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        (MODEL, "sleep_state"),
    )
    cat.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m)
    cat.gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        ("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
        mode="max",  # the value is a timestamp (set_to_current_time): the newest wins
    )
    if cache_config_labels is not None:
        cat.gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            tuple(label for label in cache_config_labels if label != "engine"),
        )
    cat.counter(
        "vllm:corrupted_requests",
        "Corrupted requests, in terms of total number of requests with NaNs in logits.",
        m,
    )
    # Prefix and multi-modal caches.
    cat.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", m)
    cat.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", m)
    cat.counter(
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in terms of "
        "number of queried tokens.",
        m,
    )
    cat.counter(
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms of "
        "number of cached tokens.",
        m,
    )
    cat.counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", m)
    cat.counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", m)
    # Tokens and requests.
    cat.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", m)
    cat.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", m)
    cat.counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", (MODEL, "source"))
    cat.counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", m)
    cat.counter(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
        "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
        "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
        "vllm:external_prefix_cache_hits.",
        (MODEL, "source"),
    )
    cat.counter("vllm:generation_tokens", "Number of generation tokens processed.", m)
    cat.counter(
        "vllm:request_success", "Count of successfully processed requests.", (MODEL, "finished_reason")
    )
    cat.counter(
        "vllm:admission_rejections",
        "Number of admission attempts rejected by a queue limit, by reason.",
        (MODEL, "reason"),
    )
    # Speculative decoding.
    cat.counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", m)
    cat.counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", m)
    cat.counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", m)
    cat.counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        (MODEL, "position"),
    )
    # Histograms of counts.
    cat.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens, m)
    cat.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", tokens, m)
    cat.histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        buckets("iteration_tokens", ITERATION_TOKEN_BUCKETS),
        m,
    )
    cat.histogram(
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        tokens,
        m,
    )
    cat.histogram(
        "vllm:request_params_n",
        "Histogram of the n request parameter.",
        buckets("request_params_n", N_PARAM_BUCKETS),
        m,
    )
    cat.histogram(
        "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens, m
    )
    # Histograms of times.
    cat.histogram(
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_buckets, m
    )
    cat.histogram(
        "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_buckets, m
    )
    cat.histogram(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        itl_buckets,
        m,
    )
    for name, phase in (
        ("vllm:e2e_request_latency_seconds", None),
        ("vllm:request_queue_time_seconds", "WAITING"),
        ("vllm:request_inference_time_seconds", "RUNNING"),
        ("vllm:request_prefill_time_seconds", "PREFILL"),
        ("vllm:request_decode_time_seconds", "DECODE"),
    ):
        help_text = (
            "Histogram of e2e request latency in seconds."
            if phase is None
            else f"Histogram of time spent in {phase} phase for request."
        )
        cat.histogram(name, help_text, latency_buckets, m)
    cat.histogram(
        "vllm:request_num_preemptions",
        "Histogram of the number of times a request was preempted.",
        buckets("request_num_preemptions", REQUEST_NUM_PREEMPTIONS_BUCKETS),
        m,
    )
    cat.histogram(
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        tokens,
        m,
    )
    # Only with a watermark_config in vLLM (the recorder binds them only then).
    cat.counter(
        "vllm:watermark_requests",
        "Finished requests by watermark status (only with watermark_config).",
        (MODEL, "status"),
    )
    # KV-cache residency, only with --kv-cache-metrics in vLLM (sampled evictions).
    residency = buckets("kv_cache_residency", KV_CACHE_RESIDENCY_BUCKETS)
    sampled = "Sampled metrics (controlled by --kv-cache-metrics-sample)."
    cat.histogram(
        "vllm:kv_block_lifetime_seconds",
        f"Histogram of KV cache block lifetime from allocation to eviction. {sampled}",
        residency,
        m,
    )
    cat.histogram(
        "vllm:kv_block_idle_before_evict_seconds",
        f"Histogram of idle time before KV cache block eviction. {sampled}",
        residency,
        m,
    )
    cat.histogram(
        "vllm:kv_block_reuse_gap_seconds",
        "Histogram of time gaps between consecutive KV cache block accesses. Only the most recent "
        f"accesses are recorded (ring buffer). {sampled}",
        residency,
        m,
    )
    return cat
