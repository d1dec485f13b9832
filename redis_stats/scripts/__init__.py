"""The Lua scripts of redis_stats, kept as files (``flush.lua``, ``read.lua``)."""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["load_script"]


@cache
def load_script(name: str) -> str:
    """The source of ``<name>.lua`` shipped in this package."""
    return resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
