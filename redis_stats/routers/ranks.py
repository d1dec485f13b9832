"""An engine's data-parallel rank: its place in its endpoint, never its place in a list.

A router that sends requests to a rank (SGLang's gateway books its load by ``dp_rank``) needs the
same number for the same engine in every answer: engines {0, 2, 3} of a pod whose engine 1 is not
stored yet, recorded nothing or reports NaN stay ranks 0, 2 and 3, and rank 1 is named as one
without load, not silently replaced by rank 2's numbers.

The place is counted from the endpoint's **first engine**, the smallest engine index stored for it
(a live or a down one: a closed engine stays listed until ``gc`` removes it), so a pod whose
engines are 4 to 7 of the namespace has ranks 0 to 3. Every index between the first and the
last engine stored is one of its ranks: one not stored is a rank without load. (A pod whose
first engine was never stored numbers its ranks from the first one that was: nothing stored
says where it starts.)
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["missing_ranks", "ranks_of"]


def ranks_of(engines: Iterable[int]) -> dict[int, int]:
    """Engine -> its rank, for the engines stored for one endpoint."""
    found = sorted(set(engines))
    first = found[0] if found else 0
    return {e: e - first for e in found}


def missing_ranks(ranks: dict[int, int]) -> list[int]:
    """The ranks between the first and the last stored that no engine stored holds."""
    held = set(ranks.values())
    return [r for r in range(max(held, default=-1) + 1) if r not in held]
