"""vLLM's periodic log lines, computed from deployment-wide totals in Redis.

From the change of each engine's counters between two snapshots (server time, so every process
agrees) it formats vLLM's lines:

    Engine 000: Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 95.1 tokens/s,
    Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 41.3%, Prefix cache hit rate: 37.5%
    2 Engines Aggregated: Avg prompt throughput: ...

:class:`VllmLogLines` is what the vLLM plugin and the demo hand to
:class:`~redis_stats.reporting.StatsReporter` (the core reporter knows no vLLM name or text).
``redis-stats top`` shows the same intervals.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from redis_stats.snapshot import EngineSnapshot, Snapshot

__all__ = [
    "EngineInterval",
    "LogMetrics",
    "VllmLogLines",
    "aggregate",
    "engine_intervals",
    "format_engine_line",
    "format_spec_line",
]

Line = tuple[int, str, list[Any]]


@dataclass(frozen=True)
class LogMetrics:
    """Which catalogue metrics feed the log lines and ``redis-stats top`` (vLLM's names by default)."""

    prompt_tokens: str = "vllm:prompt_tokens"
    # vLLM's log counts computed prompt tokens (not cache hits); used when the engine has it.
    computed_prompt_tokens: tuple[str, str] = ("vllm:prompt_tokens_by_source", "local_compute")
    generation_tokens: str = "vllm:generation_tokens"
    preemptions: str = "vllm:num_preemptions"
    running: str = "vllm:num_requests_running"
    waiting: str = "vllm:num_requests_waiting"
    kv_usage: str = "vllm:kv_cache_usage_perc"
    prefix_queries: str = "vllm:prefix_cache_queries"
    prefix_hits: str = "vllm:prefix_cache_hits"
    external_queries: str = "vllm:external_prefix_cache_queries"
    external_hits: str = "vllm:external_prefix_cache_hits"
    mm_queries: str = "vllm:mm_cache_queries"
    mm_hits: str = "vllm:mm_cache_hits"
    drafts: str = "vllm:spec_decode_num_drafts"
    draft_tokens: str = "vllm:spec_decode_num_draft_tokens"
    accepted_tokens: str = "vllm:spec_decode_num_accepted_tokens"
    accepted_per_pos: str = "vllm:spec_decode_num_accepted_tokens_per_pos"
    # top's latency columns (histograms)
    ttft: str = "vllm:time_to_first_token_seconds"
    itl: str = "vllm:inter_token_latency_seconds"


def _sum_counter(engine: EngineSnapshot, name: str, label_value: str | None = None) -> float:
    """A counter summed over its label sets (model_name, ...), optionally those holding *label_value*."""
    return sum(
        v
        for (n, labels), v in engine.counters.items()
        if n == name and (label_value is None or label_value in labels)
    )


def _has_counter(engine: EngineSnapshot, name: str, label_value: str) -> bool:
    return any(n == name and label_value in labels for (n, labels) in engine.counters)


def _sum_gauge(engine: EngineSnapshot, name: str) -> float | None:
    values = [v for (n, _), v in engine.gauges.items() if n == name]
    return sum(values) if values else None


def _per_position(engine: EngineSnapshot, name: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for (n, labels), v in engine.counters.items():
        if n == name and labels:
            try:
                pos = int(labels[-1])
            except ValueError:
                continue
            out[pos] = out.get(pos, 0.0) + v
    return out


@dataclass
class EngineInterval:
    """What one engine (or the aggregate) did during one interval."""

    prompt_throughput: float = 0.0
    generation_throughput: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    preemptions: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    external_queries: float = 0.0
    external_hits: float = 0.0
    mm_queries: float = 0.0
    mm_hits: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()
    seconds: float = 0.0

    @property
    def idle(self) -> bool:
        """No tokens went through in this interval."""
        return not (self.prompt_throughput or self.generation_throughput)


def _rate(hits: float, queries: float) -> float:
    return hits / queries * 100 if queries > 0 else 0.0


def _whole(part: str, value: float) -> str:
    """A ``%d`` part of vLLM's line, or the same part with ``%s`` when *value* is not finite (a
    gauge set to inf, counters summed past the float range): ``%d`` of it raises, and logging
    would drop the whole line. Only the parts, constants, are formats; values are arguments."""
    return part if value - value == 0 else part.replace("%d", "%s")


def format_engine_line(prefix: str, iv: EngineInterval) -> tuple[str, list[Any]]:
    """vLLM's line as a %-format and its arguments (optional parts as vLLM adds them). A count
    that is not finite is written ``inf`` or ``nan``, the rest of the line as always."""
    parts = [
        "Avg prompt throughput: %.1f tokens/s",
        "Avg generation throughput: %.1f tokens/s",
        _whole("Running: %d reqs", iv.running),
        _whole("Waiting: %d reqs", iv.waiting),
    ]
    args: list[Any] = [iv.prompt_throughput, iv.generation_throughput, iv.running, iv.waiting]
    if iv.preemptions > 0:
        parts.append(_whole("Preemptions: %d", iv.preemptions))
        args.append(iv.preemptions)
    parts += ["GPU KV cache usage: %.1f%%", "Prefix cache hit rate: %.1f%%"]
    args += [iv.kv_usage * 100, _rate(iv.prefix_hits, iv.prefix_queries)]
    if iv.external_queries > 0:
        parts.append("External prefix cache hit rate: %.1f%%")
        args.append(_rate(iv.external_hits, iv.external_queries))
    if iv.mm_queries > 0:
        parts.append("MM cache hit rate: %.1f%%")
        args.append(_rate(iv.mm_hits, iv.mm_queries))
    return prefix + ", ".join(parts), args


def format_spec_line(iv: EngineInterval) -> tuple[str, list[Any]] | None:
    """vLLM's speculative-decoding line, or None when no drafts were seen in the interval."""
    if iv.drafts <= 0:
        return None
    seconds = iv.seconds or 1.0
    per_pos = ", ".join(f"{a / iv.drafts:.3f}" for a in iv.accepted_per_pos)
    return (
        "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
        "Drafted throughput: %.2f tokens/s, "
        + _whole("Accepted: %d tokens, ", iv.accepted_tokens)
        + _whole("Drafted: %d tokens, ", iv.draft_tokens)
        + "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
        [
            1 + iv.accepted_tokens / iv.drafts,
            iv.accepted_tokens / seconds,
            iv.draft_tokens / seconds,
            iv.accepted_tokens,
            iv.draft_tokens,
            per_pos,
            _rate(iv.accepted_tokens, iv.draft_tokens),
        ],
    )


def engine_intervals(
    previous: Snapshot, current: Snapshot, m: LogMetrics | None = None
) -> dict[int, EngineInterval]:
    """Per live engine, what happened between two snapshots (also used by ``redis-stats top``)."""
    seconds = max(current.time - previous.time, 1e-9)
    m = m or LogMetrics()
    out: dict[int, EngineInterval] = {}
    for engine, now in sorted(current.engines.items()):
        if not now.up:
            continue
        before = previous.engines.get(engine) or EngineSnapshot(engine, 0.0, 0.0, False)

        def delta(
            name: str,
            label: str | None = None,
            now: EngineSnapshot = now,
            before: EngineSnapshot = before,
        ) -> float:
            # max(0, ...): a counter reset (Redis lost its data) is not negative throughput.
            return max(0.0, _sum_counter(now, name, label) - _sum_counter(before, name, label))

        computed_name, computed_label = m.computed_prompt_tokens
        if _has_counter(now, computed_name, computed_label):
            prompt = delta(computed_name, computed_label)
        else:
            prompt = delta(m.prompt_tokens)
        pos_now, pos_before = (
            _per_position(now, m.accepted_per_pos),
            _per_position(before, m.accepted_per_pos),
        )
        out[engine] = EngineInterval(
            prompt_throughput=prompt / seconds,
            generation_throughput=delta(m.generation_tokens) / seconds,
            running=_sum_gauge(now, m.running) or 0.0,
            waiting=_sum_gauge(now, m.waiting) or 0.0,
            preemptions=delta(m.preemptions),
            kv_usage=_sum_gauge(now, m.kv_usage) or 0.0,
            prefix_queries=delta(m.prefix_queries),
            prefix_hits=delta(m.prefix_hits),
            external_queries=delta(m.external_queries),
            external_hits=delta(m.external_hits),
            mm_queries=delta(m.mm_queries),
            mm_hits=delta(m.mm_hits),
            drafts=delta(m.drafts),
            draft_tokens=delta(m.draft_tokens),
            accepted_tokens=delta(m.accepted_tokens),
            accepted_per_pos=tuple(max(0.0, pos_now[p] - pos_before.get(p, 0.0)) for p in sorted(pos_now)),
            seconds=seconds,
        )
    return out


def aggregate(per_engine: dict[int, EngineInterval]) -> EngineInterval:
    """Summed throughput, running, waiting and cache counts; mean KV usage (as vLLM)."""
    agg = EngineInterval()
    if not per_engine:
        return agg
    for iv in per_engine.values():
        for name in (
            "prompt_throughput",
            "generation_throughput",
            "running",
            "waiting",
            "preemptions",
            "prefix_queries",
            "prefix_hits",
            "external_queries",
            "external_hits",
            "mm_queries",
            "mm_hits",
            "drafts",
            "draft_tokens",
            "accepted_tokens",
        ):
            setattr(agg, name, getattr(agg, name) + getattr(iv, name))
        agg.seconds = iv.seconds
    agg.kv_usage = sum(iv.kv_usage for iv in per_engine.values()) / len(per_engine)
    width = max(len(iv.accepted_per_pos) for iv in per_engine.values())
    agg.accepted_per_pos = tuple(
        sum(iv.accepted_per_pos[p] for iv in per_engine.values() if p < len(iv.accepted_per_pos))
        for p in range(width)
    )
    return agg


class VllmLogLines:
    """vLLM's lines for one interval: per live engine, a DOWN line per stale engine, and the
    aggregate; an engine idle for this and the previous interval logs at DEBUG only (as vLLM).

    Keeps only the idle counts between calls (one instance per reporter).
    """

    def __init__(self, metrics: LogMetrics | None = None) -> None:
        self.metrics = metrics or LogMetrics()
        self._idle_intervals: dict[int, int] = {}

    def intervals(self, previous: Snapshot, current: Snapshot) -> dict[int, EngineInterval]:
        """Per live engine, what happened between two snapshots."""
        return engine_intervals(previous, current, self.metrics)

    def __call__(self, previous: Snapshot, current: Snapshot) -> list[Line]:
        """The lines for the interval between *previous* and *current*: (level, %-format, args)."""
        per_engine = self.intervals(previous, current)
        lines = self._engine_lines(per_engine)
        lines += _down_lines(current)
        # Over the live engines, also while others are DOWN (a fleet of one live engine of two
        # still gets its aggregate line: the line every operator greps for).
        if per_engine and len(current.engines) > 1:
            lines.append(self._aggregate_line(per_engine))
        return lines

    def _engine_lines(self, per_engine: dict[int, EngineInterval]) -> list[Line]:
        """Each live engine's line, and its speculative-decoding line when it has one."""
        lines: list[Line] = []
        for engine, iv in per_engine.items():
            idle_for = self._idle_intervals[engine] = (
                self._idle_intervals.get(engine, 0) + 1 if iv.idle else 0
            )
            # As vLLM: an engine idle for this and the previous interval logs at DEBUG only.
            level = logging.DEBUG if idle_for >= 2 else logging.INFO
            lines.append((level, *format_engine_line(f"Engine {engine:03d}: ", iv)))
            spec = format_spec_line(iv)
            if spec:
                lines.append((level, *spec))
        return lines

    def _aggregate_line(self, per_engine: dict[int, EngineInterval]) -> Line:
        """The live engines' aggregate line (DEBUG when every one of them is idle)."""
        agg = aggregate(per_engine)
        idle = all(self._idle_intervals.get(e, 0) >= 2 for e in per_engine)
        level = logging.DEBUG if idle else logging.INFO
        return (level, *format_engine_line(f"{len(per_engine)} Engines Aggregated: ", agg))


def _down_lines(current: Snapshot) -> list[Line]:
    """A DOWN line per engine that is not up, in engine order."""
    return [
        (
            logging.INFO,
            "Engine %03d: DOWN, last heartbeat %.1f s ago (its gauges are hidden)",
            [engine, e.age],
        )
        for engine, e in sorted(current.engines.items())
        if not e.up
    ]
