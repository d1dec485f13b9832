"""Exact usage per tenant, LoRA adapter and model (docs/usage.md).

Record (any Python server or gateway; the vLLM and LiteLLM integrations build on it)::

    from redis_stats.usage import Usage, UsageRecorder
    recorder = UsageRecorder(writer)        # flushed with the writer's once-only flush
    recorder.record(Usage(tenant="acme", adapter=None, model="llama-3-8b",
                          prompt_tokens=812, cached_prompt_tokens=512,
                          generation_tokens=96, outcome="stop"))

Read (a budget check on every request, reports, bills)::

    from redis_stats.usage import UsageReader
    UsageReader(config).tenant("acme").day.get("generation_tokens")

:mod:`~redis_stats.usage.record` (what a request used, and names made safe),
:mod:`~redis_stats.usage.recorder` (memory, then Redis exactly once),
:mod:`~redis_stats.usage.layout` (the keys and stored texts), :mod:`~redis_stats.usage.read`
(the reads).
"""

from redis_stats.usage.layout import FIELDS, OUTCOMES
from redis_stats.usage.read import Answer, Row, TenantUsage, Totals, UsageQueryError, UsageReader
from redis_stats.usage.record import NO_ADAPTER, NO_TENANT, OTHER, Usage, clean_name
from redis_stats.usage.recorder import Batch, UsageRecorder

__all__ = [
    "FIELDS",
    "NO_ADAPTER",
    "NO_TENANT",
    "OTHER",
    "OUTCOMES",
    "Answer",
    "Batch",
    "Row",
    "TenantUsage",
    "Totals",
    "Usage",
    "UsageQueryError",
    "UsageReader",
    "UsageRecorder",
    "clean_name",
]
