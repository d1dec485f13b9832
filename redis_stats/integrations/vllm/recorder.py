"""VllmRecorder: vLLM's stats objects -> writer children, without importing vLLM.

It reads SchedulerStats, IterationStats, FinishedRequestStats and the cache/spec-decoding stats by
attribute (``getattr`` with defaults), so the same code follows vLLM versions that add or rename
fields; what a version does not send is simply not recorded. Children are bound once per engine,
so ``record`` (called on vLLM's event loop for every engine-step batch) only adds to memory.
"""

from __future__ import annotations

from typing import Any

from ...writer import StatsWriter
from .catalog import SLEEP_STATES

__all__ = ["VllmRecorder"]


def _g(obj: Any, name: str, default: Any = 0) -> Any:
    value = getattr(obj, name, default)
    return default if value is None else value


class _EngineSeries:
    """The bound children of one engine (the hot path touches only these attributes)."""

    def __init__(self, writer: StatsWriter, model: str, engine: int) -> None:
        def bind(name: str, **labels: str) -> Any:
            return writer.metric(name).labels(engine, model_name=model, **labels)

        self._bind = bind
        self.running = bind("vllm:num_requests_running")
        self.waiting = bind("vllm:num_requests_waiting")
        self.kv_usage = bind("vllm:kv_cache_usage_perc")
        self.prefix_queries = bind("vllm:prefix_cache_queries")
        self.prefix_hits = bind("vllm:prefix_cache_hits")
        self.ext_queries = bind("vllm:external_prefix_cache_queries")
        self.ext_hits = bind("vllm:external_prefix_cache_hits")
        self.mm_queries = bind("vllm:mm_cache_queries")
        self.mm_hits = bind("vllm:mm_cache_hits")
        self.corrupted = bind("vllm:corrupted_requests")
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
        self.prefill_token_time = bind("vllm:time_per_prefill_token_request_seconds")
        self.tpot = bind("vllm:request_time_per_output_token_seconds")
        self.req_prompt_tokens = bind("vllm:request_prompt_tokens")
        self.req_gen_tokens = bind("vllm:request_generation_tokens")
        self.req_max_tokens = bind("vllm:request_params_max_tokens")
        self.req_kv_computed = bind("vllm:request_prefill_kv_computed_tokens")
        self.drafts = bind("vllm:spec_decode_num_drafts")
        self.draft_tokens = bind("vllm:spec_decode_num_draft_tokens")
        self.accepted_tokens = bind("vllm:spec_decode_num_accepted_tokens")
        self._by_label: dict[tuple[str, str], Any] = {}

    def labelled(self, metric: str, label: str, value: str) -> Any:
        """A child with one extra label (finished_reason, source, position, reason, ...)."""
        key = (metric, value)
        child = self._by_label.get(key)
        if child is None:
            child = self._by_label[key] = self._bind(metric, **{label: value})
        return child


class VllmRecorder:
    """Records vLLM's per-step stats for the engines one API-server process manages."""

    def __init__(self, writer: StatsWriter, model_name: str, engine_indexes: list[int]) -> None:
        self.writer = writer
        self.model_name = model_name
        self.engines = {e: _EngineSeries(writer, model_name, e) for e in engine_indexes}

    def _engine(self, engine_idx: int) -> _EngineSeries:
        series = self.engines.get(engine_idx)
        if series is None:  # an engine added later (elastic EP): bind it on first sight
            series = self.engines[engine_idx] = _EngineSeries(self.writer, self.model_name, engine_idx)
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
        s.running.set(_g(st, "num_running_reqs"))
        s.waiting.set(_g(st, "num_waiting_reqs"))
        s.kv_usage.set(_g(st, "kv_cache_usage", _g(st, "gpu_cache_usage")))
        by_reason = _g(st, "num_waiting_reqs_by_reason", None)
        if by_reason:
            for reason, n in by_reason.items():
                s.labelled("vllm:num_requests_waiting_by_reason", "reason", str(reason)).set(n)
        prefix = _g(st, "prefix_cache_stats", None)
        if prefix is not None:
            s.prefix_queries.inc(_g(prefix, "queries"))
            s.prefix_hits.inc(_g(prefix, "hits"))
        external = _g(st, "connector_prefix_cache_stats", None)
        if external is not None:
            s.ext_queries.inc(_g(external, "queries"))
            s.ext_hits.inc(_g(external, "hits"))
        corrupted = _g(st, "num_corrupted_reqs")
        if corrupted:
            s.corrupted.inc(corrupted)
        spec = _g(st, "spec_decoding_stats", None)
        if spec is not None:
            s.drafts.inc(_g(spec, "num_drafts"))
            s.draft_tokens.inc(_g(spec, "num_draft_tokens"))
            s.accepted_tokens.inc(_g(spec, "num_accepted_tokens"))
            for pos, n in enumerate(_g(spec, "num_accepted_tokens_per_pos", ())):
                s.labelled("vllm:spec_decode_num_accepted_tokens_per_pos", "position", str(pos)).inc(n)

    def _iteration(self, s: _EngineSeries, it: Any) -> None:
        prompt, generation = _g(it, "num_prompt_tokens"), _g(it, "num_generation_tokens")
        s.preemptions.inc(_g(it, "num_preempted_reqs"))
        s.prompt_tokens.inc(prompt)
        s.generation_tokens.inc(generation)
        s.iteration_tokens.observe(prompt + generation)
        sources = _g(it, "prompt_token_stats", None)
        if sources is not None:
            for source, attr in (
                ("local_compute", "computed"),
                ("local_cache_hit", "local_cache_hit"),
                ("external_kv_transfer", "external_kv_transfer"),
            ):
                n = _g(sources, attr)
                if n:
                    s.labelled("vllm:prompt_tokens_by_source", "source", source).inc(n)
            cached = _g(sources, "cached_tokens")
            if cached:
                s.prompt_cached.inc(cached)
        for v in _g(it, "max_num_generation_tokens_iter", ()):
            s.max_gen_tokens.observe(v)
        for v in _g(it, "n_params_iter", ()):
            s.n_param.observe(v)
        for v in _g(it, "time_to_first_tokens_iter", ()):
            s.ttft.observe(v)
        for v in _g(it, "inter_token_latencies_iter", None) or _g(it, "time_per_output_tokens_iter", ()):
            s.itl.observe(v)
        for fin in _g(it, "finished_requests", ()):
            self._finished(s, fin)

    def _finished(self, s: _EngineSeries, fin: Any) -> None:
        reason = str(_g(fin, "finish_reason", "stop")).lower()
        s.labelled("vllm:request_success", "finished_reason", reason).inc()
        s.e2e.observe(_g(fin, "e2e_latency"))
        s.queue_time.observe(_g(fin, "queued_time"))
        prefill = _g(fin, "prefill_time")
        s.prefill_time.observe(prefill)
        s.inference_time.observe(_g(fin, "inference_time"))
        s.decode_time.observe(_g(fin, "decode_time"))
        n_prompt = _g(fin, "num_prompt_tokens")
        if n_prompt > 0:
            s.prefill_token_time.observe(prefill / n_prompt)
        s.req_prompt_tokens.observe(n_prompt)
        s.req_gen_tokens.observe(_g(fin, "num_generation_tokens"))
        tpot = _g(fin, "mean_time_per_output_token", None)
        if tpot is not None:
            s.tpot.observe(tpot)
        max_tokens = _g(fin, "max_tokens_param", None)
        if max_tokens:
            s.req_max_tokens.observe(max_tokens)
        cached = _g(fin, "num_cached_tokens", None)
        if cached is not None and n_prompt:
            s.req_kv_computed.observe(max(0, n_prompt - cached))

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

    def record_admission_rejection(self, reason: str, engine_idx: int = 0) -> None:
        """Count a request rejected at admission (e.g. the waiting queue is full)."""
        self._engine(engine_idx).labelled("vllm:admission_rejections", "reason", str(reason)).inc()

    def record_cache_config(self, info: dict[str, Any]) -> None:
        """``vllm:cache_config_info``: a gauge at 1 whose labels are the cache config."""
        spec = self.writer.catalog.get("vllm:cache_config_info")
        if spec is None:
            return
        labels = {k: str(info.get(k, "")) for k in spec.labels}
        for e in self.engines:
            self.writer.metric("vllm:cache_config_info").labels(e, **labels).set(1)
