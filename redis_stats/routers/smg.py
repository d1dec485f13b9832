"""SGLang's model gateway load document, ``GET /v1/loads``: one entry per data-parallel rank.

SGLang's model gateway (smg-project/smg) asks every backend, vLLM included, for
``GET <worker URL>/v1/loads?include=core,disagg,queues,memory`` before anything else
(``model_gateway/src/worker/monitor.rs``, ``fetch_http_load`` and ``probe_native_loads``) and
decodes the answer as ``WorkerLoadResponse {timestamp, dp_rank_count, loads}``, each entry a
``SchedulerLoadSnapshot`` (``crates/protocols/src/worker.rs``; ``#[serde(default)]``: a field left
out reads 0, an unknown one is ignored, a field of the wrong type fails the whole body). What it
does with each answer, read in that source:

- ``200`` with at least one entry: the load of the worker, rank by rank (its DP-rank cache keeps
  ``dp_rank -> num_used_tokens`` when some rank has ``max_total_num_tokens > 0``; the load-aware
  policies read ``token_usage`` as the mean over the entries, the queue as their sums).
- ``200`` with no entry, or any status but 404/405/501 (a ``503``, a timeout): inconclusive, asked
  again next tick; that tick it reads the worker's Prometheus ``/metrics`` instead.
- ``404``, ``405``, ``501``, or a ``200`` that does not decode: "this worker has no /v1/loads",
  remembered until the worker is replaced: it never asks again. So this document never answers
  those for a condition that passes (an endpoint not stored yet, Redis down): ``503``.

A rank is the engine's place in its endpoint (:mod:`redis_stats.routers.ranks`: engines {0, 2, 3}
stay ranks 0, 2 and 3), never its place in the list of what answered. A rank that is ``down``, and
one without load (live but without request counts yet, with a value no engine can have — a
negative or fractional count, :mod:`redis_stats.routers.vouch` — or not stored at all) is left
out of ``loads``: the gateway picks the least-loaded rank among those it was given, so a rank
listed at zero (or at -5) would draw every request, while a rank not listed is never picked; the
averages it takes are over the ranks listed. The document also names the left-out ranks
(``ranks_down``, ``ranks_without_load``, and why each has no load: ``withheld``), and adds
SGLang's own ``aggregate``: keys the gateway ignores.

:func:`loads_document` is pure: a :class:`redis_stats.load.LoadView` (one read of the load feed)
and an endpoint id in, (HTTP status, document) out: the exporter's views
(:mod:`redis_stats.server.views.loads`) and the vLLM middleware
(:mod:`redis_stats.integrations.vllm.get_load`) serve the same documents.
It knows no product's metric names: every number is a field of the load feed (docs/routers.md
maps each one, and says which an integration reports).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from redis_stats.load import EngineLoad, LoadView
from redis_stats.routers.ranks import missing_ranks, ranks_of
from redis_stats.routers.vouch import optional_problems, withheld

__all__ = [
    "FLEET_PATH",
    "INCLUDE_SECTIONS",
    "PATH",
    "fleet_document",
    "loads_document",
]

PATH = "/v1/loads"
"""The route the gateway asks of each worker."""

FLEET_PATH = "/loads"
"""The gateway's own fleet route (smg #2418): every worker's ranks and an ``aggregate``."""

INCLUDE_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
"""The sections ``?include=`` may name (SGLang's ``GetLoadsReqInput.VALID_SECTIONS``); every one
but ``core`` is a section this store has no numbers for, so none is ever added to an entry."""

_I32 = 2**31 - 1


def loads_document(
    view: LoadView, endpoint: str, *, include: str | None = None, dp_rank: str | None = None
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, document) of ``/v1/loads`` for *endpoint* (an id its writers store) from *view*.

    *include* and *dp_rank* are the query's values as sent (None: not given), read as SGLang's
    ``/v1/loads`` reads them: *include* a comma-separated list of :data:`INCLUDE_SECTIONS` (another
    name: ``400`` with SGLang's ``detail``); *dp_rank* one rank only (an integer, else ``400``;
    a rank with nothing to report: an empty ``loads``, as SGLang answers a rank out of range).
    ``503`` with ``error`` and ``detail`` when the endpoint has no engine in *view*
    (``unknown_endpoint``) or no rank to report (``endpoint_down``)."""
    problem = _query_problem(include, dp_rank)
    if problem is not None:
        return 400, {"detail": problem}
    engines = sorted(e for e, load in view.engines.items() if load.endpoint == endpoint)
    if not engines:
        return 503, {
            "error": "unknown_endpoint",
            "detail": f"{view.why_no_engine_behind(endpoint)}: its load is not known",
            "endpoint": endpoint,
        }
    loads, down, silent, why = _ranks(view, engines)
    if not loads:
        return 503, {
            "error": "endpoint_down",
            "detail": f"no rank of endpoint {endpoint!r} is up with request counts (down: {down}, "
            f"without counts: {silent}): its load is not known",
            "endpoint": endpoint,
            "ranks_down": down,
            "ranks_without_load": silent,
            "withheld": why,
        }
    if dp_rank is not None:
        loads = [entry for entry in loads if entry["dp_rank"] == int(dp_rank)]
    return 200, {
        "timestamp": datetime.fromtimestamp(view.time, timezone.utc).isoformat(),
        "dp_rank_count": len(loads),
        "loads": loads,
        "aggregate": _aggregate(loads),
        "endpoint": endpoint,
        "ranks_down": down,
        "ranks_without_load": silent,
        "withheld": why,
    }


def _ranks(
    view: LoadView, engines: list[int]
) -> tuple[list[dict[str, Any]], list[int], list[int], dict[str, dict[str, str]]]:
    """The entries of *engines* (an endpoint's stored engines), each with its rank, its place in
    the endpoint (:mod:`redis_stats.routers.ranks`); the ranks left out: down, and without load
    (live without request counts an engine can have, or not stored at all); and why each rank
    without load has none (rank -> field -> reason, :mod:`redis_stats.routers.vouch`)."""
    loads, down, silent = [], [], []
    why: dict[str, dict[str, str]] = {}
    place = ranks_of(engines)
    for engine in engines:
        load, rank = view.engines[engine], place[engine]
        problems = {**withheld(load), **optional_problems(load)}
        if not load.up:
            down.append(rank)
        elif problems:
            silent.append(rank)
            why[str(rank)] = problems
        else:
            loads.append(_snapshot(rank, load))
    for rank in missing_ranks(place):
        silent.append(rank)
        why[str(rank)] = {"engine": "not_stored"}
    return loads, down, sorted(silent), why


def fleet_document(view: LoadView, *, include: str | None = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, document) of the fleet: every endpoint's ranks in one ``WorkerLoadResponse``
    (each entry naming its ``worker``, the endpoint, and ``worker_type``, ``regular``: what smg
    #2418's gateway-level ``/loads`` serves, so a gateway in front of gateways reads a pool as it
    reads an engine), and the fleet ``aggregate`` over every entry. Ranks are numbered within
    their endpoint; engines with no endpoint stored are left out (``unassigned``). ``503`` when
    no rank of the fleet can be reported."""
    problem = _query_problem(include, None)
    if problem is not None:
        return 400, {"detail": problem}
    by_endpoint, unassigned = view.by_endpoint()
    loads: list[dict[str, Any]] = []
    down: dict[str, list[int]] = {}
    withheld_by: dict[str, dict[str, dict[str, str]]] = {}
    for endpoint, engines in sorted(by_endpoint.items()):
        entries, gone, silent, why = _ranks(view, engines)
        loads += [{**entry, "worker": endpoint, "worker_type": "regular"} for entry in entries]
        if gone or silent:
            down[endpoint] = sorted(gone + silent)
        if why:
            withheld_by[endpoint] = why
    if not loads:
        return 503, _why_no_rank(view, by_endpoint, unassigned)
    return 200, {
        "timestamp": datetime.fromtimestamp(view.time, timezone.utc).isoformat(),
        "dp_rank_count": len(loads),
        "loads": loads,
        "aggregate": _aggregate(loads),
        "workers": len(by_endpoint),
        "ranks_not_reported": down,
        "withheld": withheld_by,
        "unassigned": unassigned,
    }


def _why_no_rank(view: LoadView, by_endpoint: dict[str, list[int]], unassigned: list[int]) -> dict[str, Any]:
    """The ``503`` document of a fleet with no rank to list, naming the true cause: no engine
    stored, no engine storing an endpoint (ranks are an endpoint's), or every endpoint's ranks
    down or without request counts."""
    if not view.engines:
        return {
            "error": "no_engines",
            "detail": "this namespace holds no engine's load (nothing has written here with the load "
            "feed: check the namespace, and that the writers run)",
        }
    if not by_endpoint:
        return {
            "error": "no_endpoints",
            "detail": f"no engine stores an endpoint (engines {unassigned[:10]}"
            f"{' ...' if len(unassigned) > 10 else ''} have none), and ranks are an endpoint's: give "
            "their writers one (REDIS_STATS_ENDPOINT, or endpoint=); GET /load lists every engine",
            "unassigned": unassigned,
        }
    ranks = {
        endpoint: sorted(ranks_of(engines).values()) for endpoint, engines in sorted(by_endpoint.items())
    }
    return {
        "error": "fleet_down",
        "detail": "no rank of any endpoint is up with request counts (down, or live without "
        "counts yet): the fleet's load is not known"
        + (f"; engines {unassigned[:10]} store no endpoint" if unassigned else ""),
        "ranks_not_reported": ranks,
        "unassigned": unassigned,
    }


def _query_problem(include: str | None, dp_rank: str | None) -> str | None:
    """What is wrong with the query's *include* and *dp_rank* (None: nothing)."""
    if include:  # SGLang: `include.split(",")` when given and not empty, else every section
        unknown = {s.strip() for s in include.split(",")} - INCLUDE_SECTIONS
        if unknown:
            return f"Invalid include sections: {unknown}. Valid options: {sorted(INCLUDE_SECTIONS)}"
    if dp_rank is not None:
        text = dp_rank.strip()
        if not (text.lstrip("-").isdigit() and text.isascii() and len(text) < 12):
            return f"dp_rank={dp_rank!r} is not an integer (a data-parallel rank of this endpoint)"
    return None


def _snapshot(rank: int, load: EngineLoad) -> dict[str, Any]:
    """One rank's ``SchedulerLoadSnapshot``: the integers SMG reads as ``i32`` written as JSON
    integers (a ``5.0`` fails its decoding), the others as numbers; a field the store has no
    number for is 0, as the gateway reads a missing one."""
    running, waiting = _i32(load.requests_running), _i32(load.requests_waiting)
    usage, capacity = load.kv_cache_usage, load.kv_cache_capacity_tokens
    used = usage * capacity if usage is not None and capacity is not None else None
    queries, hits = load.prefix_cache_queries_per_second, load.prefix_cache_hits_per_second
    hit_rate = hits / queries if queries and hits is not None and queries > 0 else 0.0
    return {
        "dp_rank": rank,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": 0,
        "num_total_reqs": _i32((load.requests_running or 0.0) + (load.requests_waiting or 0.0)),
        "num_used_tokens": _i32(used),
        "max_total_num_tokens": _i32(capacity),
        "token_usage": _f64(usage),
        "gen_throughput": _f64(load.generation_tokens_per_second),
        "cache_hit_rate": _f64(hit_rate),
        "utilization": 0.0,
        "max_running_requests": _i32(load.max_running_requests),
        "engine": load.engine,
        # keys the gateway ignores: requests counted where they landed, routers' bookings not yet
        # counted, their sum (docs/routers.md, "Router replicas"; null: not counted)
        "in_flight": None if load.in_flight is None else _i32(load.in_flight),
        "booked": load.booked,
        "expected_in_flight": None if load.expected_in_flight is None else _i32(load.expected_in_flight),
    }


def _i32(value: float | None) -> int:
    """*value* rounded into SMG's ``i32`` (0 when not known, clamped at its range)."""
    if value is None or value != value:
        return 0
    if math.isinf(value):
        return _I32 if value > 0 else -_I32 - 1
    return max(-_I32 - 1, min(_I32, round(value)))


def _f64(value: float | None) -> float:
    """*value* as a finite JSON number (0.0 when not known; past the float range, its limit)."""
    if value is None or value != value:
        return 0.0
    return float(max(-1.7976931348623157e308, min(1.7976931348623157e308, value)))


def _aggregate(loads: list[dict[str, Any]]) -> dict[str, Any]:
    """SGLang's ``aggregate`` of the entries (``_compute_aggregate`` in its ``v1_loads.py``)."""
    running = sum(d["num_running_reqs"] for d in loads)
    waiting = sum(d["num_waiting_reqs"] for d in loads)
    return {
        "total_running_reqs": running,
        "total_waiting_reqs": waiting,
        "total_reqs": running + waiting,
        "avg_token_usage": _mean(loads, "token_usage", 4),
        "avg_throughput": _mean(loads, "gen_throughput", 2),
        "avg_utilization": _mean(loads, "utilization", 4),
    }


def _mean(loads: list[dict[str, Any]], key: str, digits: int) -> float:
    """The mean of *key* over *loads*, rounded as SGLang rounds it (0.0 for none; finite: strict
    JSON has no infinity, and a body that does not decode is a body the gateway never asks again)."""
    if not loads:
        return 0.0
    return round(_f64(sum(d[key] for d in loads) / len(loads)), digits)  # inf past the range: clamped
