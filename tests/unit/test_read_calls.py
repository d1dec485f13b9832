"""The read's script calls stay within what a managed store takes (ElastiCache Serverless: 3,999
words a command), whatever the fleet's shape."""

from __future__ import annotations

import pytest

from redis_stats._core.read.fetch import LOAD, SNAPSHOT, SNAPSHOT_LEAN, script_calls
from redis_stats.keys import Keys


@pytest.mark.parametrize("fetch", [SNAPSHOT, SNAPSHOT_LEAN, LOAD], ids=lambda f: f.name)
@pytest.mark.parametrize(("engines", "writers"), [(1024, 1024), (2000, 2), (10, 3000)])
def test_no_read_call_is_above_3999_words_and_every_read_is_in_one(fetch, engines, writers):
    """The load feed reads four keys of each writer, one of them by its own field (an argument
    more): split by keys alone, a call of 1,024 engines x 1,024 writers came to ~4,700 words."""
    keys = Keys("ns")
    plan = (tuple(map(str, range(engines))), tuple(f"w{i}" for i in range(writers)))
    groups = fetch.reads(keys, plan)
    calls = script_calls(groups)
    for call_keys, argv in calls:
        assert 3 + len(call_keys) + len(argv) <= 3999  # EVALSHA_RO sha numkeys, keys, ARGV
    read = [key for call_keys, _ in calls for key in call_keys]
    assert read == [key for group in groups for _, key, _ in group]  # each once, in order
