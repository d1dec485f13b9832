"""Which vLLM metric feeds which field of the load feed (``GET /load``, redis_stats/load.py).

Given to the writer (``StatsWriter(load=VLLM_LOAD)``: the vLLM plugin does) so the core knows no
vLLM name, as :mod:`redis_stats.integrations.vllm.summary` does for ``/snapshot``'s summary.
"""

from __future__ import annotations

from redis_stats.load import LoadMap, LoadSource

__all__ = ["VLLM_LOAD"]

VLLM_LOAD = LoadMap(
    requests_running=LoadSource("vllm:num_requests_running"),
    requests_waiting=LoadSource("vllm:num_requests_waiting"),
    kv_cache_usage=LoadSource("vllm:kv_cache_usage_perc"),
    # vLLM reports its KV capacity only in the labels of its cache configuration (an info gauge
    # at 1): blocks x tokens per block. Absent (null) where it reports no num_gpu_blocks.
    kv_cache_capacity_tokens=LoadSource("vllm:cache_config_info", ("num_gpu_blocks", "block_size")),
    prompt_tokens_per_second=LoadSource("vllm:prompt_tokens"),
    generation_tokens_per_second=LoadSource("vllm:generation_tokens"),
)
