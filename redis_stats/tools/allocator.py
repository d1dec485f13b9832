"""How many malloc arenas a long-running, threaded command's process may use (glibc).

glibc gives each thread that meets contention an arena of its own, up to 8 per core, and memory
freed in one arena serves only that arena's later requests. The exporter answers each connection
on a thread of its own, and each answer at fleet size allocates tens of megabytes of short-lived
strings and floats: the freed memory stays spread over many arenas, and the process' resident
memory grows far past what it holds (at 256 engines under the sliced layout's traffic, 408 MB
resident for 37 MB of live Python objects; 187 MB with two arenas: docs/sizing.md).
Two arenas (what ``MALLOC_ARENA_MAX=2`` sets) cost nothing measurable here: the threads hold the
GIL while they allocate anyway.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["ARENAS", "bound_arenas"]

ARENAS = 2
"""The arenas :func:`bound_arenas` allows."""

_M_ARENA_MAX = -8  # glibc's malloc.h


def bound_arenas(arenas: int = ARENAS) -> bool:
    """At most *arenas* malloc arenas from now on; True if set. Call it before the threads start.

    The operator's own ``MALLOC_ARENA_MAX`` wins (nothing is set then). On a C library without
    glibc's ``mallopt`` (musl, macOS) nothing happens: False.
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas) == 1)
