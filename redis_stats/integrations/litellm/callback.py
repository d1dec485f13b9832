"""The LiteLLM callback: every request a LiteLLM proxy pod answers (or fails), recorded in the usage
ledger under the caller's key, team or user; exact across pods (docs/usage.md, "LiteLLM").

In the proxy's ``config.yaml``::

    litellm_settings:
      callbacks: redis_stats.integrations.litellm.callback.usage_callback

with ``REDIS_STATS_URL`` (and ``REDIS_STATS_NAMESPACE``, ``REDIS_STATS_LITELLM_TENANT``) in each
pod's environment. Without ``REDIS_STATS_URL`` the callback records nothing (and says so once).
Recording is memory only (``UsageRecorder.record``); the writer's thread flushes it to Redis once
per flush interval, each batch applied at most once whatever the network does, so pods never
seed, reset or retry a counter. This module imports LiteLLM.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from redis_stats.config import StatsConfig
from redis_stats.integrations.litellm.usage import URL, tenant_field, usage_of_event
from redis_stats.usage import UsageRecorder
from redis_stats.writer import StatsWriter

__all__ = ["RedisUsageLogger", "usage_callback"]

log = logging.getLogger("redis_stats.litellm")


class RedisUsageLogger(CustomLogger):  # type: ignore[misc]
    """A LiteLLM ``CustomLogger`` recording each success and failure event's usage.

    *config*: the store (default: ``StatsConfig.from_env()`` when ``REDIS_STATS_URL`` is set, else
    the logger records nothing); *field*: the identity that is the tenant (default:
    ``REDIS_STATS_LITELLM_TENANT``); *recorder*: an existing one (tests, a process that has its
    own writer)."""

    def __init__(
        self,
        config: StatsConfig | None = None,
        *,
        field: str | None = None,
        recorder: UsageRecorder | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.field = field if field is not None else tenant_field(environ)
        self.writer: StatsWriter | None = None
        self.recorder = recorder
        self.failures = 0
        self.recorded = 0
        """Events recorded by this process (what a pod reconciles the ledger against)."""
        if self.recorder is None:
            if config is None and not URL.get(environ):
                log.info(
                    "redis_stats: REDIS_STATS_URL is not set; the LiteLLM usage callback records nothing"
                )
                return
            self.writer = StatsWriter(config if config is not None else StatsConfig.from_env(environ))
            self.recorder = UsageRecorder(self.writer)

    def log_usage(self, kwargs: Mapping[str, Any], response_obj: Any, outcome: str | None = None) -> None:
        """Record one event's usage (memory only); never raises into LiteLLM."""
        if self.recorder is None:
            return
        try:
            self.recorder.record(usage_of_event(kwargs, response_obj, self.field, outcome))
            self.recorded += 1
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning(
                    "redis_stats: a LiteLLM event's usage is not recorded: %s: %s", type(exc).__name__, exc
                )

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """LiteLLM's hook after an async call (the proxy's)."""
        self.log_usage(kwargs, response_obj)

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """LiteLLM's hook after an async call failed: one ``error`` request with what it used."""
        self.log_usage(kwargs, response_obj, "error")

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """LiteLLM's hook after a sync call (``litellm.completion``; not called for async ones)."""
        self.log_usage(kwargs, response_obj)

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """LiteLLM's hook after a sync call failed."""
        self.log_usage(kwargs, response_obj, "error")

    def close(self) -> bool:
        """Flush what is recorded and stop the writer (it also does so at exit)."""
        return self.writer.close() if self.writer is not None else True


usage_callback = RedisUsageLogger()
"""The instance the proxy's ``callbacks:`` names (configured from the environment at import)."""
