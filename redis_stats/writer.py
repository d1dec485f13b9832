"""StatsWriter: record counters, gauges and histograms per engine; a thread flushes them to Redis.

    writer = StatsWriter(StatsConfig.from_env(), catalog, engines=[0, 1])
    tokens = writer.counter("generation_tokens").labels(engine=0)   # bind once
    tokens.inc(17)                                                   # hot path: memory only
    writer.close()                                                   # last flush

Every flush interval the thread sends one script call with every change since the last one
(see :mod:`redis_stats.accumulator` for the exactly-once rules). Start-up does not need Redis;
while Redis is down, updates keep landing in memory and nothing raises into the caller.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import secrets
import socket
import threading
import time
from bisect import bisect_left
from collections import Counter as _Tally
from dataclasses import dataclass, field
from typing import Any

import redis

from .accumulator import Accumulator, FlushProtocol, FlushResult
from .catalog import COUNTER, GAUGE, HISTOGRAM, Catalog, CatalogError, MetricSpec
from .config import ConfigError, StatsConfig
from .connection import make_client
from .errors import ReplicationLag, error_kind  # both importable from here as they always were
from .keys import Keys
from .scripts import load_script

__all__ = [
    "MetricHandle",
    "ReplicationLag",
    "StatsWriter",
    "WriterCore",
    "WriterStats",
    "error_kind",
    "new_writer_id",
]

log = logging.getLogger("redis_stats.writer")


def _check_identity(what: str, value: object) -> None:
    """A writer's *role*, *owner* or id goes to Redis as UTF-8 with every flush: refuse at
    construction what could never be sent (one bad value would stop every flush)."""
    if not isinstance(value, str):
        raise ConfigError(f"{what}={value!r} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{what}={value!r} cannot be encoded as UTF-8 ({exc.reason} at index {exc.start}); "
            "pass text without lone surrogates"
        ) from None


def new_writer_id(role: str = "") -> str:
    """A writer id unique per process incarnation: ``host:pid[:role]:random``."""
    parts = [socket.gethostname(), str(os.getpid())]
    if role:
        parts.append(role)
    parts.append(secrets.token_hex(3))
    return ":".join(parts)


# Upper bounds (s) of the flush-duration histogram of every writer's self-metrics.
FLUSH_DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class WriterStats:
    """What a writer has done so far (the source of its self-metrics, stored with every flush)."""

    flushes: int = 0
    duplicates: int = 0
    errors: _Tally[str] = field(default_factory=_Tally)
    failed_fields: int = 0
    conflicts: int = 0
    last_success: float = 0.0
    last_duration: float = 0.0
    duration_counts: list[int] = field(default_factory=lambda: [0] * (len(FLUSH_DURATION_BUCKETS) + 1))
    duration_sum: float = 0.0

    def observe_duration(self, seconds: float) -> None:
        """Count one successful flush's duration."""
        self.last_duration = seconds
        self.duration_sum += seconds
        self.duration_counts[bisect_left(FLUSH_DURATION_BUCKETS, seconds)] += 1

    def as_fields(
        self, drops: dict[str, int], pending: int, engines: tuple[int, ...], owner: str
    ) -> list[str]:
        """Field/value pairs for the writer's stats hash (absolute values)."""
        out = [
            "flushes",
            str(self.flushes),
            "duplicates",
            str(self.duplicates),
            "failed_fields",
            str(self.failed_fields),
            "conflicts",
            str(self.conflicts),
            "pending",
            str(pending),
            "dur_sum",
            repr(self.duration_sum),
            "engines",
            ",".join(map(str, engines)),
            "owner",
            owner,
        ]
        for kind, n in self.errors.items():
            out += (f"err:{kind}", str(n))
        for reason, n in drops.items():
            out += (f"drop:{reason}", str(n))
        for bound, n in zip((*FLUSH_DURATION_BUCKETS, math.inf), self.duration_counts):
            out += (f"dur:{'+Inf' if bound == math.inf else repr(bound)}", str(n))
        return out


class MetricHandle:
    """One metric of a writer; :meth:`labels` binds a series for the hot path."""

    __slots__ = ("_writer", "spec")

    def __init__(self, writer: WriterCore, spec: MetricSpec) -> None:
        self._writer = writer
        self.spec = spec

    def labels(self, engine: int = 0, **labels: object) -> Any:
        """The series of *engine* with these label values (a CatalogError if names are wrong).

        Keep the returned child and call ``inc``/``set``/``observe`` on it: that is the cheap path.
        """
        if not isinstance(engine, int) or isinstance(engine, bool) or engine < 0:
            raise CatalogError(f"metric {self.spec.name!r}: engine={engine!r} must be an int >= 0")
        values = self.spec.label_values(labels)
        return self._writer._acc.child(self.spec, engine, values, self._writer.writer_id)

    def inc(self, amount: float = 1, engine: int = 0, **labels: object) -> None:
        """Shortcut for ``labels(engine, **labels).inc(amount)`` (counters and gauges)."""
        self.labels(engine, **labels).inc(amount)

    def set(self, value: float, engine: int = 0, **labels: object) -> None:
        """Shortcut for ``labels(engine, **labels).set(value)`` (gauges)."""
        self.labels(engine, **labels).set(value)

    def observe(self, value: float, engine: int = 0, **labels: object) -> None:
        """Shortcut for ``labels(engine, **labels).observe(value)`` (histograms)."""
        self.labels(engine, **labels).observe(value)


class WriterCore:
    """A writer without its I/O: catalogue, series, sequence numbers and self-metrics, what each
    flush sends and what each answer means.

    :class:`StatsWriter` (a thread) and :class:`redis_stats.aio.AsyncStatsWriter` (a task) wrap
    it, so the exactly-once protocol exists once.
    """

    def __init__(
        self,
        config: StatsConfig | None = None,
        catalog: Catalog | None = None,
        *,
        engines: tuple[int, ...] | list[int] = (),
        writer_id: str | None = None,
        role: str = "",
        owner: str = "",
    ) -> None:
        self.config = config or StatsConfig.from_env()
        self.catalog = catalog if catalog is not None else Catalog()
        _check_identity("role", role)
        _check_identity("owner", owner)
        if owner and "|" in owner:
            # Stored as "<owner>|<ms>" in the claims hash and joined with "|" in the conflicts hash.
            raise ConfigError(
                f"owner={owner!r} contains '|', which separates owners in Redis; use another character"
            )
        if writer_id is not None:
            _check_identity("writer_id", writer_id)
        self._role = role
        self.owner = owner
        self.writer_id = writer_id or new_writer_id(role)
        self.keys = Keys(self.config.namespace)
        self.engines = tuple(int(e) for e in engines)
        self.stats = WriterStats()
        self._acc = Accumulator(
            self.catalog,
            max_label_length=self.config.max_label_length,
            max_series_per_metric=self.config.max_series_per_metric,
            engine_offset=self.config.engine_offset,
        )
        self._protocol = FlushProtocol(self._acc)
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.writer_id!r}, url={self.config.safe_url!r}, "
            f"namespace={self.config.namespace!r}, engines={list(self.engines)})"
        )

    # -- defining and binding ---------------------------------------------------------------

    def metric(self, name: str) -> MetricHandle:
        """The handle of metric *name* (CatalogError if the catalogue does not define it)."""
        return MetricHandle(self, self.catalog[name])

    def _kind(self, name: str, kind: str) -> MetricHandle:
        handle = self.metric(name)
        if handle.spec.kind != kind:
            raise CatalogError(f"metric {name!r} is a {handle.spec.kind}, not a {kind}")
        return handle

    def counter(self, name: str) -> MetricHandle:
        """The handle of counter *name*."""
        return self._kind(name, COUNTER)

    def gauge(self, name: str) -> MetricHandle:
        """The handle of gauge *name*."""
        return self._kind(name, GAUGE)

    def histogram(self, name: str) -> MetricHandle:
        """The handle of histogram *name*."""
        return self._kind(name, HISTOGRAM)

    def define(self, spec: MetricSpec) -> MetricHandle:
        """Add *spec* to the catalogue after start; it is stored in Redis with the next flush."""
        return MetricHandle(self, self._acc.add_spec(spec))

    @property
    def drops(self) -> dict[str, int]:
        """Updates dropped on the hot path, by reason (invalid_value, label_too_long, ...)."""
        return dict(self._acc.drops)

    def pending(self) -> bool:
        """Whether any update has not been confirmed by Redis yet."""
        return self._protocol.has_pending()

    # -- the flush protocol, without I/O -------------------------------------------------------

    def prepare_flush(self, *, closing: bool = False) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of the next flush: the unconfirmed batch again, or a new one."""
        batch = self._protocol.next_batch(self.engines, closing=closing)
        offset = self.config.engine_offset
        args = batch.script_args(
            self.keys.prefix,
            self.writer_id,
            owner=self.owner,
            stale_ms=int(self.config.stale_after * 1000),
            claims=[e + offset for e in self.engines] if self.owner else (),
            stats=self.stats.as_fields(self.drops, self._acc.pending_series(), self.engines, self.owner),
        )
        keys = [
            self.keys.seq,
            self.keys.engines,
            self.keys.writers,
            self.keys.meta,
            self.keys.claims,
            self.keys.conflicts,
        ]
        return keys, args

    def flush_failed(self, exc: BaseException) -> None:
        """The flush did not get an answer: count it; the same batch goes next time."""
        kind = error_kind(exc)
        self.stats.errors[kind] += 1
        # Warn on the first failure of each kind; the rest go to DEBUG (and the counters).
        log_fn = log.warning if self.stats.errors[kind] == 1 else log.debug
        log_fn("flush to %s failed (%s: %s); will retry with the same batch", self.config.safe_url, kind, exc)

    def flush_succeeded(self, reply: Any, seconds: float) -> FlushResult:
        """Redis answered the flush (applied now, or already applied): move on."""
        result = FlushResult.from_reply(reply)
        self._protocol.confirmed(result)
        self.stats.observe_duration(seconds)
        self.stats.last_success = time.time()
        self.stats.flushes += 1
        self.stats.duplicates += not result.applied
        self.stats.failed_fields += result.failed_fields
        if result.catalog_conflicts:
            for name in self._acc.catalog_conflict(result.catalog_conflicts, result.refused_series):
                log.warning(
                    "metric %r of this writer is defined differently in namespace %r (the first "
                    "stored definition wins): this writer's updates of it are dropped and counted "
                    "(reason catalog_conflict). This writer's spec: %s; stored: see `redis-stats "
                    "inspect`. Rename the metric, or use another namespace",
                    name,
                    self.config.namespace,
                    self.catalog[name].to_json(),
                )
        if result.conflicts:
            if not self.stats.conflicts:
                log.warning(
                    "another live instance also claims engine(s) %s of namespace %r (this one: %r): "
                    "their scheduler gauges will mix; give each instance its own engine index "
                    "(REDIS_STATS_ENGINE_OFFSET) or namespace",
                    [e + self.config.engine_offset for e in self.engines],
                    self.config.namespace,
                    self.owner,
                )
            self.stats.conflicts += result.conflicts
        if result.writer_removed:
            # Silent for longer than the retention (a paused process?): gc removed this id and
            # refuses its gauges. Carry on as a new incarnation; the next flush re-sends them.
            old_id, self.writer_id = self.writer_id, new_writer_id(self._role)
            self._acc.rename_writer(self.writer_id)
            log.warning("writer %s was removed by gc; continuing as %s", old_id, self.writer_id)
        return result

    def replication_check(self, acked: Any) -> None:
        """With ``wait_replicas``: raise :class:`ReplicationLag` if too few replicas acknowledged."""
        wanted = self.config.wait_replicas
        if int(acked) < wanted:
            # Applied on the master, not yet on enough replicas: a failover now could lose it. Keep
            # the batch; the retry is a duplicate here (skipped) or is applied on the new master.
            raise ReplicationLag(
                f"{acked} of {wanted} replicas acknowledged within {self.config.wait_timeout_ms} ms"
            )


class StatsWriter(WriterCore):
    """Records stats of one process incarnation and flushes them to Redis from a thread.

    *engines* are heartbeated on every flush (so an idle engine stays up); engines that get data
    are heartbeated too. *owner* names the instance that runs those engines (all API servers of
    one vLLM instance share it): when two live owners claim the same engine, both are warned and
    ``redis_stats_engine_conflict`` shows it. *client* overrides the client built from
    ``config.url`` (tests pass a fakeredis client). With ``start=False`` no thread runs and
    :meth:`flush` is called by hand.
    """

    def __init__(
        self,
        config: StatsConfig | None = None,
        catalog: Catalog | None = None,
        *,
        engines: tuple[int, ...] | list[int] = (),
        writer_id: str | None = None,
        role: str = "",
        owner: str = "",
        client: Any = None,
        start: bool = True,
    ) -> None:
        super().__init__(config, catalog, engines=engines, writer_id=writer_id, role=role, owner=owner)
        self._client = client if client is not None else make_client(self.config)  # no I/O yet
        self._script = self._client.register_script(load_script("flush"))
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        """Start the flusher thread (idempotent). Needs no Redis connection."""
        if self._thread is not None or self._closed:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"redis_stats-flusher-{self.writer_id}", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        interval = self.config.flush_interval
        while not self._stop.wait(interval):
            self.flush()

    def flush(self, *, closing: bool = False) -> bool:
        """Send what is pending now, in one script call. True if Redis confirmed it.

        Never raises for a Redis problem: a failure is counted in :attr:`stats` and the same
        batch is sent again next time.
        """
        with self._flush_lock:
            keys, args = self.prepare_flush(closing=closing)
            started = time.perf_counter()
            try:
                reply = self._call(keys, args)
            except Exception as exc:  # never raise into the host
                self.flush_failed(exc)
                return False
            self.flush_succeeded(reply, time.perf_counter() - started)
            return True

    def _call(self, keys: list[str], args: list[str]) -> Any:
        """One flush: the script, and with ``wait_replicas`` its replication acknowledgement."""
        if not self.config.wait_replicas:
            return self._script(keys=keys, args=args)
        wanted, timeout = self.config.wait_replicas, self.config.wait_timeout_ms
        if hasattr(self._client, "get_node_from_key"):  # Cluster: WAIT on the node of our slot
            reply = self._script(keys=keys, args=args)
            node = self._client.get_node_from_key(keys[0])
            acked = self._client.execute_command("WAIT", wanted, timeout, target_nodes=node)
        else:  # script and WAIT pipelined on one connection: still one round trip
            for attempt in (1, 2):
                pipe = self._client.pipeline(transaction=False)
                pipe.evalsha(self._script.sha, len(keys), *keys, *args)
                pipe.execute_command("WAIT", wanted, timeout)
                reply, acked = pipe.execute(raise_on_error=False)
                if isinstance(reply, redis.exceptions.NoScriptError) and attempt == 1:
                    self._script.sha = self._client.script_load(self._script.script)
                    continue
                break
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception):
                raise acked
        self.replication_check(acked)
        return reply

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the thread and flush what is left (for at most *timeout* seconds).

        Returns True when everything recorded was confirmed by Redis. The writer is marked
        closed in Redis, so its gauges stop counting as current at once.
        """
        if self._closed:
            return not self.pending()
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        atexit.unregister(self.close)
        deadline = time.monotonic() + timeout
        done = False
        while True:
            ok = self.flush(closing=True)
            if ok and not self.pending():
                done = True
                break
            if time.monotonic() >= deadline:
                break
            if not ok:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        if not done:
            log.warning(
                "closing writer %s: updates not confirmed by %s were lost",
                self.writer_id,
                self.config.safe_url,
            )
        try:
            self._client.close()
        except Exception:
            pass
        return done

    def __enter__(self) -> StatsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
