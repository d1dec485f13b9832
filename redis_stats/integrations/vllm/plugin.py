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

from redis_stats.catalog import Catalog
from redis_stats.connection import make_client
from redis_stats.integrations.vllm.catalog import BUCKET_FAMILIES, vllm_catalog
from redis_stats.integrations.vllm.load import load_map_for
from redis_stats.integrations.vllm.logline import VllmLogLines
from redis_stats.integrations.vllm.options import (
    plugin_config,
    plugin_enabled,
    tenant_header,
    warn_mistyped_variables,
)
from redis_stats.integrations.vllm.prom import metric_classes
from redis_stats.integrations.vllm.recorder import VllmFeatures, VllmRecorder
from redis_stats.integrations.vllm.usage_join import UsageJoin
from redis_stats.leader import make_leader
from redis_stats.reader import StatsReader
from redis_stats.reporting import StatsReporter
from redis_stats.usage import UsageRecorder
from redis_stats.writer import StatsWriter

__all__ = ["RedisStatLogger", "VllmOwnMetrics", "VllmRecording", "catalog_for", "features_from_config"]

log = logging.getLogger("vllm.redis_stats")  # under vLLM's logger: its handlers and format
_warned_inactive = False


def features_from_config(vllm_config: Any) -> VllmFeatures:
    """The optional families vLLM's PrometheusStatLogger exposes for *vllm_config* (loggers.py).

    Spec decoding is off here: :class:`VllmOwnMetrics` records it through vLLM's own class.
    """
    try:
        import vllm.envs as envs

        corrupted = bool(envs.VLLM_COMPUTE_NANS_IN_LOGITS)
    except Exception:
        corrupted = False
    observability = getattr(vllm_config, "observability_config", None)
    kv_transfer = getattr(vllm_config, "kv_transfer_config", None)
    return VllmFeatures(
        spec_decoding=False,
        corrupted=corrupted,
        kv_consumer=bool(kv_transfer is not None and getattr(kv_transfer, "is_kv_consumer", False)),
        watermark=getattr(vllm_config, "watermark_config", None) is not None,
        kv_cache_metrics=bool(getattr(observability, "kv_cache_metrics", False)),
    )


class VllmOwnMetrics:
    """The families vLLM builds through metric classes it is handed, built by vLLM's own code
    with redis_stats' classes (``prom.py``), exactly as PrometheusStatLogger builds them:

    - ``SpecDecodingProm``: spec decoding, or the ``vllm:diffusion_*`` names of diffusion models;
    - ``PerfMetricsProm``: the MFU estimates ``vllm:estimated_*_per_gpu``;
    - ``KVConnectorProm``: the configured KV connector's ``build_prom_metrics`` (offloading, NIXL,
      LMCache, Mooncake, ...), fed ``scheduler_stats.kv_connector_stats``;
    - ``ECConnectorProm``: the same for an encoder-cache connector.

    So every family such a connector defines lands in Redis under its own name, labels and
    buckets, with no code here per connector. A part that fails to build or to record is logged
    once and skipped; it never raises into vLLM.
    """

    def __init__(
        self, vllm_config: Any, writer: StatsWriter, model_name: object, engine_indexes: list[int]
    ) -> None:
        gauge, counter, histogram = metric_classes(writer, fallback_engine=min(engine_indexes, default=0))
        classes = {"_gauge_cls": gauge, "_counter_cls": counter, "_histogram_cls": histogram}
        # As PrometheusStatLogger: labels model_name and engine, values per engine.
        labelnames = ["model_name", "engine"]
        per_engine: dict[int, list[object]] = {idx: [model_name, str(idx)] for idx in engine_indexes}
        self._failed: set[str] = set()
        model_config = getattr(vllm_config, "model_config", None)

        def spec_decoding() -> Any:
            from vllm.v1.spec_decode.metrics import SpecDecodingProm

            return type("RedisSpecDecodingProm", (SpecDecodingProm,), {"_counter_cls": counter})(
                vllm_config.speculative_config,
                labelnames,
                per_engine,
                is_diffusion=bool(getattr(model_config, "is_diffusion", False)),
            )

        def perf() -> Any:
            from vllm.v1.metrics.perf import PerfMetricsProm

            return type("RedisPerfMetricsProm", (PerfMetricsProm,), {"_counter_cls": counter})(
                vllm_config, labelnames, per_engine
            )

        def kv_connector() -> Any:
            from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm

            made = type("RedisKVConnectorProm", (KVConnectorProm,), classes)
            return made(vllm_config, labelnames, per_engine)

        def ec_connector() -> Any:
            from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorProm

            made = type("RedisECConnectorProm", (ECConnectorProm,), classes)
            return made(vllm_config, labelnames, per_engine)

        self.spec_decoding = self._build("spec decoding", spec_decoding)
        self.perf = self._build("MFU estimates", perf)
        self.kv_connector = self._build("KV connector", kv_connector)
        self.ec_connector = self._build("EC connector", ec_connector)

    def _build(self, what: str, make: Any) -> Any:
        try:
            return make()
        except ImportError:  # an older vLLM without this part: it has no such families either
            return None
        except Exception as exc:
            log.warning("redis_stats: the %s metrics are not recorded: %s: %s", what, type(exc).__name__, exc)
            return None

    def observe(self, scheduler_stats: Any, engine_idx: int) -> None:
        """Feed one step's scheduler stats to each part, as PrometheusStatLogger.record does."""
        for what, part, attr in (
            ("spec decoding", self.spec_decoding, "spec_decoding_stats"),
            ("KV connector", self.kv_connector, "kv_connector_stats"),
            ("EC connector", self.ec_connector, "ec_connector_stats"),
            ("MFU estimates", self.perf, "perf_stats"),
        ):
            if part is None:
                continue
            stats = getattr(scheduler_stats, attr, None)
            if stats is None:
                continue
            try:
                part.observe(stats, engine_idx)
            except Exception as exc:  # a connector's observe asserts on what it does not know
                if what not in self._failed:
                    self._failed.add(what)
                    log.warning(
                        "redis_stats: recording %s stats failed (%s: %s); further failures are not logged",
                        what,
                        type(exc).__name__,
                        exc,
                    )


def catalog_for(vllm_config: Any) -> Catalog:
    """The ``vllm:*`` catalogue for *vllm_config*: its max_model_len, cache-config labels and
    custom histogram buckets, as PrometheusStatLogger derives them."""
    model_config = vllm_config.model_config
    try:
        cache_labels = tuple(sorted(vllm_config.cache_config.metrics_info()))
    except Exception:
        cache_labels = ()
    observability = getattr(vllm_config, "observability_config", None)
    overrides = dict(getattr(observability, "custom_histogram_buckets", None) or {})
    unknown = sorted(set(overrides) - set(BUCKET_FAMILIES))
    if unknown:
        # vLLM validated them: a family this version of redis_stats does not know (a newer vLLM)
        # keeps its default buckets here rather than stopping vLLM's start.
        log.warning(
            "redis_stats: custom histogram buckets for %s are not applied to the Redis view "
            "(unknown bucket families; known: %s)",
            unknown,
            list(BUCKET_FAMILIES),
        )
        overrides = {k: v for k, v in overrides.items() if k in BUCKET_FAMILIES}
    return vllm_catalog(int(getattr(model_config, "max_model_len", 8192) or 8192), cache_labels, overrides)


class VllmRecording:
    """Everything PrometheusStatLogger records, into *writer*: the recorder (loggers.py's own
    families) and :class:`VllmOwnMetrics` (the families vLLM builds through handed classes)."""

    def __init__(self, vllm_config: Any, writer: StatsWriter, engine_indexes: list[int]) -> None:
        model = vllm_config.model_config.served_model_name
        lora = getattr(vllm_config, "lora_config", None)
        self.vllm_config = vllm_config
        self.recorder = VllmRecorder(
            writer,
            str(model),
            engine_indexes,
            max_lora=getattr(lora, "max_loras", None) if lora else None,
            features=features_from_config(vllm_config),
        )
        self.own_metrics = VllmOwnMetrics(vllm_config, writer, model, engine_indexes)

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        """One engine-step batch: memory only."""
        self.recorder.record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)
        if scheduler_stats is not None:
            self.own_metrics.observe(scheduler_stats, engine_idx)

    def record_cache_config(self) -> None:
        """``vllm:cache_config_info`` from ``cache_config.metrics_info()``."""
        try:
            info = self.vllm_config.cache_config.metrics_info()
        except Exception:
            return
        self.recorder.record_cache_config(info)


def _warn_mistyped_variables() -> None:
    try:
        import vllm.envs as envs

        vllm_names = list(getattr(envs, "environment_variables", {}))
    except Exception:
        vllm_names = []
    # Under vLLM's logger, as the plugin's other lines.
    warn_mistyped_variables(
        vllm_names=vllm_names, emit=lambda message: log.warning("redis_stats: %s", message)
    )


def _usage_join(writer: StatsWriter, model: str) -> UsageJoin | None:
    """With ``REDIS_STATS_TENANT_HEADER`` set: the join of this process's requests to their
    tenants (docs/usage.md), recorded through *writer*, and registered for the middleware."""
    from redis_stats.integrations.vllm.usage_middleware import register_join

    header = tenant_header()
    join = None if header is None else UsageJoin(UsageRecorder(writer), model, tenant_header=header)
    register_join(join)
    if join is not None:
        log.info(
            "redis_stats: recording usage per tenant (header %r); add --middleware "
            "redis_stats.integrations.vllm.usage_middleware.UsageMiddleware to join requests to tenants",
            header,
        )
    return join


class RedisStatLogger(AggregateStatLoggerBase):
    """Writes every engine's stats to Redis; optionally serves the Redis view on REDIS_STATS_PORT."""

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        global _warned_inactive
        self.engine_indexes = list(engine_indexes or [0])
        self.recording: VllmRecording | None = None
        self.recorder: VllmRecorder | None = None
        self.writer: StatsWriter | None = None
        self.reporter: StatsReporter | None = None
        self.usage: UsageJoin | None = None
        self._tick_thread: threading.Thread | None = None
        self.vllm_config = vllm_config
        _warn_mistyped_variables()  # before the switch: a mistyped REDIS_STATS_URL is one too
        if not plugin_enabled():
            if not _warned_inactive:
                log.info("redis_stats: REDIS_STATS_URL is not set; the Redis stat logger does nothing")
                _warned_inactive = True
            return
        # With REDIS_STATS_POD_INDEX the offset is derived from vLLM's data-parallel size: each
        # pod of identical instances records its engines after the previous pods' ones.
        dp_size = getattr(vllm_config.parallel_config, "data_parallel_size", 1) or 1
        config = plugin_config(str(vllm_config.model_config.served_model_name), data_parallel_size=dp_size)
        catalog = catalog_for(vllm_config)
        rank = getattr(vllm_config.parallel_config, "_api_process_rank", 0)
        # All API servers of one `vllm serve` are children of its main process (or are it, with a
        # single API server): host + that pid names the instance that owns these engines.
        api_count = getattr(vllm_config.parallel_config, "_api_process_count", 1) or 1
        owner = f"{socket.gethostname()}:{os.getppid() if api_count > 1 else os.getpid()}"
        # load=: the load feed's entries (GET /load, docs/load.md) beside every flush
        self.writer = StatsWriter(
            config,
            catalog,
            engines=self.engine_indexes,
            role=f"api{rank}",
            owner=owner,
            load=load_map_for(vllm_config),
        )
        self.recording = VllmRecording(vllm_config, self.writer, self.engine_indexes)
        self.recorder = self.recording.recorder
        self.usage = _usage_join(self.writer, str(vllm_config.model_config.served_model_name))
        log.info(
            "redis_stats: recording engines %s to %s namespace %r as %s",
            self.engine_indexes,
            config.safe_url,
            config.namespace,
            self.writer.writer_id,
        )
        from redis_stats.integrations.vllm.get_load import register_config
        from redis_stats.integrations.vllm.serve import maybe_serve

        register_config(config)  # `--middleware ...get_load.GetLoadMiddleware` answers for this endpoint
        from redis_stats.integrations.vllm.arrivals import register_writer

        register_writer(self.writer)  # `--middleware ...arrivals.ArrivalsMiddleware` counts in it

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

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        """One engine-step batch: memory only."""
        if self.recording is not None:
            self.recording.record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)
        if self.usage is not None and iteration_stats is not None:
            self.usage.finished_stats(iteration_stats)

    def log_engine_initialized(self) -> None:
        """Records ``vllm:cache_config_info``."""
        if self.recording is not None:
            self.recording.record_cache_config()

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
