"""Endpoint views: one series per family for a router that keeps one (the Model Server Protocol).

A router such as the Gateway API inference extension's endpoint picker (llm-d-router) scrapes
each endpoint's ``/metrics`` for a few families and keeps **one series per family**: with several
data-parallel engines behind one API server it keeps whichever series came last and ignores the
others. An endpoint view (``/metrics?endpoint=<id>``, redis_stats/server/states/endpoints.py) serves
each of those families as exactly one series, aggregated over the endpoint's live engines by the
rule of the family's **role**:

=================  ==========================================================================
role               the one series
=================  ==========================================================================
``waiting``        the sum over the live engines (requests queued)
``running``        the sum (requests running)
``kv_usage``       the largest (the fullest engine's KV cache: the one a request may not fit)
``cache_config``   an info series (value 1): ``num_gpu_blocks`` the engines' sum, their common
                   ``block_size`` (engines of different block sizes, or none known: left out)
``lora``           an info series: ``running_lora_adapters`` and ``waiting_lora_adapters`` the
                   union of the engines' newest lists, ``max_lora`` the largest, the value the
                   newest (a timestamp)
=================  ==========================================================================

A family is served as the one series only when **every** live engine of the endpoint has a series
of it with a number (the rule ``/get_load`` follows): an engine that has not reported it yet, or
reports NaN, makes the family **withheld** (:class:`Withheld`: which engine, and why), never a
total of the others served as the endpoint's.

The core knows roles, never a product's names: an integration declares which family plays which
role (:class:`FamilyRole`; vLLM's in ``redis_stats.integrations.vllm.roles``, SGLang's and
TensorRT-LLM's in ``redis_stats.integrations.bridge.roles``). A role may select series by label
(*match*: TensorRT-LLM's ``nv_trt_llm_request_metrics{request_type="waiting"}``). The one series
keeps the labels every aggregated series shares (``model_name``), never ``engine``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from redis_stats._core.read.values import float_sum
from redis_stats.catalog import GAUGE
from redis_stats.snapshot import EngineSnapshot, Snapshot

__all__ = [
    "CACHE_CONFIG",
    "KV_USAGE",
    "LORA",
    "NOT_A_NUMBER",
    "NOT_FINITE",
    "NO_SERIES",
    "ROLES",
    "RUNNING",
    "WAITING",
    "FamilyRole",
    "Withheld",
    "aggregate",
]

WAITING, RUNNING, KV_USAGE, CACHE_CONFIG, LORA = "waiting", "running", "kv_usage", "cache_config", "lora"
ROLES = (WAITING, RUNNING, KV_USAGE, CACHE_CONFIG, LORA)
"""Every role an endpoint view knows (module docstring)."""

_SUMMED = (WAITING, RUNNING)
_LEVELS = (WAITING, RUNNING, KV_USAGE)  # a number per engine (the others: info series)
_BLOCKS, _BLOCK_SIZE = "num_gpu_blocks", "block_size"
_LORA_LISTS = ("running_lora_adapters", "waiting_lora_adapters")
_MAX_LORA = "max_lora"


@dataclass(frozen=True)
class FamilyRole:
    """Family *family* (a gauge, as the catalogue names it) plays *role* (one of :data:`ROLES`)
    in the endpoint views; with *match*, only its series whose labels hold those values. A role
    given to a family the catalogue holds as a counter or histogram makes no series (the views
    show that family as ``/metrics`` does)."""

    family: str
    role: str
    match: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(
                f"role {self.role!r} of family {self.family!r} is not one of {', '.join(ROLES)}: "
                "declare one the endpoint views aggregate"
            )


@dataclass(frozen=True)
class Withheld:
    """A family not served as the endpoint's one series: *engine* (a live one) has no series of
    it (*reason* ``no_series``) or one that is no number (``not_a_number``); or the engines' total
    is no finite number (``not_finite``: past the float range, or infinities of both signs; no one
    engine, *engine* None), which ``/get_load`` refuses too."""

    family: str
    engine: int | None
    reason: str


NO_SERIES, NOT_A_NUMBER, NOT_FINITE = "no_series", "not_a_number", "not_finite"


def _series(
    snap: Snapshot, role: FamilyRole, engines: Iterable[EngineSnapshot]
) -> list[tuple[int, list[tuple[dict[str, str], float]]]]:
    """Per engine, its index and the series of *role*'s family that match it: (labels, value)."""
    spec = snap.catalog.get(role.family)
    if spec is None or spec.kind != GAUGE:  # the rules are of gauges (a level now, per engine)
        return []
    names = spec.labels
    wanted = dict(role.match)
    out = []
    for engine in engines:
        found = []
        for (name, values), value in engine.gauges.items():
            if name != role.family:
                continue
            labels = dict(zip(names, values))
            if all(labels.get(k) == v for k, v in wanted.items()):
                found.append((labels, value))
        out.append((engine.engine, found))
    return out


def _withheld(
    role: FamilyRole, per_engine: list[tuple[int, list[tuple[dict[str, str], float]]]]
) -> Withheld | None:
    """Why *role*'s family cannot be one series over these engines, if it cannot: one of them
    has none, or (a level, not an info series) one that is NaN."""
    for engine, found in per_engine:
        if not found:
            return Withheld(role.family, engine, NO_SERIES)
        if role.role in _LEVELS and any(math.isnan(v) for _, v in found):
            return Withheld(role.family, engine, NOT_A_NUMBER)
    return None


def _common(label_sets: Sequence[dict[str, str]]) -> dict[str, str]:
    """The labels every one of *label_sets* holds with the same value, in the first's order."""
    first = label_sets[0]
    return {k: v for k, v in first.items() if all(s.get(k) == v for s in label_sets[1:])}


def aggregate(
    snap: Snapshot, role: FamilyRole, engines: Iterable[EngineSnapshot]
) -> tuple[dict[str, str], float] | Withheld | None:
    """The one series (labels, value) of *role*'s family over *engines* (the live engines of an
    endpoint, from *snap*), by the rule of its role (module docstring); None when none of them
    has a series of it, or when they cannot be one (``cache_config`` of different block sizes);
    :class:`Withheld` when some of them have and another has none, or a NaN."""
    per_engine = _series(snap, role, engines)
    if not any(found for _, found in per_engine):
        return None
    why = _withheld(role, per_engine)
    if why is not None:
        return why
    flat = [s for _, found in per_engine for s in found]
    if role.role in _SUMMED:
        return _summed(role, flat)
    if role.role == KV_USAGE:
        return _common([labels for labels, _ in flat]), max(v for _, v in flat)
    # Info series: each engine's newest (the largest value: a timestamp, or 1 for each).
    newest = [max(found, key=lambda s: s[1]) for _, found in per_engine]
    if role.role == CACHE_CONFIG:
        return _cache_config(newest)
    return _lora(newest)


def _summed(
    role: FamilyRole, flat: list[tuple[dict[str, str], float]]
) -> tuple[dict[str, str], float] | Withheld:
    """The sum of *flat*'s values with the labels they share, or withheld when it is no finite
    number (past the float range, or infinities of both signs)."""
    total = float_sum([v for _, v in flat])
    if not math.isfinite(total):
        return Withheld(role.family, None, NOT_FINITE)
    return _common([labels for labels, _ in flat]), total


def _cache_config(newest: list[tuple[dict[str, str], float]]) -> tuple[dict[str, str], float] | None:
    sizes = {labels.get(_BLOCK_SIZE) for labels, _ in newest}
    if len(sizes) != 1 or None in sizes:  # no common block size (or none known): no sum to show
        return None
    try:
        blocks = sum(int(labels.get(_BLOCKS, "")) for labels, _ in newest)
    except ValueError:  # an engine without a number of blocks: no sum to show
        return None
    labels = _common([labels for labels, _ in newest])
    labels[_BLOCKS] = str(blocks)
    labels[_BLOCK_SIZE] = str(sizes.pop())
    return labels, 1.0


def _lora(newest: list[tuple[dict[str, str], float]]) -> tuple[dict[str, str], float]:
    labels = _common([labels for labels, _ in newest])
    for name in _LORA_LISTS:
        seen: dict[str, None] = {}
        for found, _ in newest:
            seen.update((a, None) for a in found.get(name, "").split(",") if a)
        labels[name] = ",".join(seen)
    counts = [int(m) for found, _ in newest if _is_count(m := found.get(_MAX_LORA, ""))]
    if counts:
        labels[_MAX_LORA] = str(max(counts))
    return labels, max(v for _, v in newest)


def _is_count(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` takes "²", which ``int`` refuses)."""
    return text.isascii() and text.isdigit()
