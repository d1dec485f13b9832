"""VllmRecorder: vLLM's stats objects -> writer children, without importing vLLM.

It reads SchedulerStats, IterationStats, FinishedRequestStats and the cache/spec-decoding stats by
attribute (``getattr`` with defaults), so the same code follows vLLM versions that add or rename
fields; what a version does not send is simply not recorded. Children are bound once per engine,
so ``record`` (called on vLLM's event loop for every engine-step batch) only adds to memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from redis_stats.integrations.vllm.catalog import (
    ADMISSION_REASONS,
    CACHE_HIT_SOURCES,
    FINISH_REASONS,
    PROMPT_TOKEN_SOURCES,
    SLEEP_STATES,
    WAITING_REASONS,
    WATERMARK_STATUSES,
)
from redis_stats.writer import StatsWriter

__all__ = ["KV_FETCH_STAGES", "VllmFeatures", "VllmRecorder"]

# vLLM's KV_FETCH_STAGES (vllm/v1/metrics/stats.py): set every step on a KV consumer.
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")


@dataclass(frozen=True)
class VllmFeatures:
    """Which optional families vLLM's PrometheusStatLogger exposes for a configuration.

    The plugin reads them from the VllmConfig (``from_vllm_config`` in plugin.py); the defaults
    are the families a recorder had before these switches (spec decoding and corrupted requests
    on), so that vLLM-free callers keep what they had.
    """

    spec_decoding: bool = True  # speculative_config set (and not a diffusion model)
    num_spec_tokens: int = 0  # positions of spec_decode_num_accepted_tokens_per_pos, bound at 0
    corrupted: bool = True  # VLLM_COMPUTE_NANS_IN_LOGITS
    kv_consumer: bool = False  # kv_transfer_config.is_kv_consumer: num_requests_kv_fetch_by_stage
    watermark: bool = False  # watermark_config set: vllm:watermark_requests
    kv_cache_metrics: bool = False  # --kv-cache-metrics: the vllm:kv_block_* residency histograms


def _label(value: Any) -> str:
    """A label value taken from a step's data (a finish or rejection reason) as text the store
    takes: a lone surrogate, which UTF-8 cannot carry, becomes ``?`` (as ``errors="replace"``
    decodes). ``labels()`` refuses such a value with CatalogError, and :meth:`VllmRecorder.record`
    runs in vLLM's stat loop, which must never see an exception of ours."""
    text = str(value)
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def _g(obj: Any, name: str, default: Any = 0) -> Any:
    value = getattr(obj, name, default)
    return default if value is None else value


class _EngineSeries:
    """The bound children of one engine (the hot path touches only these attributes)."""

    def __init__(self, writer: StatsWriter, model: str, engine: int, features: VllmFeatures) -> None:
        def bind(name: str, **labels: str) -> Any:
            return writer.metric(name).labels(engine, model_name=model, **labels)

        self._bind = bind
        self.engine = engine
        self.running = bind("vllm:num_requests_running")
        self.waiting = bind("vllm:num_requests_waiting")
        self.kv_usage = bind("vllm:kv_cache_usage_perc")
        self.prefix_queries = bind("vllm:prefix_cache_queries")
        self.prefix_hits = bind("vllm:prefix_cache_hits")
        self.ext_queries = bind("vllm:external_prefix_cache_queries")
        self.ext_hits = bind("vllm:external_prefix_cache_hits")
        self.mm_queries = bind("vllm:mm_cache_queries")
        self.mm_hits = bind("vllm:mm_cache_hits")
        self.corrupted = bind("vllm:corrupted_requests") if features.corrupted else None
        self.preemptions = bind("vllm:num_preemptions")
        self.prompt_tokens = bind("vllm:prompt_tokens")
        self.prompt_cached = bind("vllm:prompt_tokens_cached")
        self.generation_tokens = bind("vllm:generation_tokens")
        self.iteration_tokens = bind("vllm:iteration_tokens_total")
        self.max_gen_tokens = bind("vllm:request_max_num_generation_tokens")
        self.n_param = bind("vllm:request_params_n")
        self.ttft = bind("vllm:time_to_first_token_seconds")
        self.itl = bind("vllm:inter_token_latency_seconds")
        self.e2e = bind("vllm:e2e_request_latency_seconds")
        self.queue_time = bind("vllm:request_queue_time_seconds")
        self.prefill_time = bind("vllm:request_prefill_time_seconds")
        self.inference_time = bind("vllm:request_inference_time_seconds")
        self.decode_time = bind("vllm:request_decode_time_seconds")
        self.req_preemptions = bind("vllm:request_num_preemptions")
        self.tpot = bind("vllm:request_time_per_output_token_seconds")
        self.req_prompt_tokens = bind("vllm:request_prompt_tokens")
        self.req_gen_tokens = bind("vllm:request_generation_tokens")
        self.req_max_tokens = bind("vllm:request_params_max_tokens")
        self.req_kv_computed = bind("vllm:request_prefill_kv_computed_tokens")
        self._bind_features(features)
        self._by_label: dict[tuple[str, str], Any] = {}
        self._bind_labelled(features)

    def _bind_features(self, features: VllmFeatures) -> None:
        """The series vLLM has only with a feature on (None, or unset, without it)."""
        bind = self._bind
        self.spec_decoding = features.spec_decoding
        if features.spec_decoding:
            self.drafts = bind("vllm:spec_decode_num_drafts")
            self.draft_tokens = bind("vllm:spec_decode_num_draft_tokens")
            self.accepted_tokens = bind("vllm:spec_decode_num_accepted_tokens")
        self.residency = (
            (
                bind("vllm:kv_block_lifetime_seconds"),
                bind("vllm:kv_block_idle_before_evict_seconds"),
                bind("vllm:kv_block_reuse_gap_seconds"),
            )
            if features.kv_cache_metrics
            else None
        )
        self.kv_fetch = (
            [(stage, bind("vllm:num_requests_kv_fetch_by_stage", stage=stage)) for stage in KV_FETCH_STAGES]
            if features.kv_consumer
            else None
        )
        self.watermark = (
            [bind("vllm:watermark_requests", status=status) for status in WATERMARK_STATUSES]
            if features.watermark
            else None
        )

    def _bind_labelled(self, features: VllmFeatures) -> None:
        # As vLLM: labelled counters exist (at 0) for every known label value from the start.
        for reason in FINISH_REASONS:
            self.labelled("vllm:request_success", "finished_reason", reason)
        for source in PROMPT_TOKEN_SOURCES:
            self.labelled("vllm:prompt_tokens_by_source", "source", source)
        for source in CACHE_HIT_SOURCES:
            self.labelled("vllm:prompt_tokens_cached_by_source", "source", source)
        if features.spec_decoding:
            for pos in range(features.num_spec_tokens):
                self.labelled("vllm:spec_decode_num_accepted_tokens_per_pos", "position", str(pos))

    def labelled(self, metric: str, label: str, value: str) -> Any:
        """A child with one extra label (finished_reason, source, position, reason, ...)."""
        key = (metric, value)
        child = self._by_label.get(key)
        if child is None:
            child = self._by_label[key] = self._bind(metric, **{label: value})
        return child


class VllmRecorder:
    """Records vLLM's per-step stats for the engines one API-server process manages."""

    def __init__(
        self,
        writer: StatsWriter,
        model_name: str,
        engine_indexes: list[int],
        *,
        max_lora: int | None = None,
        features: VllmFeatures | None = None,
    ) -> None:
        self.writer = writer
        self.model_name = model_name
        self.max_lora = max_lora
        self.features = features or VllmFeatures()
        self.engines = {e: _EngineSeries(writer, model_name, e, self.features) for e in engine_indexes}
        self.first_engine = min(engine_indexes) if engine_indexes else 0
        for reason in ADMISSION_REASONS:
            self._admission(reason)
        self.record_sleep_state()  # as vLLM: awake until told otherwise

    def _engine(self, engine_idx: int) -> _EngineSeries:
        series = self.engines.get(engine_idx)
        if series is None:  # an engine added later (elastic EP): bind it on first sight
            series = self.engines[engine_idx] = _EngineSeries(
                self.writer, self.model_name, engine_idx, self.features
            )
        return series

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Map one engine-step batch of stats into the writer (memory only)."""
        s = self._engine(engine_idx)
        if scheduler_stats is not None:
            self._scheduler(s, scheduler_stats)
        if mm_cache_stats is not None:
            s.mm_queries.inc(_g(mm_cache_stats, "queries"))
            s.mm_hits.inc(_g(mm_cache_stats, "hits"))
        if iteration_stats is not None:
            self._iteration(s, iteration_stats)

    def _scheduler(self, s: _EngineSeries, st: Any) -> None:
        waiting, deferred = _g(st, "num_waiting_reqs"), _g(st, "num_skipped_waiting_reqs")
        s.running.set(_g(st, "num_running_reqs"))
        s.waiting.set(waiting + deferred)
        # WAITING_REASONS is ("capacity", "deferred"): waiting for room, and skipped this step.
        for reason, count in zip(WAITING_REASONS, (waiting, deferred)):
            s.labelled("vllm:num_requests_waiting_by_reason", "reason", reason).set(count)
        if s.kv_fetch is not None:  # as vLLM: every stage, every step, on a KV consumer only
            by_stage = _g(st, "num_kv_fetch_reqs_by_stage", {})
            for stage, gauge in s.kv_fetch:
                gauge.set(by_stage.get(stage, 0))
        s.kv_usage.set(_g(st, "kv_cache_usage"))
        _prefix_caches(s, st)
        if s.residency is not None:
            _evictions(s.residency, _g(st, "kv_cache_eviction_events", ()))
        spec = _g(st, "spec_decoding_stats", None)
        if spec is not None and s.spec_decoding:
            _spec_decoding(s, spec)
        if self.max_lora is not None:
            self._lora(s, st)

    def _lora(self, s: _EngineSeries, st: Any) -> None:
        running = ",".join(_g(st, "running_lora_adapters", {}).keys())
        waiting_lora = ",".join(_g(st, "waiting_lora_adapters", {}).keys())
        self.writer.metric("vllm:lora_requests_info").labels(
            s.engine,
            max_lora=str(self.max_lora),
            waiting_lora_adapters=waiting_lora,
            running_lora_adapters=running,
        ).set(time.time())

    def _iteration(self, s: _EngineSeries, it: Any) -> None:
        prompt, generation = _g(it, "num_prompt_tokens"), _g(it, "num_generation_tokens")
        corrupted = _g(it, "num_corrupted_reqs")
        if corrupted and s.corrupted is not None:
            s.corrupted.inc(corrupted)
        if s.watermark is not None:
            marked, skipped, unmarked = s.watermark
            marked.inc(_g(it, "num_watermarked_reqs"))
            skipped.inc(_g(it, "num_watermark_skipped_reqs"))
            unmarked.inc(_g(it, "num_not_watermarked_reqs"))
        s.preemptions.inc(_g(it, "num_preempted_reqs"))
        s.prompt_tokens.inc(prompt)
        computed = _prompt_sources(s, _g(it, "prompt_token_stats", None), prompt)
        s.generation_tokens.inc(generation)
        s.iteration_tokens.observe(computed + generation)
        for v in _g(it, "max_num_generation_tokens_iter", ()):
            s.max_gen_tokens.observe(v)
        for v in _g(it, "n_params_iter", ()):
            s.n_param.observe(v)
        for v in _g(it, "time_to_first_tokens_iter", ()):
            s.ttft.observe(v)
        for v in _g(it, "inter_token_latencies_iter", ()):
            s.itl.observe(v)
        for fin in _g(it, "finished_requests", ()):
            self._finished(s, fin)

    def _finished(self, s: _EngineSeries, fin: Any) -> None:
        reason = _label(_g(fin, "finish_reason", "stop")).lower()
        s.labelled("vllm:request_success", "finished_reason", reason).inc()
        s.e2e.observe(_g(fin, "e2e_latency"))
        s.queue_time.observe(_g(fin, "queued_time"))
        s.prefill_time.observe(_g(fin, "prefill_time"))
        s.inference_time.observe(_g(fin, "inference_time"))
        s.decode_time.observe(_g(fin, "decode_time"))
        s.req_preemptions.observe(_g(fin, "num_preemptions"))
        n_prompt = _g(fin, "num_prompt_tokens")
        s.req_kv_computed.observe(n_prompt - max(_g(fin, "num_cached_tokens"), 0))
        s.req_prompt_tokens.observe(n_prompt)
        s.req_gen_tokens.observe(_g(fin, "num_generation_tokens"))
        s.tpot.observe(_g(fin, "mean_time_per_output_token"))
        max_tokens = _g(fin, "max_tokens_param", None)
        if max_tokens:
            s.req_max_tokens.observe(max_tokens)

    def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
        """vLLM's sleep/wake: awake=1 while awake; level 1 offloads weights, level 2 discards all."""
        state = {
            "awake": 0 if sleep else 1,
            "weights_offloaded": 1 if sleep and level == 1 else 0,
            "discard_all": 1 if sleep and level == 2 else 0,
        }
        for s in self.engines.values():
            for name in SLEEP_STATES:
                s.labelled("vllm:engine_sleep_state", "sleep_state", name).set(state[name])

    def record_admission_rejection(self, reason: str) -> None:
        """Count a request rejected at admission by a queue limit.

        vLLM's counter has no engine label (the front end rejects before choosing an engine); here
        it is recorded under the first engine this process manages.
        """
        self._admission(_label(reason)).inc()

    def _admission(self, reason: str) -> Any:
        return self._engine(self.first_engine).labelled("vllm:admission_rejections", "reason", reason)

    def record_cache_config(self, info: dict[str, Any]) -> None:
        """``vllm:cache_config_info``: a gauge at 1 whose labels are the cache config."""
        spec = self.writer.catalog.get("vllm:cache_config_info")
        if spec is None:
            return
        labels = {k: str(info.get(k, "")) for k in spec.labels}
        for e in self.engines:
            self.writer.metric("vllm:cache_config_info").labels(e, **labels).set(1)


def _prefix_caches(s: _EngineSeries, st: Any) -> None:
    """The device's and the KV connector's prefix-cache queries and hits of one step."""
    prefix = _g(st, "prefix_cache_stats", None)
    if prefix is not None:
        hits = _g(prefix, "hits")
        s.prefix_queries.inc(_g(prefix, "queries"))
        s.prefix_hits.inc(hits)
        s.labelled("vllm:prompt_tokens_cached_by_source", "source", "device").inc(hits)
    external = _g(st, "connector_prefix_cache_stats", None)
    if external is not None:
        s.ext_queries.inc(_g(external, "queries"))
        s.ext_hits.inc(_g(external, "hits"))
        for tier, n in _g(external, "hits_by_source", {}).items():
            tier_name = getattr(tier, "value", tier)
            s.labelled("vllm:prompt_tokens_cached_by_source", "source", str(tier_name)).inc(n)


def _evictions(residency: tuple[Any, Any, Any], events: Any) -> None:
    """The sampled KV-block evictions of one step, into the residency histograms."""
    lifetime, idle, reuse = residency
    for event in events or ():
        lifetime.observe(_g(event, "lifetime_seconds"))
        idle.observe(_g(event, "idle_seconds"))
        for gap in _g(event, "reuse_gaps_seconds", ()):
            reuse.observe(gap)


def _spec_decoding(s: _EngineSeries, spec: Any) -> None:
    s.drafts.inc(_g(spec, "num_drafts"))
    s.draft_tokens.inc(_g(spec, "num_draft_tokens"))
    s.accepted_tokens.inc(_g(spec, "num_accepted_tokens"))
    for pos, n in enumerate(_g(spec, "num_accepted_tokens_per_pos", ())):
        s.labelled("vllm:spec_decode_num_accepted_tokens_per_pos", "position", str(pos)).inc(n)


def _prompt_sources(s: _EngineSeries, sources: Any, prompt: int) -> int:
    """A step's prompt tokens by source; the tokens computed (all of them for a vLLM without
    the breakdown)."""
    if sources is None:  # a vLLM without the breakdown: every prompt token was computed
        s.labelled("vllm:prompt_tokens_by_source", "source", "local_compute").inc(prompt)
        return prompt
    computed: int = _g(sources, "computed")
    for source, attr in (
        ("local_compute", "computed"),
        ("local_cache_hit", "local_cache_hit"),
        ("external_kv_transfer", "external_kv_transfer"),
    ):
        s.labelled("vllm:prompt_tokens_by_source", "source", source).inc(_g(sources, attr))
    s.prompt_cached.inc(_g(sources, "cached_tokens"))
    return computed
