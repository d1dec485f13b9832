"""The bridge's family map for the endpoint views (``redis_stats.endpoints``): which family of a
bridged server plays which role of the Model Server Protocol, so ``/metrics?endpoint=`` serves
one series per role for SGLang and TensorRT-LLM as it does for vLLM.

SGLang's names are those of ``python -m sglang.launch_server --enable-metrics``; TensorRT-LLM's
are the Triton TensorRT-LLM backend's (``nv_trt_llm_*``, series selected by label), as the
endpoint picker's defaults for that server name them. Neither set is tested against a live
server here: against families named so, by ``tests/server/test_endpoint_views.py``.
"""

from __future__ import annotations

from redis_stats.endpoints import KV_USAGE, RUNNING, WAITING, FamilyRole

__all__ = ["BRIDGE_ROLES", "SGLANG_ROLES", "TRTLLM_ROLES"]

SGLANG_ROLES = (
    FamilyRole("sglang:num_queue_reqs", WAITING),
    FamilyRole("sglang:num_running_reqs", RUNNING),
    FamilyRole("sglang:token_usage", KV_USAGE),
)
"""SGLang's families and their roles."""

TRTLLM_ROLES = (
    FamilyRole("nv_trt_llm_request_metrics", WAITING, (("request_type", "waiting"),)),
    FamilyRole("nv_trt_llm_request_metrics", RUNNING, (("request_type", "scheduled"),)),
    FamilyRole("nv_trt_llm_kv_cache_block_metrics", KV_USAGE, (("kv_cache_block_type", "fraction"),)),
)
"""TensorRT-LLM's (Triton backend) families and their roles, each selecting its series by label."""

BRIDGE_ROLES = SGLANG_ROLES + TRTLLM_ROLES
"""Every bridged server's roles (their family names never clash)."""
