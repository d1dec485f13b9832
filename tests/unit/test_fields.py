from hypothesis import given
from hypothesis import strategies as st

from redis_stats._core import fields


@given(st.lists(st.text(), min_size=1, max_size=6))
def test_any_components_round_trip(components):
    assert fields.decode(fields.encode(components)) == components


def test_separator_and_escape_inside_values_stay_unambiguous():
    a = fields.encode(["m", "x|y", "z"])
    b = fields.encode(["m", "x", "y|z"])
    assert a != b
    assert fields.decode(a) == ["m", "x|y", "z"]
    assert fields.decode(fields.encode(["m", "\\", "\\/", ""])) == ["m", "\\", "\\/", ""]


@given(st.text(alphabet="@|\\/n0123abc\n", max_size=12))
def test_chunk_writer_without_its_full_decode_answers_as_the_decode(field):
    """The no-escape shortcut of chunk_writer must name the writer exactly as decoding does."""
    try:
        parts = fields.decode(field)
    except ValueError:
        parts = None
    ok = (
        parts is not None
        and len(parts) == 3
        and parts[0] == "@"
        and parts[2].isdigit()
        and parts[2].isascii()
    )
    assert fields.chunk_writer(field) == (parts[1] if ok else None)
