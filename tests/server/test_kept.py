"""What the server keeps per request parameter: bounded in bytes, dropped when idle (issue 39)."""

from __future__ import annotations

import threading
import time

import pytest

from redis_stats.server.kept import Kept


class Entry:
    def __init__(self, size: int) -> None:
        self.size = size
        self.closed = 0

    def kept_bytes(self) -> int:
        return self.size

    def close(self) -> None:
        self.closed += 1


def test_the_least_recently_used_go_once_the_bytes_pass_the_budget():
    kept = Kept(1000)
    made = {k: kept.get(("slice", "ns", k), lambda: Entry(300)) for k in range(3)}
    kept.get(("slice", "ns", 0), lambda: Entry(300))  # 0 used again: 1 is now the oldest
    fourth = kept.get(("slice", "ns", 3), lambda: Entry(300))
    assert made[1].closed == 1 and made[0].closed == made[2].closed == fourth.closed == 0
    assert sum(kept.bytes_by_kind().values()) <= 1000
    # an entry that grew (a renderer after its first text) counts at its new size
    fourth.size = 700
    kept.sweep()
    assert sum(kept.bytes_by_kind().values()) <= 1000 and made[2].closed == 1 and made[0].closed == 0


def test_an_entry_larger_than_the_budget_serves_its_request_and_is_not_kept():
    kept = Kept(100)
    big = kept.get(("endpoint_view", "ns", "a"), lambda: Entry(500))
    assert isinstance(big, Entry) and big.closed == 1  # closed: stops its work, still usable
    assert kept.bytes_by_kind() == {}


def test_unused_entries_go_after_the_idle_time():
    kept = Kept(10_000, idle=0.2)
    a = kept.get(("window", "ns", None), lambda: Entry(10))
    time.sleep(0.3)
    kept.sweep()
    assert a.closed == 1 and kept.bytes_by_kind() == {}


def test_two_requests_making_one_entry_at_once_keep_one():
    kept = Kept(10_000)
    barrier = threading.Barrier(8)
    made: list[Entry] = []
    got: list[Entry] = []

    def make() -> Entry:
        entry = Entry(10)
        made.append(entry)
        return entry

    def ask() -> None:
        barrier.wait()
        got.append(kept.get(("slice", "ns", "0/4"), make))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(e) for e in got}) == 1  # every request got the one kept
    assert sum(e.closed for e in made) == len(made) - 1  # the others were closed


def test_a_namespace_gone_drops_its_entries_only():
    kept = Kept(10_000)
    a = kept.get(("slice", "a", 1), lambda: Entry(10))
    b = kept.get(("slice", "b", 1), lambda: Entry(10))
    kept.drop(namespace="a")
    assert a.closed == 1 and b.closed == 0


@pytest.mark.parametrize("budget", [-1, 1.5, True, "10"])
def test_a_bad_budget_is_refused_naming_it(budget):
    with pytest.raises(ValueError, match="view_budget="):
        Kept(budget)
