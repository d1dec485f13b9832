"""``/get_load``: one endpoint's true load, in the shapes vllm-router and sglang-router poll.

vllm-router (``--policy power_of_two``) polls ``GET <worker URL>/get_load`` and reads
``{"load": N}`` (an integer: its source reads it with serde_json's ``as_i64``): :func:`endpoint_answer`.
sglang-router (0.3.x, before it read ``/v1/loads``) reads a JSON list of ranks and sums them:
:func:`rank_list_answer`. The load is summed over the endpoint's **live** engines (``up`` or
``stale``, the one rule of every view; a ``down`` engine is left out), as the load feed holds
them (``redis_stats.load``): each engine's ``expected_in_flight``, its requests in flight where its
front end counts them (``in_flight``, else running plus waiting) plus the routers' bookings not
yet counted (``booked``): so a router that only polls ``/get_load`` sees every replica's
dispatches once they land, with no change to it (docs/routers.md, "Router replicas").

Both are pure: an endpoint id and its engines' loads (one read of the load feed) in, (HTTP
status, document) out. The exporter serves them (``/get_load?endpoint=<id>``,
:mod:`redis_stats.server.views.get_load`), and so does the vLLM middleware on vLLM's own port
(:mod:`redis_stats.integrations.vllm.get_load`).

What they never answer is a wrong number: no engine of the endpoint live, or an engine that
reports no request counts: ``503`` with a JSON ``error`` and ``detail``.
"""

from __future__ import annotations

import math
from typing import Any

from redis_stats.load import EngineLoad, LoadView
from redis_stats.routers.ranks import ranks_of
from redis_stats.routers.vouch import NOT_REPORTED, describe, impossible, withheld

__all__ = ["PATH", "endpoint_answer", "engines_of", "rank_list_answer"]

PATH = "/get_load"
"""The route vllm-router and sglang-router poll on each worker."""


def engines_of(view: LoadView, endpoint: str) -> list[EngineLoad]:
    """The engines of *view* served behind *endpoint*, in engine order."""
    return [view.engines[e] for e in sorted(view.engines) if view.engines[e].endpoint == endpoint]


def endpoint_answer(endpoint: str, mine: list[EngineLoad]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, document) of ``/get_load`` for *endpoint* whose engines' loads are *mine*."""
    live = [e for e in mine if e.up]
    down = [e.engine for e in mine if not e.up]
    if not live:
        return 503, {
            "error": "endpoint_down",
            "detail": f"no engine of endpoint {endpoint!r} is up (engines {down} are down): "
            "its load is not known",
            "endpoint": endpoint,
        }
    silent = {e.engine: why for e in live if (why := withheld(e)) and not _counts_arrivals(e, why)}
    running = sum(e.requests_running or 0.0 for e in live)
    waiting = sum(e.requests_waiting or 0.0 for e in live)
    in_flight = [e.in_flight for e in live if e.in_flight is not None]
    booked = sum(e.booked or 0 for e in live)
    load = sum(e.expected_in_flight or 0.0 for e in live)
    if silent:
        return 503, {
            "error": "no_load",
            "detail": f"engines {sorted(silent)} of endpoint {endpoint!r} report no request counts an "
            f"engine can have ({'; '.join(f'{e}: {describe(w)}' for e, w in sorted(silent.items()))}): "
            "a writer without the load feed, no step recorded yet, or a bad gauge",
            "endpoint": endpoint,
            "withheld": {str(e): w for e, w in sorted(silent.items())},
        }
    if not math.isfinite(running + waiting + load):  # every count finite, their sum past the float range
        return 503, {
            "error": "no_load",
            "detail": f"the requests of engines {[e.engine for e in live]} of endpoint {endpoint!r} "
            "add up past the float range: no load to serve",
            "endpoint": endpoint,
        }
    return 200, {
        # An integer: vllm-router reads it with as_i64, which reads 5.0 as nothing.
        "load": round(load),
        "running": round(running),
        "waiting": round(waiting),
        # requests counted where they landed (null: no front end of the endpoint counts them)
        "in_flight": round(sum(in_flight)) if in_flight else None,
        "booked": booked,
        "endpoint": endpoint,
        "engines": [e.engine for e in live],
        "engines_down": down,
        "age_seconds": round(max(e.age_seconds for e in live), 3),
    }


def _counts_arrivals(load: EngineLoad, why: dict[str, str]) -> bool:
    """Whether *load*'s engine has a load without running and waiting counts of its own: its
    front end counts its requests in flight, and it reports no count (one it reports that no
    engine can have is still withheld)."""
    return impossible("in_flight", load.in_flight) is None and set(why.values()) == {NOT_REPORTED}


def rank_list_answer(endpoint: str, mine: list[EngineLoad]) -> tuple[int, Any]:
    """(HTTP status, document) of ``/get_load`` in the form sglang-router reads (0.3.x: a JSON
    list, ``num_tokens`` summed over its entries, ``WorkerManager::parse_load_response``): one
    entry per live rank of *endpoint*, ``{"dp_rank", "num_reqs", "num_waiting_reqs",
    "num_tokens"}`` as SGLang's own ``/get_load`` (``num_tokens`` the rank's used KV token slots,
    KV usage x capacity: SGLang adds its waiting prompts' tokens, which vLLM does not count).
    ``503`` when a live rank's requests or KV capacity are not known."""
    status, doc = endpoint_answer(endpoint, mine)
    if status != 200:
        return status, doc
    ranks = []
    place = ranks_of(e.engine for e in mine)
    for load in mine:
        rank = place[load.engine]
        if not load.up:
            continue
        usage, capacity = load.kv_cache_usage, load.kv_cache_capacity_tokens
        bad = withheld(load, ("kv_cache_usage", "kv_cache_capacity_tokens"))
        tokens = None if bad or usage is None or capacity is None else usage * capacity
        if tokens is None or not math.isfinite(tokens):
            return 503, {
                "error": "no_tokens",
                "detail": f"engine {load.engine} of endpoint {endpoint!r} reports no KV usage and capacity "
                "(vllm:kv_cache_usage_perc, vllm:cache_config_info): its used tokens are not known",
                "endpoint": endpoint,
            }
        running, waiting = round(load.requests_running or 0.0), round(load.requests_waiting or 0.0)
        ranks.append(
            {
                "dp_rank": rank,
                "num_reqs": running + waiting,
                "num_waiting_reqs": waiting,
                "num_tokens": round(tokens),
            }
        )
    return 200, ranks
