"""What the load feed vouches for: the one rule every view a router reads follows.

A router acts on what it is told: an engine listed ``up`` is sent requests, a count is compared
with the others', a ``null`` is read as ``0`` by more than one of them. So every view a router
reads (``/load``, ``/watch``, ``/v1/loads`` and ``/loads``, ``/get_load``, ``/pool``, and the vLLM
middleware's ``/get_load`` and ``/v1/loads``) says only what the store holds now, by the rules
below, written once here (``/load``, the fleet's raw document, shows an engine's values as
stored, ``null`` for none: the router documents apply the last two rules):

**The feed.** While the store cannot be read, or the last successful read is older than the
feed's bound (``/load``'s: ten refreshes, at least 2 s), nothing is vouched for: every answer says
the load is **unknown** and why (:func:`unknown_document`; a ``503`` for a request, an ``unknown``
event for a stream), never the last numbers as if current. When it can be read again, a
subscriber gets the whole state, not the changes since (they were not seen).

**An engine** (:func:`engine_state`) is ``up`` or ``stale`` (liveness: the one rule of
``redis_stats._core.read.liveness``) only with numbers some live writer stored; ``down`` when it
is not live, or when its live writers' entries are gone (a writer deletes its entries in the
same script that marks it closed: the entries are the newer news, so a closing engine goes
straight to ``down``); ``unknown`` when it is live and no writer stores load numbers for it
(a writer without the load feed, or none recorded yet): listed, never routed to (``/watch``'s
states; the router documents leave such an engine out, or answer ``503``, with why).

**A number** (:func:`impossible`): every field of the load feed is a quantity no engine can have
below zero (requests, KV usage and capacity, tokens per second, hits), and a count of requests or
tokens is a whole number (:data:`WHOLE`). A value that breaks that (a writer's bad gauge: ``-5``
waiting, ``2.5`` running) or is no finite number is withheld with its reason, never passed to a
least-loaded policy that would send everything there. A field this module does not know (a
release later) is held to the first rule only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from redis_stats._core.read.liveness import DOWN, UP
from redis_stats.load import FIELDS, EngineLoad

__all__ = [
    "COUNTS",
    "LIVE",
    "UNKNOWN",
    "WHOLE",
    "describe",
    "engine_state",
    "has_numbers",
    "impossible",
    "optional_problems",
    "unknown_document",
    "withheld",
]

UNKNOWN = "unknown"
"""The state of an engine (or of the whole feed) whose load nobody vouches for."""

LIVE = frozenset({UP, "stale"})
"""The states a router may route to (by the numbers that come with them)."""

COUNTS = ("requests_running", "requests_waiting")
"""The counts every load a router reads is made of: an engine without both has no load."""

WHOLE = frozenset(
    {
        "requests_running",
        "requests_waiting",
        "kv_cache_capacity_tokens",
        "max_running_requests",
        "in_flight",
        "booked",
    }
)
"""Fields that count requests or tokens: whole numbers (SGLang's gateway reads them as ``i32``;
``in_flight`` and ``booked`` count requests too)."""

NOT_REPORTED, NOT_A_NUMBER, NEGATIVE, NOT_WHOLE = "not_reported", "not_a_number", "negative", "not_whole"


def has_numbers(load: EngineLoad) -> bool:
    """Whether some live writer stored a number of *load*'s engine (any field of the feed)."""
    return any(v is not None for v in load.values())


def engine_state(load: EngineLoad, *, entries_gone: bool = False) -> str:
    """*load*'s engine's state as a router may read it (module docstring): its liveness state
    when live with numbers; ``down`` when not live, or live by the last full read while its live
    writers' entries are gone since (*entries_gone*: the feed read the entries after it); else
    ``unknown``."""
    state = load.state or (UP if load.up else DOWN)
    if not load.up or state not in LIVE or entries_gone:
        return DOWN
    return state if has_numbers(load) else UNKNOWN


def impossible(name: str, value: Any) -> str | None:
    """Why *value* of field *name* is no number an engine can have (None: it can be one);
    ``not_reported`` for None."""
    if value is None:
        return NOT_REPORTED
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return NOT_A_NUMBER
    if value < 0:
        return NEGATIVE
    if name in WHOLE and value != int(value):
        return NOT_WHOLE
    return None


def withheld(load: EngineLoad, names: Iterable[str] = COUNTS) -> dict[str, str]:
    """The fields of *names* that *load* cannot give a router, each with why (empty: every one
    is a number its engine can have)."""
    out = {}
    for name in names:
        why = impossible(name, getattr(load, name, None))
        if why is not None:
            out[name] = why
    return out


def optional_problems(load: EngineLoad) -> dict[str, str]:
    """The fields of the feed that *load* reports with a value no engine can have (a field not
    reported is no problem here: the document reads it as absent)."""
    return {
        name: why
        for name in FIELDS
        if getattr(load, name) is not None and (why := impossible(name, getattr(load, name))) is not None
    }


def describe(problems: dict[str, str]) -> str:
    """*problems* (field -> why) in a sentence's words."""
    return ", ".join(f"{name} {why.replace('_', ' ')}" for name, why in sorted(problems.items()))


def unknown_document(error: str, detail: str, **extra: Any) -> dict[str, Any]:
    """The document of an answer that has no load to give: ``feed: unknown``, the *error* kind
    (``connection``, ``stale``, ...) and a *detail* a person can act on."""
    return {"feed": UNKNOWN, "error": error, "detail": detail, **extra}
