"""Simulated vLLM engines: vLLM-shaped stats at realistic rates, for ``redis-stats simulate``, the
demo and the benchmarks.

A :class:`SimulatedEngine` owns the requests routed to one engine: requests arrive (Poisson, at a
rate that may rise and fall: :class:`LoadProfile`'s bursts), wait while the batch or the KV cache is
full (past ``max_waiting`` they are rejected, as vLLM's queue limits do), prefill (TTFT), decode one
token per inter-token latency (slower as the batch fills), are preempted when the KV cache
overflows, and finish by ``stop`` or ``length``. Every step records, through
:class:`VllmRecorder`, the objects vLLM's front end hands to stat loggers (SchedulerStats-like and
IterationStats-like): each request by the API server it came through, the engine's queues and KV
usage by every one of them. :class:`SimulatedApiServer` is an engine with one API server.

:class:`FleetLoad` is the shape of a fleet's load (the demo and ``redis-stats simulate`` both use
it): most engines steady below their capacity, a few *hot* ones whose bursts exceed it for a while
(their queue rises, KV usage follows, TTFT and ITL climb) and then drain; every queue is bounded.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

from redis_stats.integrations.vllm.recorder import VllmFeatures, VllmRecorder

__all__ = ["CACHE_BLOCK_SIZE", "FleetLoad", "LoadProfile", "SimulatedApiServer", "SimulatedEngine"]

# The share of a burst cycle during which arrivals rise above the base rate and fall back.
BURST_SHARE = 0.4
# Prompt tokens a simulated engine prefills per second (the prefill part of a TTFT).
PREFILL_TOKENS_PER_S = 20_000.0
# Tokens per KV-cache block, as vLLM's default block_size.
CACHE_BLOCK_SIZE = 16
# Share of finished requests whose blocks are sampled as evicted (vllm:kv_block_* histograms).
EVICTION_SAMPLE = 0.1
# Acceptance rate of the first speculative position; each next one is this times the previous.
SPEC_ACCEPTANCE = 0.7


@dataclass(frozen=True)
class LoadProfile:
    """How busy one simulated engine is (or the share of it one API server sees)."""

    arrivals_per_s: float = 4.0
    """Mean requests per second (Poisson arrivals), at the base of the bursts."""
    prompt_tokens: tuple[int, int] = (64, 1024)
    """Smallest and largest prompt, in tokens (uniform)."""
    output_tokens: tuple[int, int] = (16, 256)
    """Smallest and largest ``max_tokens`` of a request (uniform; 30 % of requests reach it)."""
    max_running: int = 32
    """Requests decoded at once; the rest wait."""
    step_s: float = 0.05
    """Seconds between two engine steps (:meth:`SimulatedEngine.run`)."""
    itl_s: float = 0.03
    """Mean inter-token latency with an empty batch, in seconds."""
    cache_hit_fraction: float = 0.3
    """The most of a prompt the prefix cache may hold (each request: a uniform share of it)."""
    burst_period: float = 0.0
    """Seconds of one burst cycle (0: steady arrivals). For the first ``BURST_SHARE`` of each cycle
    the arrival rate rises smoothly to ``burst_peak`` times ``arrivals_per_s`` and falls back."""
    burst_peak: float = 1.0
    """The arrival rate at the top of a burst, as a multiple of ``arrivals_per_s``."""
    burst_phase: float = 0.0
    """Where in its cycle the engine is at wall-clock time 0 (0..1): hot engines burst in turn."""
    max_waiting: int = 0
    """Waiting requests past which an arrival is rejected (vLLM's ``max_num_queued_reqs``, counted in
    ``vllm:admission_rejections``); 0: no limit."""
    batch_slowdown: float = 0.0
    """How much slower a token comes with a full batch: ITL x (1 + this x running / max_running)."""
    spec_tokens: int = 0
    """Speculative tokens per draft (0: no speculative-decoding stats)."""
    kv_bound: bool = False
    """Whether the KV cache bounds the batch: a request waits until its blocks fit, and the newest
    is preempted when decoding outgrows the cache (False: the usage reported is clipped at 1)."""

    def arrival_factor(self, t: float) -> float:
        """The arrival rate at time *t* (seconds) as a multiple of ``arrivals_per_s``."""
        if self.burst_period <= 0:
            return 1.0
        x = (t / self.burst_period + self.burst_phase) % 1.0
        if x >= BURST_SHARE:
            return 1.0
        return 1.0 + (self.burst_peak - 1.0) * math.sin(math.pi * x / BURST_SHARE) ** 2

    def capacity_per_s(self) -> float:
        """Requests per second the engine finishes with a full batch (an estimate, which sizes the
        fleet's rates): ``max_running`` over a request's mean duration at the full batch's ITL."""
        lo, hi = self.output_tokens
        mean_max = (lo + hi) / 2
        tokens = 0.3 * mean_max + 0.7 * (mean_max + 1) / 2  # 30 % reach max_tokens, the rest stop
        prefill = 0.11 + sum(self.prompt_tokens) / 2 / PREFILL_TOKENS_PER_S
        return self.max_running / (tokens * self.itl_s * (1 + self.batch_slowdown) + prefill)

    def share(self, fraction: float) -> LoadProfile:
        """The part of this engine one of several API-server processes simulates on its own
        (arrivals, running slots and queue scaled by *fraction*)."""
        return replace(
            self,
            arrivals_per_s=self.arrivals_per_s * fraction,
            max_running=max(1, round(self.max_running * fraction)),
            max_waiting=max(1, round(self.max_waiting * fraction)) if self.max_waiting else 0,
        )


@dataclass(frozen=True)
class FleetLoad:
    """The load of a simulated fleet of engines ``0 .. engines - 1``: one engine in every
    *hot_every* is hot (its bursts exceed its capacity, then it drains), the others run steady at
    20-50 % of theirs with slow waves. Every engine's queue is bounded (``max_waiting``).

    *scale* multiplies every arrival rate (below 1: fewer tokens to simulate per engine, for a big
    fleet on a small machine); *period* is a hot engine's burst cycle in seconds.
    """

    engines: int
    period: float = 60.0
    scale: float = 1.0
    hot_every: int = 0
    """0: chosen from the fleet's size (2 engines: 1 hot, 10: 2, 64: 1, 1,024: 16)."""
    kv_capacity_tokens: int = 12_288
    """Each engine's KV cache, in tokens (``num_gpu_blocks`` x ``CACHE_BLOCK_SIZE``)."""

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise ValueError(f"engines={self.engines!r}: a fleet has at least one engine")
        if not self.period > 0:
            raise ValueError(f"period={self.period!r} must be a positive number of seconds")
        if not self.scale > 0:
            raise ValueError(f"scale={self.scale!r} must be a positive multiple of the arrival rates")

    @property
    def every(self) -> int:
        """One engine in this many is hot."""
        if self.hot_every > 0:
            return self.hot_every
        return min(64, max(2, 1 << (self.engines.bit_length() - 1)))  # 2 -> 2, 10 -> 8, 1,024 -> 64

    def hot(self) -> list[int]:
        """The hot engines."""
        return [e for e in range(self.engines) if self.is_hot(e)]

    def is_hot(self, engine: int) -> bool:
        """Whether *engine* is one of the hot engines."""
        return engine % self.every == 1 % self.every

    def profile(self, engine: int) -> LoadProfile:
        """The load of *engine* as a whole (all its API servers together)."""
        base = LoadProfile(
            max_running=16,
            max_waiting=64,
            step_s=0.05,
            batch_slowdown=0.5,
            spec_tokens=3,
            kv_bound=True,
        )
        capacity = base.capacity_per_s()
        if self.is_hot(engine):
            hot = self.hot()
            turn = hot.index(engine) if engine < self.engines else 0
            return replace(
                base,
                arrivals_per_s=0.55 * capacity * self.scale,
                burst_period=self.period,
                burst_peak=2.6,
                burst_phase=turn / max(1, len(hot)),
            )
        golden = (engine * 0.6180339887) % 1.0  # spreads the steady engines' loads and phases
        return replace(
            base,
            arrivals_per_s=(0.2 + 0.3 * golden) * capacity * self.scale,
            burst_period=5 * self.period,
            burst_peak=1.3,
            burst_phase=golden,
        )

    @staticmethod
    def features() -> VllmFeatures:
        """The vLLM features the simulated fleet records: speculative decoding (3 positions) and
        ``--kv-cache-metrics`` on top of the defaults, so every family of a busy engine has data."""
        return VllmFeatures(spec_decoding=True, num_spec_tokens=3, kv_cache_metrics=True)

    def cache_config(self, fraction: float = 1.0) -> dict[str, str]:
        """``vllm:cache_config_info``'s labels of an engine (or of a *fraction* of it), as
        vLLM's ``CacheConfig.metrics_info()`` gives them: the KV capacity of ``/load`` is read
        from ``num_gpu_blocks`` x ``block_size``."""
        return {
            "block_size": str(CACHE_BLOCK_SIZE),
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "0",
            "num_gpu_blocks": str(max(1, int(self.kv_capacity_tokens * fraction) // CACHE_BLOCK_SIZE)),
            "prefix_caching_hash_algo": "sha256",
            "swap_space": "4",
        }


@dataclass
class _Request:
    """One request, from its arrival to its last token (times are ``time.monotonic()`` seconds)."""

    prompt: int
    max_tokens: int
    arrived: float
    api: int  # the API server it came through

    # Set when it is first admitted (prefill starts):
    started: float = 0.0
    first_token: float = 0.0  # when its first token is due
    stop_at: int = 0  # the tokens it ends after: "length" when max_tokens, else "stop"
    cached: int = 0  # prompt tokens the prefix cache held

    # Its decoding so far:
    generated: int = 0
    decode_debt: float = 0.0
    """Fraction of a token decoded but not yet emitted (steps are not a whole number of ITLs)."""
    preemptions: int = 0


@dataclass
class _Batch:
    """What one step did for the requests of one API server: prefill, decode, finished, rejected."""

    ttfts: list[float] = field(default_factory=list)
    max_tokens: list[int] = field(default_factory=list)
    computed: int = 0  # prompt tokens
    cached: int = 0
    generated: int = 0
    itls: list[float] = field(default_factory=list)
    finished: list[SimpleNamespace] = field(default_factory=list)
    preempted: int = 0
    evictions: list[SimpleNamespace] = field(default_factory=list)


class SimulatedEngine:
    """Drives one recorder per API server for one engine with a synthetic request stream.

    Requests go to the API servers in turn; each request's tokens, latencies and finish are
    recorded by its own API server's recorder, the engine's queues and KV usage by every one
    (they are the engine's, the same for all: the newest write wins).
    """

    def __init__(
        self,
        recorders: Sequence[VllmRecorder],
        engine: int,
        profile: LoadProfile | None = None,
        *,
        seed: int = 0,
        kv_capacity_tokens: int = 65536,
    ) -> None:
        if not recorders:
            raise ValueError("a simulated engine needs at least one recorder (one per API server)")
        self.recorders = list(recorders)
        self.engine = engine
        self.profile = profile or LoadProfile()
        self.seed = seed
        self.kv_capacity_tokens = kv_capacity_tokens
        self._rng = random.Random(seed)
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._used = 0  # KV tokens held by the running requests
        self._next_api = 0
        self._last = time.monotonic()
        # Bursts follow the wall clock, so every process simulating a part of one engine (the
        # demo's API servers) bursts at the same moments.
        self._wall = time.time() - time.monotonic()
        self.rejected = 0
        """Arrivals rejected so far because ``max_waiting`` requests were waiting."""
        self.generated = 0
        """Tokens generated so far (every API server's)."""
        self.finished = 0
        """Requests finished so far."""

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests running now."""
        return len(self._running)

    @property
    def kv_usage(self) -> float:
        """The share of the KV cache the running requests hold now (0 to 1)."""
        return min(1.0, self._used / self.kv_capacity_tokens)

    def step(self, now: float | None = None) -> None:
        """Advance the simulation to *now* and record one engine-step batch."""
        now = time.monotonic() if now is None else now
        dt = max(0.0, now - self._last)
        self._last = now
        batches = [_Batch() for _ in self.recorders]
        self._arrive(now, dt)
        self._admit(now, batches)
        self._decode(now, dt, batches)
        self._preempt(batches)
        usage = self.kv_usage
        for recorder, batch in zip(self.recorders, batches):
            self.generated += batch.generated
            self.finished += len(batch.finished)
            recorder.record(
                self._scheduler_stats(batch, usage), self._iteration_stats(batch), engine_idx=self.engine
            )

    def _arrive(self, now: float, dt: float) -> None:
        """Queue the requests that arrived in the last *dt* seconds (each at its own moment)."""
        rng, p = self._rng, self.profile
        rate = p.arrivals_per_s * p.arrival_factor(now + self._wall)
        for _ in range(self._poisson(rate * dt)):
            api = self._next_api
            self._next_api = (api + 1) % len(self.recorders)
            if p.max_waiting and len(self._waiting) >= p.max_waiting:
                self.rejected += 1
                self.recorders[api].record_admission_rejection("max_num_queued_reqs")
                continue
            self._waiting.append(
                _Request(
                    prompt=rng.randint(*p.prompt_tokens),
                    max_tokens=rng.randint(*p.output_tokens),
                    arrived=now - rng.random() * dt,
                    api=api,
                )
            )

    def _admit(self, now: float, batches: list[_Batch]) -> None:
        """Start waiting requests while a batch slot and their KV blocks are free: each is
        prefilled (a preempted one again, prompt and tokens so far), its first token due later."""
        rng, p = self._rng, self.profile
        prefilled = 0
        while self._waiting and len(self._running) < p.max_running:
            req = self._waiting[0]
            need = req.prompt + req.generated
            if p.kv_bound and self._used + need > self.kv_capacity_tokens and self._running:
                break  # no room in the KV cache: it waits (a request alone always runs)
            self._waiting.pop(0)
            batch = batches[req.api]
            if req.preemptions:  # resumed: its prompt and tokens so far computed again
                batch.computed += need
                prefilled += need
            else:
                req.started = now
                req.cached = int(req.prompt * p.cache_hit_fraction * rng.random())
                prefilled += req.prompt - req.cached
                req.first_token = now + rng.uniform(0.02, 0.2) + prefilled / PREFILL_TOKENS_PER_S
                req.stop_at = req.max_tokens if rng.random() < 0.3 else rng.randint(1, req.max_tokens)
                batch.computed += req.prompt - req.cached
                batch.cached += req.cached
                batch.ttfts.append(req.first_token - req.arrived)
                batch.max_tokens.append(req.max_tokens)
            self._used += need
            self._running.append(req)

    def _decode(self, now: float, dt: float, batches: list[_Batch]) -> None:
        """Emit each running request's tokens due by *now*; finish those that reached their end."""
        p = self.profile
        # A fuller batch decodes each request's tokens more slowly.
        itl = p.itl_s * (1 + p.batch_slowdown * len(self._running) / p.max_running)
        for req in list(self._running):
            new = self._tokens_due(req, now, dt, itl)
            if new <= 0:
                continue
            batch = batches[req.api]
            # As vLLM: one inter-token latency per generated token after a request's first. The
            # step's tokens of one request share the step's time, so draw once per request and
            # step around the mean (cheap: one random number, not one per token).
            latency = max(0.001, self._rng.gauss(itl, itl / 5))
            batch.itls.extend([latency] * (new - 1 if not req.generated else new))
            batch.generated += new
            req.generated += new
            self._used += new
            if req.generated >= req.stop_at:
                self._running.remove(req)
                self._used -= req.prompt + req.generated
                batch.finished.append(self._finished(req, now))
                if self._rng.random() < EVICTION_SAMPLE:
                    batch.evictions.append(self._eviction(req, now))

    def _tokens_due(self, req: _Request, now: float, dt: float, itl: float) -> int:
        """How many tokens *req* emits this step (0 before its first token is due)."""
        if now < req.first_token:
            return 0
        if req.generated:
            # One token every ~itl: the step's time in tokens, fractions carried to the next.
            req.decode_debt += dt / itl
        else:
            # The first token (its latency is the TTFT, not an ITL), and those due since it: a
            # step of a second spans many ITLs.
            req.decode_debt = 1 + (now - req.first_token) / itl
        new = int(req.decode_debt)
        req.decode_debt -= new
        return min(new, req.stop_at - req.generated)

    def _preempt(self, batches: list[_Batch]) -> None:
        """While the running requests' KV outgrows the cache, the newest one is preempted: back
        to the head of the queue, its blocks freed (recomputed when it is admitted again)."""
        while self.profile.kv_bound and self._used > self.kv_capacity_tokens and len(self._running) > 1:
            req = self._running.pop()
            self._used -= req.prompt + req.generated
            req.preemptions += 1
            batches[req.api].preempted += 1
            self._waiting.insert(0, req)

    def _scheduler_stats(self, batch: _Batch, usage: float) -> SimpleNamespace:
        """A SchedulerStats-like object: the engine's queues and KV usage, the prefix cache and
        speculative decoding of the requests of one API server."""
        return SimpleNamespace(
            num_running_reqs=len(self._running),
            num_waiting_reqs=len(self._waiting),
            num_skipped_waiting_reqs=0,
            kv_cache_usage=usage,
            prefix_cache_stats=SimpleNamespace(queries=batch.computed + batch.cached, hits=batch.cached),
            connector_prefix_cache_stats=None,
            spec_decoding_stats=self._spec_decoding(batch.generated),
            kv_cache_eviction_events=batch.evictions,
        )

    def _spec_decoding(self, generated: int) -> SimpleNamespace | None:
        """SpecDecodingStats-like: drafts that produced *generated* tokens (each draft yields its
        accepted tokens and one more), accepted per position at a falling rate."""
        k = self.profile.spec_tokens
        if k <= 0 or generated <= 0:
            return None
        rates = [SPEC_ACCEPTANCE ** (i + 1) for i in range(k)]
        drafts = max(1, round(generated / (1 + sum(rates))))
        per_pos = [round(drafts * r) for r in rates]
        return SimpleNamespace(
            num_drafts=drafts,
            num_draft_tokens=drafts * k,
            num_accepted_tokens=sum(per_pos),
            num_accepted_tokens_per_pos=per_pos,
        )

    def _iteration_stats(self, batch: _Batch) -> SimpleNamespace:
        """An IterationStats-like object: the tokens, latencies and finished requests of one step."""
        return SimpleNamespace(
            num_generation_tokens=batch.generated,
            num_preempted_reqs=batch.preempted,
            num_corrupted_reqs=0,
            prompt_token_stats=SimpleNamespace(
                computed=batch.computed,
                local_cache_hit=batch.cached,
                external_kv_transfer=0,
                cached_tokens=batch.cached,
                total=batch.computed + batch.cached,
            ),
            num_prompt_tokens=batch.computed + batch.cached,
            time_to_first_tokens_iter=[max(0.0, t) for t in batch.ttfts],
            inter_token_latencies_iter=batch.itls,
            n_params_iter=[1] * len(batch.ttfts),
            max_num_generation_tokens_iter=batch.max_tokens,
            finished_requests=batch.finished,
        )

    def _finished(self, req: _Request, now: float) -> SimpleNamespace:
        decode = max(0.0, now - req.first_token)
        return SimpleNamespace(
            finish_reason="length" if req.generated >= req.max_tokens else "stop",
            e2e_latency=now - req.arrived,
            num_prompt_tokens=req.prompt,
            num_generation_tokens=req.generated,
            max_tokens_param=req.max_tokens,
            queued_time=req.started - req.arrived,
            prefill_time=max(0.0, req.first_token - req.started),
            inference_time=now - req.started,
            decode_time=decode,
            mean_time_per_output_token=decode / max(1, req.generated - 1),
            num_cached_tokens=req.cached,
            num_preemptions=req.preemptions,
        )

    def _eviction(self, req: _Request, now: float) -> SimpleNamespace:
        """A sampled KV-block eviction (vLLM's KVCacheEvictionEvent) of a finished request's blocks."""
        idle = self._rng.uniform(0.5, 30.0)
        return SimpleNamespace(
            lifetime_seconds=now - req.started + idle,
            idle_seconds=idle,
            reuse_gaps_seconds=(self._rng.uniform(0.1, 10.0),) if req.cached else (),
        )

    def _poisson(self, lam: float) -> int:
        if lam > 30:  # Knuth's loop is slow for large means: the normal approximation
            return max(0, round(self._rng.gauss(lam, math.sqrt(lam))))
        # Knuth's method: fine for the small means of one step.
        threshold, k, prod = math.exp(-lam), 0, self._rng.random()
        while prod > threshold:
            k += 1
            prod *= self._rng.random()
        return k

    def run(self, stop_event: Any, duration: float | None = None) -> None:
        """Step every ``profile.step_s`` until *stop_event* is set (or *duration* passes)."""
        end = None if duration is None else time.monotonic() + duration
        while not stop_event.is_set() and (end is None or time.monotonic() < end):
            self.step()
            stop_event.wait(self.profile.step_s)


class SimulatedApiServer(SimulatedEngine):
    """One engine seen by one API server: every request goes through *recorder*."""

    def __init__(
        self,
        recorder: VllmRecorder,
        engine: int,
        profile: LoadProfile | None = None,
        seed: int = 0,
        kv_capacity_tokens: int = 65536,
    ) -> None:
        super().__init__([recorder], engine, profile, seed=seed, kv_capacity_tokens=kv_capacity_tokens)
        self.recorder = recorder
