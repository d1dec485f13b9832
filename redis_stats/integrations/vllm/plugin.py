"""RedisStatLogger: the vLLM stat-logger plugin (entry point ``vllm.stat_logger_plugins``).

vLLM builds it once per API-server process with the engine indexes that process manages and calls
``record`` for every engine-step batch on its event loop. Without ``REDIS_STATS_URL`` it does
nothing (and says so once). This module imports vLLM; the rest of redis_stats never does.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from vllm.v1.metrics.loggers import AggregateStatLoggerBase

from ...config import StatsConfig
from ...connection import make_client
from ...leader import make_leader
from ...reader import StatsReader
from ...reporter import StatsReporter
from ...writer import StatsWriter
from . import namespace_for_model
from .catalog import vllm_catalog
from .logline import VllmLogLines
from .recorder import VllmRecorder

__all__ = ["RedisStatLogger"]

log = logging.getLogger("vllm.redis_stats")  # under vLLM's logger: its handlers and format
_warned_inactive = False


class RedisStatLogger(AggregateStatLoggerBase):
    """Writes every engine's stats to Redis; optionally serves the Redis view on REDIS_STATS_PORT."""

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        global _warned_inactive
        self.engine_indexes = list(engine_indexes or [0])
        self.recorder: VllmRecorder | None = None
        self.writer: StatsWriter | None = None
        self.reporter: StatsReporter | None = None
        self._tick_thread: threading.Thread | None = None
        self.vllm_config = vllm_config
        if not os.environ.get("REDIS_STATS_URL"):
            if not _warned_inactive:
                log.info("redis_stats: REDIS_STATS_URL is not set; the Redis stat logger does nothing")
                _warned_inactive = True
            return
        model_config = vllm_config.model_config
        model = str(model_config.served_model_name)
        config = StatsConfig.from_env(
            namespace=os.environ.get("REDIS_STATS_NAMESPACE") or namespace_for_model(model),
            log_interval=float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10")),
        )
        cache_labels = self._cache_config_labels(vllm_config)
        catalog = vllm_catalog(int(getattr(model_config, "max_model_len", 8192) or 8192), cache_labels)
        rank = getattr(vllm_config.parallel_config, "_api_process_rank", 0)
        # All API servers of one `vllm serve` are children of its main process (or are it, with a
        # single API server): host + that pid names the instance that owns these engines.
        api_count = getattr(vllm_config.parallel_config, "_api_process_count", 1) or 1
        owner = f"{socket.gethostname()}:{os.getppid() if api_count > 1 else os.getpid()}"
        self.writer = StatsWriter(
            config, catalog, engines=self.engine_indexes, role=f"api{rank}", owner=owner
        )
        lora = getattr(vllm_config, "lora_config", None)
        self.recorder = VllmRecorder(
            self.writer,
            model,
            self.engine_indexes,
            max_lora=getattr(lora, "max_loras", None) if lora else None,
        )
        log.info(
            "redis_stats: recording engines %s to %s namespace %r as %s",
            self.engine_indexes,
            config.safe_url,
            config.namespace,
            self.writer.writer_id,
        )
        from .serve import maybe_serve

        recorded = [e + config.engine_offset for e in self.engine_indexes]
        maybe_serve(config, catalog, recorded)
        # vLLM turns its own periodic log off with several API servers; this one is right in every
        # topology because it reads deployment-wide totals. log() drives it.
        leader = make_leader(
            config, make_client(config), recorded, process_rank=rank, holder=self.writer.writer_id
        )
        self.reporter = StatsReporter(
            StatsReader(config, catalog),
            leader,
            lines=VllmLogLines(),
            interval=config.log_interval,
            logger=logging.getLogger("vllm.redis_stats"),
        )

    @staticmethod
    def _cache_config_labels(vllm_config: Any) -> tuple[str, ...]:
        try:
            return tuple(sorted(vllm_config.cache_config.metrics_info()))
        except Exception:
            return ()

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        """One engine-step batch: memory only."""
        if self.recorder is not None:
            self.recorder.record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)

    def log_engine_initialized(self) -> None:
        """Records ``vllm:cache_config_info``."""
        if self.recorder is not None:
            try:
                info = self.vllm_config.cache_config.metrics_info()
            except Exception:
                return
            self.recorder.record_cache_config(info)

    def log(self) -> None:
        """Called every VLLM_LOG_STATS_INTERVAL: the leader prints every engine's line from Redis.

        vLLM calls this on its event loop; the read of Redis runs in a thread so the loop never
        waits on the network (a tick still running when the next is due is not doubled).
        """
        if self.reporter is None or (self._tick_thread is not None and self._tick_thread.is_alive()):
            return
        self._tick_thread = threading.Thread(target=self.reporter.tick, name="redis_stats-log", daemon=True)
        self._tick_thread.start()

    def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
        """vLLM's sleep mode: the engine_sleep_state gauge."""
        if self.recorder is not None:
            self.recorder.record_sleep_state(sleep, level)

    def record_admission_rejection(self, reason: str) -> None:
        """A request rejected at admission by a queue limit."""
        if self.recorder is not None:
            self.recorder.record_admission_rejection(str(reason))
