"""The exporter's process bounds glibc's malloc arenas (its resident memory at fleet size grew to
several times what it held, spread over an arena per connection thread)."""

from __future__ import annotations

import os
import platform
import subprocess

import pytest

from tests.conftest import PYTHON, ROOT

# In a fresh process: bound_arenas(), then 16 threads that allocate at once, then the number of
# arenas (heaps) glibc's malloc_info reports. glibc gives a thread's first allocation a new arena
# while it has fewer than its limit, and hands the arena of a thread that ended to the next one:
# so every thread holds its blocks at a barrier until all 16 have allocated. Without it a busy
# machine ran them one after the other, on one arena, and the count said nothing of the limit.
SCRIPT = """
import ctypes, tempfile, threading
from redis_stats.tools.allocator import bound_arenas
print(bound_arenas())
all_in = threading.Barrier(16)
def work():
    blocks = [bytearray(4096) for _ in range(2000)]
    all_in.wait(timeout=120)
threads = [threading.Thread(target=work) for _ in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(open(path).read().count("<heap nr="))
"""


def arenas(extra: dict[str, str]) -> tuple[str, int]:
    """(what bound_arenas returned, the arenas malloc_info counts) in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env.update(extra, PYTHONPATH=str(ROOT))
    out = subprocess.run([PYTHON, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    said, count = out.stdout.split()
    return said, int(count)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc arenas")
def test_at_most_two_malloc_arenas_unless_the_operator_says_otherwise():
    said, count = arenas({})
    assert said == "True" and count <= 2, count
    said, count = arenas({"MALLOC_ARENA_MAX": "4"})  # the operator's own setting wins
    assert said == "False" and 2 < count <= 4, count
