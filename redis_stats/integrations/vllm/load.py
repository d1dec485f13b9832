"""Which vLLM metric feeds which field of the load feed (``GET /load``, redis_stats/load.py).

Given to the writer (``StatsWriter(load=load_map_for(vllm_config))``: the vLLM plugin does) so the
core knows no vLLM name, as :mod:`redis_stats.integrations.vllm.summary` does for ``/snapshot``'s
summary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from redis_stats.load import LoadMap, LoadSource

__all__ = ["VLLM_LOAD", "load_map_for"]

VLLM_LOAD = LoadMap(
    requests_running=LoadSource("vllm:num_requests_running"),
    requests_waiting=LoadSource("vllm:num_requests_waiting"),
    kv_cache_usage=LoadSource("vllm:kv_cache_usage_perc"),
    # vLLM reports its KV capacity only in the labels of its cache configuration (an info gauge
    # at 1): blocks x tokens per block. Absent (null) where it reports no num_gpu_blocks.
    kv_cache_capacity_tokens=LoadSource("vllm:cache_config_info", ("num_gpu_blocks", "block_size")),
    prompt_tokens_per_second=LoadSource("vllm:prompt_tokens"),
    generation_tokens_per_second=LoadSource("vllm:generation_tokens"),
    # The prefix cache's queried and hit tokens (vLLM counts both per step, in tokens): their
    # rates' ratio is the hit rate over the same window.
    prefix_cache_queries_per_second=LoadSource("vllm:prefix_cache_queries"),
    prefix_cache_hits_per_second=LoadSource("vllm:prefix_cache_hits"),
)
"""The map of metrics only; :func:`load_map_for` adds what vLLM's configuration says."""


def load_map_for(vllm_config: Any) -> LoadMap:
    """:data:`VLLM_LOAD` plus ``max_running_requests``: the scheduler's ``max_num_seqs`` of
    *vllm_config* (the most requests an engine runs at once; no vLLM metric carries it), when it
    is a positive number (else the field is not reported)."""
    scheduler = getattr(vllm_config, "scheduler_config", None)
    most = getattr(scheduler, "max_num_seqs", None)
    if isinstance(most, bool) or not isinstance(most, (int, float)) or not math.isfinite(most) or most <= 0:
        return VLLM_LOAD
    return dataclasses.replace(VLLM_LOAD, max_running_requests=LoadSource("", constant=float(most)))
