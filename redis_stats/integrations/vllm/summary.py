"""The fleet figures routers and autoscalers ask for, in vLLM's names (``/snapshot``'s ``fleet.summary``),
and those the exporter keeps a history of for the live page's charts (``/history``).

Injected into the exporter (``Exporter(summary=VLLM_FLEET_SUMMARY, history=VLLM_PAGE_HISTORY)``) so
the core knows no vLLM name.
"""

from __future__ import annotations

from redis_stats.server.options import PER_ENGINE, FleetSummary, HistorySpec

__all__ = ["VLLM_FLEET_SUMMARY", "VLLM_PAGE_HISTORY"]

VLLM_FLEET_SUMMARY: FleetSummary = {
    "requests_running": ("sum", "vllm:num_requests_running"),
    "requests_waiting": ("sum", "vllm:num_requests_waiting"),
    "kv_cache_usage_mean": ("mean", "vllm:kv_cache_usage_perc"),
    "kv_cache_usage_max": ("max", "vllm:kv_cache_usage_perc"),
    "generation_tokens_per_second": ("rate", "vllm:generation_tokens"),
    "prompt_tokens_per_second": ("rate", "vllm:prompt_tokens"),
    "requests_finished_per_second": ("rate", "vllm:request_success"),
}

_TTFT, _ITL = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"

VLLM_PAGE_HISTORY: HistorySpec = {
    "generation_tokens_per_second": ("vllm:generation_tokens", "rate", "sum"),
    "prompt_tokens_per_second": ("vllm:prompt_tokens", "rate", "sum"),
    "kv_cache_usage_mean": ("vllm:kv_cache_usage_perc", "max", "mean"),
    "kv_cache_usage_max": ("vllm:kv_cache_usage_perc", "max", "max"),
    "requests_waiting": ("vllm:num_requests_waiting", "sum", "sum"),
    "requests_waiting_max": ("vllm:num_requests_waiting", "sum", "max"),
    "ttft_p99_worst": (_TTFT, "p99", "max"),
    "ttft_p99_median": (_TTFT, "p99", "median"),
    "itl_p99_worst": (_ITL, "p99", "max"),
    "itl_p99_median": (_ITL, "p99", "median"),
    "engine_requests_waiting": ("vllm:num_requests_waiting", "sum", PER_ENGINE),
    "engine_kv_cache_usage": ("vllm:kv_cache_usage_perc", "max", PER_ENGINE),
    "engine_ttft_p99": (_TTFT, "p99", PER_ENGINE),
}
"""The live page's five fleet charts, each line computed as the page computes it from a
``/snapshot`` (``redis_stats/server/web/index.html``, ``update``): an engine's KV usage is the
largest of its series, its queue their sum, its p99 the largest of its series'; and each engine's
queue, KV usage and TTFT p99, the lines of its chart under "needs attention"."""
