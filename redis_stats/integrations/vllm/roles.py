"""vLLM's families in the endpoint views (``redis_stats.endpoints``): the Model Server Protocol
families the endpoint picker (llm-d-router) reads, each with the role that aggregates it over an
endpoint's live engines."""

from __future__ import annotations

from redis_stats.endpoints import CACHE_CONFIG, KV_USAGE, LORA, RUNNING, WAITING, FamilyRole

__all__ = ["VLLM_ROLES"]

VLLM_ROLES = (
    FamilyRole("vllm:num_requests_waiting", WAITING),
    FamilyRole("vllm:num_requests_running", RUNNING),
    FamilyRole("vllm:kv_cache_usage_perc", KV_USAGE),
    FamilyRole("vllm:cache_config_info", CACHE_CONFIG),
    FamilyRole("vllm:lora_requests_info", LORA),
)
"""vLLM's Model Server Protocol families and their roles."""
