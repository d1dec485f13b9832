"""redis_stats for vLLM: the ``vllm:*`` catalogue, a recorder of vLLM's stats objects, and the
stat-logger plugin (``plugin.RedisStatLogger``, the only module here that imports vLLM)."""

from redis_stats.integrations.vllm.catalog import vllm_catalog
from redis_stats.integrations.vllm.recorder import VllmRecorder

__all__ = ["VllmRecorder", "namespace_for_model", "vllm_catalog"]


def namespace_for_model(model_name: str) -> str:
    """A valid namespace from a served model name (characters a key prefix may not hold -> ``_``)."""
    import re

    cleaned = re.sub(r"[^A-Za-z0-9._\-/:]", "_", model_name)[:128]
    return cleaned or "default"
