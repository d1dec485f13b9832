"""SGLang's model gateway's reading of ``/v1/loads``, emulated field for field from its source.

``crates/protocols/src/worker.rs`` (smg-project/smg): ``WorkerLoadResponse`` and
``SchedulerLoadSnapshot`` are ``#[derive(Deserialize)] #[serde(default)]`` structs: a field left
out takes its default (0, 0.0, "", an empty list, None), a field not in the struct is ignored, and
a field of the wrong type fails the WHOLE body (serde_json: an ``i32`` from a JSON integer within
its range only — ``5.0``, ``true``, ``null`` or ``2**31`` fail; an ``f64`` from any JSON number;
``Option<T>`` also from ``null``). ``model_gateway/src/worker/monitor.rs``: ``probe_native_loads``
classifies an answer (below), and the monitor feeds the DP-rank cache ``dp_rank -> num_used_tokens``
only when ``has_absolute_token_data``, picking the least-loaded rank of a worker from it
(``WorkerLoadManager::select_and_increment_lowest_dp_load``: the smallest load, then the smallest
rank). Nothing here imports the project: it reads bodies as the gateway does."""

from __future__ import annotations

from typing import Any

I32 = ("i32",)
F64 = ("f64",)
STRING = ("string",)

SNAPSHOT_FIELDS: dict[str, tuple[str, ...]] = {
    "dp_rank": I32,
    "num_running_reqs": I32,
    "num_waiting_reqs": I32,
    "num_waiting_uncached_tokens": I32,
    "num_total_reqs": I32,
    "num_used_tokens": I32,
    "max_total_num_tokens": I32,
    "token_usage": F64,
    "gen_throughput": F64,
    "cache_hit_rate": F64,
    "utilization": F64,
    "max_running_requests": I32,
}
SNAPSHOT_OPTIONAL = {
    "kv_transfer_latency_ms": F64,
    "kv_transfer_speed_gb_s": F64,
    "prefill_queue_reqs": I32,
    "decode_queue_reqs": I32,
    "disagg_mode": STRING,
}


class DecodeError(ValueError):
    """The body would not decode: serde_json's error."""


def _value(kind: tuple[str, ...], v: Any, where: str) -> Any:
    if kind is I32:
        if type(v) is not int or not -(2**31) <= v < 2**31:
            raise DecodeError(f"{where}: invalid type or value {v!r}, expected i32")
        return v
    if kind is F64:
        if type(v) not in (int, float):
            raise DecodeError(f"{where}: invalid type {v!r}, expected f64")
        return float(v)
    if type(v) is not str:
        raise DecodeError(f"{where}: invalid type {v!r}, expected a string")
    return v


def decode_snapshot(doc: Any, where: str = "loads[]") -> dict[str, Any]:
    """A ``SchedulerLoadSnapshot`` as serde builds it (every field, defaults filled in)."""
    if type(doc) is not dict:
        raise DecodeError(f"{where}: expected struct SchedulerLoadSnapshot, got {doc!r}")
    out: dict[str, Any] = {}
    for name, kind in SNAPSHOT_FIELDS.items():
        out[name] = _value(kind, doc[name], f"{where}.{name}") if name in doc else (0 if kind is I32 else 0.0)
    for name, kind in SNAPSHOT_OPTIONAL.items():
        v = doc.get(name)
        out[name] = None if v is None else _value(kind, v, f"{where}.{name}")
    return out


def decode_response(doc: Any) -> dict[str, Any]:
    """A ``WorkerLoadResponse`` as serde builds it; :class:`DecodeError` where serde would fail."""
    if type(doc) is not dict:
        raise DecodeError(f"expected struct WorkerLoadResponse, got {type(doc).__name__}")
    loads = doc.get("loads", [])
    if type(loads) is not list:
        raise DecodeError(f"loads: expected a sequence, got {loads!r}")
    return {
        "timestamp": _value(STRING, doc["timestamp"], "timestamp") if "timestamp" in doc else "",
        "dp_rank_count": _value(I32, doc["dp_rank_count"], "dp_rank_count") if "dp_rank_count" in doc else 0,
        "loads": [decode_snapshot(x, f"loads[{i}]") for i, x in enumerate(loads)],
    }


def probe(status: int, body: bytes) -> tuple[str, dict[str, Any] | None]:
    """``probe_native_loads``: ("available", response), ("absent", None) — remembered, never
    asked again — or ("inconclusive", None): asked again, this tick read from /metrics."""
    if status in (404, 405, 501):
        return "absent", None
    if not 200 <= status < 300:
        return "inconclusive", None
    import json

    try:
        response = decode_response(json.loads(body))
    except (DecodeError, ValueError):
        return "absent", None
    return ("available", response) if response["loads"] else ("inconclusive", None)


def dp_rank_loads(response: dict[str, Any]) -> dict[int, int] | None:
    """What the monitor puts in the DP-rank cache for this response: rank -> used tokens, or None
    (the worker is evicted from the cache) without absolute token data."""
    if not any(s["max_total_num_tokens"] > 0 for s in response["loads"]):
        return None
    return {s["dp_rank"]: s["num_used_tokens"] for s in response["loads"]}


def lowest_rank(loads: dict[int, int]) -> int:
    """``select_and_increment_lowest_dp_load``'s pick: the smallest load, then the smallest rank."""
    return min(loads.items(), key=lambda kv: (kv[1], kv[0]))[0]


def effective_token_usage(response: dict[str, Any]) -> float:
    """``WorkerLoadResponse::effective_token_usage``: the mean over the entries (0 for none)."""
    loads = response["loads"]
    return sum(s["token_usage"] for s in loads) / len(loads) if loads else 0.0
