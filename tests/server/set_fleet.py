"""Fleets whose every number is set, as a reader's snapshots: for the exporter's history of the
live page's charts (tests/server/test_fleet_history.py) and the page drawn from it
(test_web_page.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from redis_stats import HistogramValue
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.summary import VLLM_PAGE_HISTORY
from redis_stats.server.options import PER_ENGINE
from redis_stats.snapshot import EngineSnapshot, Snapshot

CAT = vllm_catalog()
GEN, PROMPT = "vllm:generation_tokens", "vllm:prompt_tokens"
WAITING, KV = "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
TTFT, ITL = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"
BOUNDS = (0.1, 0.5, 1.0, math.inf)
NAMES = [n for n, (_m, _e, over) in VLLM_PAGE_HISTORY.items() if over != PER_ENGINE]  # the fleet's


def hist(*cumulative: float) -> HistogramValue:
    return HistogramValue(BOUNDS, tuple(float(c) for c in cumulative), 0.0)


def engine(e: int, up: bool = True, **series: dict[tuple[str, str], Any]) -> EngineSnapshot:
    """An engine whose series are ``counters={(metric, model): value}``, ``gauges=...``, ..."""

    def keyed(kind: str) -> dict[Any, Any]:
        return {(metric, (model,)): v for (metric, model), v in series.get(kind, {}).items()}

    return EngineSnapshot(
        e, 0.0, 0.5, up, counters=keyed("counters"), gauges=keyed("gauges"), histograms=keyed("histograms")
    )


def snap(t: float, *engines: EngineSnapshot) -> Snapshot:
    return Snapshot(time=t, engines={e.engine: e for e in engines}, writers={}, catalog=CAT)


def figures(point: list[Any]) -> dict[str, Any]:
    return dict(zip(NAMES, point))


def fleet_at(t: float) -> tuple[Snapshot, Snapshot]:
    """(earlier at *t* - 10, now at *t*): four engines whose every figure is set.

    Engine 0: 300 generation and 500 prompt tokens in the 10 s, 3 waiting, KV 25 %, 100 TTFT in
    (0.1, 0.5] and 10 ITL in (0, 0.1]. Engine 1, two label sets: 100 + 100 generation tokens, its
    prompt counter went down to 200 (counted from 0), 2 + 5 waiting, KV 50 % and 75 % (the engine's
    is the larger), 100 TTFT in (0.5, 1], none in its other TTFT series. Engine 2 is down (its
    numbers count nowhere). Engine 3: a NaN queue (no value), KV 50 %, 50 TTFT in (0, 0.1].
    """
    earlier = snap(
        t - 10,
        engine(
            0, counters={(GEN, "m"): 100, (PROMPT, "m"): 1000}, histograms={(TTFT, "m"): hist(0, 0, 0, 0)}
        ),
        engine(
            1,
            counters={(GEN, "m"): 50, (GEN, "n"): 0, (PROMPT, "m"): 1000},
            histograms={(TTFT, "m"): hist(0, 0, 0, 0), (TTFT, "n"): hist(100, 100, 100, 100)},
        ),
        engine(2, up=False, counters={(GEN, "m"): 0}),
        engine(3, counters={(GEN, "m"): 0}, histograms={(TTFT, "m"): hist(0, 0, 0, 0)}),
    )
    now = snap(
        t,
        engine(
            0,
            counters={(GEN, "m"): 400, (PROMPT, "m"): 1500},
            gauges={(WAITING, "m"): 3, (KV, "m"): 0.25},
            histograms={(TTFT, "m"): hist(0, 100, 100, 100), (ITL, "m"): hist(10, 10, 10, 10)},
        ),
        engine(
            1,
            counters={(GEN, "m"): 150, (GEN, "n"): 100, (PROMPT, "m"): 200},
            gauges={(WAITING, "m"): 2, (WAITING, "n"): 5, (KV, "m"): 0.5, (KV, "n"): 0.75},
            histograms={(TTFT, "m"): hist(0, 0, 100, 100), (TTFT, "n"): hist(100, 100, 100, 100)},
        ),
        engine(
            2,
            up=False,
            counters={(GEN, "m"): 10_000},
            gauges={(WAITING, "m"): 99, (KV, "m"): 1.0},
            histograms={(TTFT, "m"): hist(0, 0, 0, 100)},
        ),
        engine(
            3,
            counters={(GEN, "m"): 100},
            gauges={(WAITING, "m"): math.nan, (KV, "m"): 0.5},
            histograms={(TTFT, "m"): hist(50, 50, 50, 50)},
        ),
    )
    return earlier, now


EXPECTED = {
    "generation_tokens_per_second": 30.0 + 20.0 + 10.0,
    "prompt_tokens_per_second": 50.0 + 20.0 + 0.0,
    "kv_cache_usage_mean": (0.25 + 0.75 + 0.5) / 3,
    "kv_cache_usage_max": 0.75,
    "requests_waiting": 3.0 + 7.0 + 0.0,
    "requests_waiting_max": 7.0,
    "ttft_p99_worst": pytest.approx(0.5 + 0.5 * 0.99),  # engine 1: within (0.5, 1]
    "ttft_p99_median": pytest.approx(0.1 + 0.4 * 0.99),  # engine 0, of 0.099, 0.496 and 0.995
    "itl_p99_worst": pytest.approx(0.1 * 0.99),  # engine 0 alone has ITL observations
    "itl_p99_median": pytest.approx(0.1 * 0.99),
}


def growing(t: float) -> Snapshot:
    """A fleet read at *t* whose counters and histograms grow in proportion to *t*, so that over
    any window its figures are :data:`GROWING`: engines 0, 1 and 2 up (30, 20 and 10 generation
    tokens a second; 50, 20 and 0 prompt; 3, 7 and 0 waiting; KV 25 %, 75 %, 50 %; TTFT within
    (0.1, 0.5], (0.5, 1] and (0, 0.1]; ITL within (0, 0.1] on engine 0 only), engine 3 down."""
    return snap(
        t,
        engine(
            0,
            counters={(GEN, "m"): 30 * t, (PROMPT, "m"): 50 * t},
            gauges={(WAITING, "m"): 3, (KV, "m"): 0.25},
            histograms={(TTFT, "m"): hist(0, 10 * t, 10 * t, 10 * t), (ITL, "m"): hist(t, t, t, t)},
        ),
        engine(
            1,
            counters={(GEN, "m"): 20 * t, (PROMPT, "m"): 20 * t},
            gauges={(WAITING, "m"): 7, (KV, "m"): 0.75},
            histograms={(TTFT, "m"): hist(0, 0, 10 * t, 10 * t)},
        ),
        engine(
            2,
            counters={(GEN, "m"): 10 * t},
            gauges={(WAITING, "m"): 0, (KV, "m"): 0.5},
            histograms={(TTFT, "m"): hist(10 * t, 10 * t, 10 * t, 10 * t)},
        ),
        engine(3, up=False, counters={(GEN, "m"): 1000 * t}, gauges={(WAITING, "m"): 50}),
    )


GROWING = {
    "generation_tokens_per_second": 60.0,
    "prompt_tokens_per_second": 70.0,
    "kv_cache_usage_mean": 0.5,
    "kv_cache_usage_max": 0.75,
    "requests_waiting": 10.0,
    "requests_waiting_max": 7.0,
    "ttft_p99_worst": pytest.approx(0.5 + 0.5 * 0.99),
    "ttft_p99_median": pytest.approx(0.1 + 0.4 * 0.99),
    "itl_p99_worst": pytest.approx(0.1 * 0.99),
    "itl_p99_median": pytest.approx(0.1 * 0.99),
}
"""What :func:`growing` gives over any window of whole seconds (ITL: engine 0's alone)."""
