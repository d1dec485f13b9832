"""A slice of a fleet's engines: engine ``e`` is in slice ``i`` of ``N`` when ``e % N == i``.

One exporter can then be scraped as N Prometheus targets (``/metrics?slice=i/N``), each reading
from Redis only its own engines (``read.lua`` picks them server-side, in the same round trip):
the N slices hold every engine exactly once, whatever engines come and go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# More slices than this would be more targets than engines for any fleet this store carries.
MAX_SLICES = 4096


@dataclass(frozen=True)
class EngineSlice:
    """Slice *index* of *count* (``0 <= index < count``): the engines ``e`` with
    ``e % count == index``. Not iterable (not a tuple): its engines are whatever the store
    lists, and no reader may take it for a list of engine indexes."""

    index: int
    count: int

    def __post_init__(self) -> None:
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (self.index, self.count))
        if not ok or not 0 < self.count <= MAX_SLICES or not 0 <= self.index < self.count:
            raise ValueError(
                f"slice {self.index!r}/{self.count!r}: need whole numbers 0 <= i < N, 1 <= N <= {MAX_SLICES}"
            )

    @classmethod
    def parse(cls, text: str) -> EngineSlice:
        """``"i/N"`` (as ``?slice=`` and ``--slice`` take it); ValueError naming the value and
        the form otherwise."""
        head, sep, tail = str(text).strip().partition("/")
        ok = sep and head.isascii() and head.isdigit() and tail.isascii() and tail.isdigit()
        if not ok or len(head) > 5 or len(tail) > 5:
            raise ValueError(f"slice {text!r} is not of the form i/N (e.g. 0/4: engines e with e % 4 == 0)")
        index, count = int(head), int(tail)
        if not 0 < count <= MAX_SLICES or not 0 <= index < count:
            raise ValueError(
                f"slice {text!r}: need 0 <= i < N and 1 <= N <= {MAX_SLICES} (N targets, numbered 0 to N-1)"
            )
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, engine_text: str) -> bool:
        """Whether the engine listed as *engine_text* (the store's decimal name) is in this
        slice. A name that is not a decimal integer (garbage) belongs to slice 0, so the reader
        that skips and counts it does so in exactly one slice; so does one of more than 15
        digits (``read.lua`` picks the same engines, and its numbers are exact to 15 digits)."""
        if engine_text.isascii() and engine_text.isdigit() and len(engine_text) <= 15:
            return int(engine_text) % self.count == self.index
        return self.index == 0

    @property
    def script_args(self) -> list[str]:
        """``read.lua``'s arguments for it: ``%``, N, i."""
        return ["%", str(self.count), str(self.index)]


# What a read reads: every engine (None), these engine indexes, or a slice of the fleet.
Engines = Iterable[int] | EngineSlice | None


def is_among(engines: Iterable[int] | EngineSlice) -> Callable[[Any], bool]:
    """Whether an engine's text (as its zset lists it) is among *engines*: the indexes given,
    or the engines of a slice."""
    if isinstance(engines, EngineSlice):
        return engines.holds
    return {str(int(e)) for e in engines}.__contains__
