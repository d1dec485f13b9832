from hypothesis import given
from hypothesis import strategies as st

from redis_stats import codec


@given(st.lists(st.text(), min_size=1, max_size=6))
def test_any_components_round_trip(components):
    assert codec.decode(codec.encode(components)) == components


def test_separator_and_escape_inside_values_stay_unambiguous():
    a = codec.encode(["m", "x|y", "z"])
    b = codec.encode(["m", "x", "y|z"])
    assert a != b
    assert codec.decode(a) == ["m", "x|y", "z"]
    assert codec.decode(codec.encode(["m", "\\", "\\/", ""])) == ["m", "\\", "\\/", ""]


@given(st.text(alphabet="@|\\/n0123abc\n", max_size=12))
def test_chunk_writer_without_its_full_decode_answers_as_the_decode(field):
    """The no-escape shortcut of chunk_writer must name the writer exactly as decoding does."""
    try:
        parts = codec.decode(field)
    except ValueError:
        parts = None
    ok = (
        parts is not None
        and len(parts) == 3
        and parts[0] == "@"
        and parts[2].isdigit()
        and parts[2].isascii()
    )
    assert codec.chunk_writer(field) == (parts[1] if ok else None)


def test_a_value_line_with_parts_a_newer_writer_added_is_read_as_the_parts_this_one_knows():
    """A rolling upgrade mixes releases: a gauge or histogram line with a part more after the
    ones this reader knows reads as those (not dropped as bad_value: a view gone blank)."""
    from redis_stats.codec import gauge_parts, histogram_numbers

    assert gauge_parts("1700000000000.000|5.0|x") == (1700000000000.0, 5.0, "5.0")
    assert histogram_numbers("0.5 1 2 3 x", 3) == ("0.5", ["1", "2", "3"], [1, 2, 3])
    # a part fewer is not a value: skipped
    assert histogram_numbers("0.5 1 2", 3) is None and gauge_parts("1700000000000.000") is None


def test_every_value_text_a_writer_writes_reads_back_as_it_was():
    from redis_stats.codec import (
        counter_text,
        counter_total,
        gauge_parts,
        gauge_text,
        histogram_counts,
        histogram_numbers,
        histogram_text,
    )

    for total in (0, 7, 2**70, 0.25, 1e300):
        assert counter_total(counter_text(total)) == total
    assert histogram_counts(histogram_text(1.5, [1, 0, 2])) == (1.5, [1, 0, 2])
    assert histogram_numbers(histogram_text(1.5, [1, 0, 2]), 3) == ("1.5", ["1", "1", "3"], [1, 1, 3])
    assert gauge_parts(gauge_text(1234.5, -2)) == (1234.5, -2.0, "-2.0")
