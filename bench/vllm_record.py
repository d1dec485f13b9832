"""Cost of recording one realistic vLLM engine-step batch (target: no slower than vLLM itself).

With vLLM installed (`make test-vllm` venv), the same SchedulerStats/IterationStats objects go
through vLLM's own PrometheusStatLogger.record and through redis_stats' VllmRecorder.record.
Without vLLM, the baseline is the equivalent prometheus_client calls on vLLM's metric set.

A batch: 32 running requests each producing one token (32 inter-token latencies), one new request
(one TTFT, its prompt), and every 8th step one finished request.

Usage: python bench/vllm_record.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace as NS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog

OURS = "redis_stats plugin record (VllmRecording)"


def batches(n: int = 8) -> list[tuple[object, object]]:
    """*n* engine-step batches (scheduler stats, iteration stats), as vLLM objects when available."""
    try:
        from vllm.v1.engine import FinishReason
        from vllm.v1.metrics.stats import (
            FinishedRequestStats,
            IterationStats,
            PrefixCacheStats,
            SchedulerStats,
        )

        def make_it():
            return IterationStats()

        def make_sched(**kw):
            return SchedulerStats(
                prefix_cache_stats=PrefixCacheStats(requests=1, queries=600, hits=200), **kw
            )

        def finished():
            return FinishedRequestStats(
                finish_reason=FinishReason.STOP,
                e2e_latency=3.2,
                num_prompt_tokens=600,
                num_generation_tokens=200,
                max_tokens_param=256,
                queued_time=0.1,
                prefill_time=0.2,
                inference_time=3.0,
                decode_time=2.8,
                mean_time_per_output_token=0.014,
                num_cached_tokens=200,
            )
    except ImportError:

        def make_it():
            return NS(
                num_generation_tokens=0,
                num_preempted_reqs=0,
                finished_requests=[],
                num_corrupted_reqs=0,
                max_num_generation_tokens_iter=[],
                n_params_iter=[],
                time_to_first_tokens_iter=[],
                inter_token_latencies_iter=[],
                prompt_token_stats=NS(
                    computed=0, local_cache_hit=0, external_kv_transfer=0, cached_tokens=0, total=0
                ),
            )

        def make_sched(**kw):
            return NS(
                num_skipped_waiting_reqs=0,
                num_kv_fetch_reqs_by_stage={},
                connector_prefix_cache_stats=None,
                spec_decoding_stats=None,
                prefix_cache_stats=NS(queries=600, hits=200),
                **kw,
            )

        def finished():
            return NS(
                finish_reason="stop",
                e2e_latency=3.2,
                num_prompt_tokens=600,
                num_generation_tokens=200,
                max_tokens_param=256,
                queued_time=0.1,
                prefill_time=0.2,
                inference_time=3.0,
                decode_time=2.8,
                mean_time_per_output_token=0.014,
                num_cached_tokens=200,
                num_preemptions=0,
            )

    out = []
    for step in range(n):
        it = make_it()
        it.num_generation_tokens = 32
        it.prompt_token_stats.computed = 400
        it.prompt_token_stats.local_cache_hit = 200
        it.prompt_token_stats.cached_tokens = 200
        it.prompt_token_stats.total = 600
        it.time_to_first_tokens_iter = [0.12]
        it.inter_token_latencies_iter = [0.014] * 32
        it.n_params_iter = [1]
        it.max_num_generation_tokens_iter = [256]
        if step % 8 == 0:
            it.finished_requests = [finished()]
        out.append((make_sched(num_running_reqs=32, num_waiting_reqs=3, kv_cache_usage=0.41), it))
    return out


def vllm_config() -> NS:
    """A VllmConfig as far as the stat loggers read it: vLLM's defaults, no speculative decoding."""
    return NS(
        observability_config=NS(
            show_hidden_metrics=False,
            kv_cache_metrics=False,
            custom_histogram_buckets=None,
            enable_mfu_metrics=False,
            cudagraph_metrics=False,
        ),
        model_config=NS(served_model_name="m", max_model_len=8192, is_diffusion=False),
        speculative_config=None,
        kv_transfer_config=None,
        ec_transfer_config=None,
        lora_config=None,
        watermark_config=None,
        parallel_config=NS(),
        cache_config=NS(),
        scheduler_config=NS(),
    )


def vllm_baseline():
    """vLLM's own PrometheusStatLogger.record, or None without vLLM."""
    try:
        from vllm.v1.metrics.loggers import PrometheusStatLogger
    except ImportError:
        return None
    return PrometheusStatLogger(vllm_config(), [0]).record


def ours(writer_config: StatsConfig):
    """(record, writer): the plugin's per-step path (VllmRecording: the recorder and the parts vLLM
    builds through handed classes) with vLLM, the recorder alone without."""
    try:
        from redis_stats.integrations.vllm.plugin import VllmRecording, catalog_for
    except ImportError:
        writer = StatsWriter(writer_config, vllm_catalog(), engines=[0], start=False)
        return VllmRecorder(writer, "m", [0]).record, writer
    cfg = vllm_config()
    writer = StatsWriter(writer_config, catalog_for(cfg), engines=[0], start=False)
    return VllmRecording(cfg, writer, [0]).record, writer


def prometheus_client_baseline():
    """The same updates as direct prometheus_client calls on vLLM's metric set (no vLLM)."""
    reg = CollectorRegistry()
    cat = vllm_catalog()
    made = {}
    for spec in cat:
        labels = ["engine", *spec.labels]
        kind = {"counter": Counter, "gauge": Gauge}.get(spec.kind)
        made[spec.name] = (
            Histogram(spec.name, spec.help, labels, buckets=spec.buckets, registry=reg)
            if spec.kind == "histogram"
            else kind(spec.name, spec.help, labels, registry=reg)
        )

    def child(name, *extra):
        return made[name].labels("0", "m", *extra)

    running, waiting = child("vllm:num_requests_running"), child("vllm:num_requests_waiting")
    kv, pq, ph = (
        child("vllm:kv_cache_usage_perc"),
        child("vllm:prefix_cache_queries"),
        child("vllm:prefix_cache_hits"),
    )
    prompt, gen = child("vllm:prompt_tokens"), child("vllm:generation_tokens")
    it_tokens, ttft = child("vllm:iteration_tokens_total"), child("vllm:time_to_first_token_seconds")
    itl, e2e = child("vllm:inter_token_latency_seconds"), child("vllm:e2e_request_latency_seconds")
    success = child("vllm:request_success", "stop")
    by_source = [
        child("vllm:prompt_tokens_by_source", s)
        for s in ("local_compute", "local_cache_hit", "external_kv_transfer")
    ]
    phases = [
        child(n)
        for n in (
            "vllm:request_queue_time_seconds",
            "vllm:request_prefill_time_seconds",
            "vllm:request_inference_time_seconds",
            "vllm:request_decode_time_seconds",
            "vllm:request_prompt_tokens",
            "vllm:request_generation_tokens",
            "vllm:request_time_per_output_token_seconds",
            "vllm:request_params_max_tokens",
            "vllm:request_num_preemptions",
            "vllm:request_prefill_kv_computed_tokens",
        )
    ]

    def record(sched, it, engine_idx=0):
        running.set(sched.num_running_reqs)
        waiting.set(sched.num_waiting_reqs)
        kv.set(sched.kv_cache_usage)
        pq.inc(sched.prefix_cache_stats.queries)
        ph.inc(sched.prefix_cache_stats.hits)
        prompt.inc(it.prompt_token_stats.total)
        for c, v in zip(by_source, (400, 200, 0)):
            c.inc(v)
        gen.inc(it.num_generation_tokens)
        it_tokens.observe(it.prompt_token_stats.computed + it.num_generation_tokens)
        for v in it.time_to_first_tokens_iter:
            ttft.observe(v)
        for v in it.inter_token_latencies_iter:
            itl.observe(v)
        for f in it.finished_requests:
            success.inc()
            e2e.observe(f.e2e_latency)
            for h in phases:
                h.observe(1.0)

    return record


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    n = 200 if parser.parse_args().quick else 3000
    steps = batches()
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace="bench")
    ours_record, writer = ours(cfg)  # memory only: no flusher
    baseline = vllm_baseline()
    name = "vLLM PrometheusStatLogger.record"
    if baseline is None:
        baseline, name = prometheus_client_baseline(), "prometheus_client calls (vLLM not installed)"

    def run(record):
        for sched, it in steps:
            record(sched, it, engine_idx=0)

    per_batch = {}
    for label, record in ((OURS, ours_record), (name, baseline)):
        best = min(timeit.repeat(lambda r=record: run(r), number=n, repeat=5))
        per_batch[label] = best / (n * len(steps)) * 1e6
    ours_us, base_us = per_batch[OURS], per_batch[name]
    print("record of one engine-step batch (32 running, 1 new, 1/8 finished), microseconds, best of 5")
    for label, us in per_batch.items():
        print(f"    {label:<48}{us:>8.1f}")
    print(f"    ratio redis_stats / baseline: {ours_us / base_us:.2f}  (target <= 1.0)")
    writer._closed = True


if __name__ == "__main__":
    main()
