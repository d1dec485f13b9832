"""A simulated vLLM API server: vLLM-shaped stats at realistic rates, for the demo and benchmarks.

Each simulated API server owns the requests routed to it on one engine: requests arrive (Poisson),
wait, prefill (TTFT), decode one token per engine step (ITL), and finish by ``stop`` or
``length``. Every step it records the same objects vLLM's front end hands to stat loggers
(SchedulerStats-like and IterationStats-like), through :class:`VllmRecorder`, so the demo
exercises the real integration path.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from redis_stats.integrations.vllm.recorder import VllmRecorder

__all__ = ["LoadProfile", "SimulatedApiServer"]


@dataclass(frozen=True)
class LoadProfile:
    """How busy one simulated API server is."""

    arrivals_per_s: float = 4.0
    """Mean requests per second (Poisson arrivals)."""
    prompt_tokens: tuple[int, int] = (64, 1024)
    """Smallest and largest prompt, in tokens (uniform)."""
    output_tokens: tuple[int, int] = (16, 256)
    """Smallest and largest ``max_tokens`` of a request (uniform; 30 % of requests reach it)."""
    max_running: int = 32
    """Requests decoded at once; the rest wait."""
    step_s: float = 0.05
    """Seconds between two engine steps (:meth:`SimulatedApiServer.run`)."""
    itl_s: float = 0.03
    """Mean inter-token latency, in seconds."""
    cache_hit_fraction: float = 0.3
    """The most of a prompt the prefix cache may hold (each request: a uniform share of it)."""


@dataclass
class _Request:
    """One request, from its arrival to its last token (times are ``time.monotonic()`` seconds)."""

    prompt: int
    max_tokens: int
    arrived: float

    # Set when it is admitted (prefill starts):
    started: float = 0.0
    first_token: float = 0.0  # when its first token is due
    stop_at: int = 0  # the tokens it ends after: "length" when max_tokens, else "stop"

    # Its decoding so far:
    generated: int = 0
    decode_debt: float = 0.0
    """Fraction of a token decoded but not yet emitted (steps are not a whole number of ITLs)."""


@dataclass
class _Prefill:
    """What one step admitted: prompt tokens computed and cached, TTFTs, ``max_tokens`` asked."""

    ttfts: list[float] = field(default_factory=list)
    max_tokens: list[int] = field(default_factory=list)
    computed: int = 0  # prompt tokens
    cached: int = 0


@dataclass
class _Decode:
    """What one step decoded: tokens, their inter-token latencies, the requests it finished."""

    generated: int = 0
    itls: list[float] = field(default_factory=list)
    finished: list[SimpleNamespace] = field(default_factory=list)


@dataclass
class SimulatedApiServer:
    """Drives a recorder for one engine with a synthetic request stream."""

    recorder: VllmRecorder
    engine: int
    profile: LoadProfile = field(default_factory=LoadProfile)
    seed: int = 0
    kv_capacity_tokens: int = 65536

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._last = time.monotonic()

    def step(self, now: float | None = None) -> None:
        """Advance the simulation to *now* and record one engine-step batch."""
        now = time.monotonic() if now is None else now
        dt = max(0.0, now - self._last)
        self._last = now
        self._arrive(now, dt)
        prefill = self._admit(now)
        decode = self._decode(now, dt)
        self.recorder.record(
            self._scheduler_stats(prefill), _iteration_stats(prefill, decode), engine_idx=self.engine
        )

    def _arrive(self, now: float, dt: float) -> None:
        """Queue the requests that arrived in the last *dt* seconds."""
        rng, p = self._rng, self.profile
        for _ in range(self._poisson(p.arrivals_per_s * dt)):
            self._waiting.append(
                _Request(
                    prompt=rng.randint(*p.prompt_tokens),
                    max_tokens=rng.randint(*p.output_tokens),
                    arrived=now,
                )
            )

    def _admit(self, now: float) -> _Prefill:
        """Start waiting requests while there is room: each is prefilled, its first token due later."""
        rng, p = self._rng, self.profile
        prefill = _Prefill()
        while self._waiting and len(self._running) < p.max_running:
            req = self._waiting.pop(0)
            req.started = now
            req.first_token = now + rng.uniform(0.02, 0.2) + req.prompt / 20000
            req.stop_at = req.max_tokens if rng.random() < 0.3 else rng.randint(1, req.max_tokens)
            cached = int(req.prompt * p.cache_hit_fraction * rng.random())
            prefill.computed += req.prompt - cached
            prefill.cached += cached
            prefill.ttfts.append(req.first_token - req.arrived)
            prefill.max_tokens.append(req.max_tokens)
            self._running.append(req)
        return prefill

    def _decode(self, now: float, dt: float) -> _Decode:
        """Emit each running request's tokens due by *now*; finish those that reached their end."""
        p = self.profile
        decode = _Decode()
        for req in list(self._running):
            new = self._tokens_due(req, now, dt)
            if new <= 0:
                continue
            # As vLLM: one inter-token latency per generated token after a request's first. The
            # step's tokens of one request share the step's time, so draw once per request and
            # step around the mean (cheap: one random number, not one per token).
            latency = max(0.001, self._rng.gauss(p.itl_s, p.itl_s / 5))
            decode.itls.extend([latency] * (new - 1 if not req.generated else new))
            decode.generated += new
            req.generated += new
            if req.generated >= req.stop_at:
                self._running.remove(req)
                decode.finished.append(self._finished(req, now))
        return decode

    def _tokens_due(self, req: _Request, now: float, dt: float) -> int:
        """How many tokens *req* emits this step (0 before its first token is due)."""
        if now < req.first_token:
            return 0
        if req.generated:
            # One token every ~itl_s: the step's time in tokens, fractions carried to the next.
            req.decode_debt += dt / self.profile.itl_s
            new = int(req.decode_debt)
            req.decode_debt -= new
        else:
            new = 1  # the first token (its latency is the TTFT, not an ITL)
        return min(new, req.stop_at - req.generated)

    def _scheduler_stats(self, prefill: _Prefill) -> SimpleNamespace:
        """A SchedulerStats-like object: the queues, KV usage and the prefix cache of this step."""
        used = sum(r.prompt + r.generated for r in self._running)
        return SimpleNamespace(
            num_running_reqs=len(self._running),
            num_waiting_reqs=len(self._waiting),
            num_skipped_waiting_reqs=0,
            kv_cache_usage=min(1.0, used / self.kv_capacity_tokens),
            prefix_cache_stats=SimpleNamespace(
                queries=prefill.computed + prefill.cached, hits=prefill.cached
            ),
            connector_prefix_cache_stats=None,
            spec_decoding_stats=None,
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
            num_cached_tokens=0,
            num_preemptions=0,
        )

    def _poisson(self, lam: float) -> int:
        # Knuth's method: fine for the small means of one step.
        threshold, k, prod = pow(2.718281828459045, -lam), 0, self._rng.random()
        while prod > threshold:
            k += 1
            prod *= self._rng.random()
        return k

    def run(self, stop_event: object, duration: float | None = None) -> None:
        """Step every ``profile.step_s`` until *stop_event* is set (or *duration* passes)."""
        end = None if duration is None else time.monotonic() + duration
        while not stop_event.is_set() and (end is None or time.monotonic() < end):  # type: ignore[attr-defined]
            self.step()
            time.sleep(self.profile.step_s)


def _iteration_stats(prefill: _Prefill, decode: _Decode) -> SimpleNamespace:
    """An IterationStats-like object: the tokens, latencies and finished requests of one step."""
    return SimpleNamespace(
        num_generation_tokens=decode.generated,
        num_preempted_reqs=0,
        num_corrupted_reqs=0,
        prompt_token_stats=SimpleNamespace(
            computed=prefill.computed,
            local_cache_hit=prefill.cached,
            external_kv_transfer=0,
            cached_tokens=prefill.cached,
            total=prefill.computed + prefill.cached,
        ),
        num_prompt_tokens=prefill.computed + prefill.cached,
        time_to_first_tokens_iter=[max(0.0, t) for t in prefill.ttfts],
        inter_token_latencies_iter=decode.itls,
        n_params_iter=[1] * len(prefill.ttfts),
        max_num_generation_tokens_iter=prefill.max_tokens,
        finished_requests=decode.finished,
    )
