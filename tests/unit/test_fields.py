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
