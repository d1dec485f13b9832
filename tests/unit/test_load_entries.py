"""Load entries (redis_stats/load.py): what a writer encodes is what a reader decodes, and the
bulk read of a whole load hash (one JSON parse) decides exactly as the entry-by-entry read."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from redis_stats.load import FIELDS, MODE_CODES, decode_entries, decode_entry, encode_entry

values = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**20), 10**20))
modes = st.lists(st.sampled_from(sorted(MODE_CODES)), min_size=len(FIELDS), max_size=len(FIELDS))
garbage = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["", "1", "null", "[1]", '"a"', "1,1,2,0", "NaN", "1e999", "9" * 400, "1,1,2,0.5,1,1,1,1,1,1"]
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0, 2e12),
    st.floats(0, 2e12),
    modes,
    st.lists(values, min_size=len(FIELDS), max_size=len(FIELDS)),
)
def test_an_entry_round_trips(stored_ms, stamp_ms, mode_list, vals):
    stored = f"{int(stored_ms)}," + encode_entry(stamp_ms, mode_list, vals)
    entry = decode_entry(stored)
    assert entry is not None
    assert entry.stored_ms == int(stored_ms) and entry.stamp_ms == round(stamp_ms)
    assert [entry.mode(i) for i in range(len(FIELDS))] == mode_list
    for got, sent in zip(entry.values, vals):
        if sent is None or not math.isfinite(float(sent)):
            assert got is None  # not reported, or not a finite number: null
        else:
            assert got == float(sent)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            garbage,
            st.builds(
                lambda v: "5," + encode_entry(1.0, ["sum"] * 4, v), st.lists(values, min_size=6, max_size=6)
            ),
        ),
        max_size=8,
    )
)
def test_the_bulk_read_decides_as_the_entry_by_entry_read(stored):
    assert decode_entries(stored) == [decode_entry(s) for s in stored]


def test_what_is_not_an_entry_of_this_version_is_refused():
    ok = "1,1,2,0,1.0,null,3,4,5,6"
    assert decode_entry(ok) is not None
    for bad in [
        "1,2,2,0,1,1,1,1,1,1",
        "1,1,2,0.5,1,1,1,1,1,1",
        "1,1,2,0,1e999,1,1,1,1,1",
        "1,1,2,0," + "9" * 400 + ",1,1,1,1,1",
        "1,1,2,0,NaN,1,1,1,1,1",
        "x",
        "",
        "null,1,2,0,1,1,1,1,1,1",
    ]:
        assert decode_entry(bad) is None, bad
        assert decode_entries([ok, bad]) == [decode_entry(ok), None]


def test_entries_of_an_older_or_newer_release_are_read():
    """A rolling upgrade mixes releases: a reader reads the fields it knows of a newer writer's
    longer entry, and an older writer's shorter one with the fields it lacks as not reported
    (before: an entry one field short was skipped as bad_entry, and /load went blank)."""
    old = "7,1,5,0,1.0,2.0,0.5,4096.0,10.0,20.0"  # 0.1's six fields (f5ee21c)
    entry = decode_entry(old)
    assert entry is not None
    assert entry.values[:6] == (1.0, 2.0, 0.5, 4096.0, 10.0, 20.0)
    assert entry.values[6:] == (None,) * (len(FIELDS) - 6)
    newer = "7,1,5,0," + ",".join(["3.0"] * len(FIELDS)) + ",99.0,null,1e3"
    entry = decode_entry(newer)
    assert entry is not None and entry.values == (3.0,) * len(FIELDS)
    assert decode_entries([old, newer]) == [decode_entry(old), decode_entry(newer)]
