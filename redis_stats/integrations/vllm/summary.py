"""The fleet figures routers and autoscalers ask for, in vLLM's names (``/snapshot``'s ``fleet.summary``).

Injected into the exporter (``Exporter(summary=VLLM_FLEET_SUMMARY)``) so the core knows no vLLM name.
"""

from __future__ import annotations

from redis_stats.server.views.window import FleetSummary

__all__ = ["VLLM_FLEET_SUMMARY"]

VLLM_FLEET_SUMMARY: FleetSummary = {
    "requests_running": ("sum", "vllm:num_requests_running"),
    "requests_waiting": ("sum", "vllm:num_requests_waiting"),
    "kv_cache_usage_mean": ("mean", "vllm:kv_cache_usage_perc"),
    "kv_cache_usage_max": ("max", "vllm:kv_cache_usage_perc"),
    "generation_tokens_per_second": ("rate", "vllm:generation_tokens"),
    "prompt_tokens_per_second": ("rate", "vllm:prompt_tokens"),
    "requests_finished_per_second": ("rate", "vllm:request_success"),
}
