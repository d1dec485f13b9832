"""The read path's two ways to add an engine's writers up (docs/architecture.md, "The read path"):
the bulk read of writers' chunks shows exactly what the line-by-line read shows, on clean data and
on garbage; and what a names field means is kept per namespace. White-box: the decoder's bulk
read is switched off here to compare."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from redis_stats import RedisCollector, StatsReader, StatsWriter
from redis_stats._core.read import decoder
from redis_stats.keys import Keys
from tests import chunked
from tests.reader.test_bad_data import samples, skipped_of
from tests.reads import series, stable, texts


def test_parsed_names_are_kept_per_namespace(config, catalog, fake_client):
    """Caches do not cross namespaces: each reader keeps its own (a names field of the same
    text means the same series only against its own namespace's catalogue)."""
    names = "tokens\nrequests|stop"
    one = decoder.SnapshotDecoder(catalog, keys=Keys(config.namespace))
    other = decoder.SnapshotDecoder(catalog, keys=Keys("another"))
    kept = one.layout(names, one.catalog)
    assert one.layout("".join(["tokens\n", "requests|stop"]), one.catalog) is kept  # by text
    assert other.layout(names, other.catalog) is not kept


# -- the bulk read and the line-by-line read agree, on clean data and on garbage ---------------

_count = st.one_of(st.integers(0, 10**6), st.integers(0, 10**17))  # > 2**53 now and then
_token = st.one_of(
    st.integers(0, 10**6).map(str),
    st.sampled_from(["", "x", "inf", "-inf", "+Inf", "nan", "1.5", "-1", "1e999", "1e", "007", " 1", "1_0"]),
    # What JSON reads (the bulk read parses histogram lines as JSON) but a count or sum is not.
    st.sampled_from(
        ["true", "null", "NaN", "Infinity", '"1"', "[1]", "1,2", "\t1", "-0", "1e5", "1.0", "1E2"]
    ),
    st.just("9" * 4400),  # over Python's 4,300 digits for int(): refused, not raised
    # Integers beyond a float (2**1024 and up): float() of the text is inf, of the int raises.
    st.sampled_from(["2" + "0" * 308, "1" + "0" * 400]),
)


@st.composite
def _histogram_line(draw: Any, clean: bool) -> str:
    way = "clean" if clean else draw(st.sampled_from(["clean", "one bad part", "garbage"]))
    if way != "garbage":
        counts = sorted(draw(st.lists(_count, min_size=5, max_size=5)))
        total = draw(st.one_of(st.floats(0, 1e9, allow_nan=False).map(repr), st.integers(0, 10**7).map(str)))
        parts = [total, *map(str, counts)]
        if way == "one bad part":  # the right number of parts, one of them not what it must be
            parts[draw(st.integers(0, 5))] = draw(_token)
        return " ".join(parts)
    return " ".join(draw(st.lists(_token, min_size=1, max_size=7)))


@st.composite
def _gauge_line(draw: Any, clean: bool) -> str:
    if clean or draw(st.booleans()):
        return f"{draw(st.integers(0, 2 * 10**12))}|{draw(st.floats(-1e9, 1e9, allow_nan=False))!r}"
    return "|".join(draw(st.lists(_token, min_size=1, max_size=3)))


_COUNTERS = ["tokens", "requests|stop", "requests|length"]
_GAUGES = ["running", "inflight", "peak", "floor"]


@st.composite
def _chunk_values(draw: Any, clean: bool | None = None) -> list[str]:
    if clean is None:
        clean = draw(st.booleans())  # all lines clean (read in bulk), or garbage anywhere
    counters = [draw(_count.map(str) if clean else st.one_of(_count.map(str), _token)) for _ in _COUNTERS]
    gauges = [draw(_gauge_line(clean)) for _ in _GAUGES]
    return [*counters, *gauges, draw(_histogram_line(clean))]


# Base fields (departed writers' totals, folded in by gc): none, all of the chunks' counters and
# histograms (the usual case), or any few, garbage and gauges included. "H" is the histogram.
_full_base = st.fixed_dictionaries({**{c: _count.map(str) for c in _COUNTERS}, "H": _histogram_line(True)})
_base = st.one_of(
    st.just({}),
    _full_base,
    _full_base,
    st.dictionaries(
        st.sampled_from([*_COUNTERS, "H", "running", "tokens|x"]),
        st.one_of(_count.map(str), _token, _histogram_line(False)),
        max_size=5,
    ),
)


@pytest.mark.redis_server
@example(  # gauge lines with two "|" and with none: as many parts as two good ones
    values=[["0", "0", "0", "0|0.0", "0|0|0", "0|0.0", "0", "0.0 0 0 0 0 0"]], stale=1, base={}
)
@example(  # a count over Python's 4,300 digits for int(): skipped, not a failed read
    values=[["0", "0", "0", "0|0.0", "0|0.0", "0|0.0", "0|0.0", "1.0 0 0 0 0 " + "9" * 4400]],
    stale=1,
    base={},
)
@example(  # a sum, a count, a counter beyond a float: read (inf in the snapshot), not raised
    values=[
        ["0", "0", "0", "0|0.0", "0|0.0", "0|0.0", "0|0.0", "2" + "0" * 308 + " 0 0 0 0 0"],
        ["0", "0", "0", "0|0.0", "0|0.0", "0|0.0", "0|0.0", "1.0 0 0 0 0 " + "1" + "0" * 400],
        ["1" + "0" * 400, "0", "0", "0|0.0", "0|0.0", "0|0.0", "0|0.0", "1.0 0 0 0 0 0"],
    ],
    stale=3,
    base={},
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    # Half the time every writer's chunk is clean (else few engines of 2-3 writers would be read
    # in bulk: one garbage chunk sends the engine line by line).
    values=st.tuples(st.integers(1, 3), st.sampled_from([True, None])).flatmap(
        lambda n_clean: st.lists(_chunk_values(n_clean[1]), min_size=n_clean[0], max_size=n_clean[0])
    ),
    stale=st.integers(0, 3),
    base=_base,
)
def test_the_bulk_read_shows_what_the_line_by_line_read_shows(
    config, catalog, fake_client, values, stale, base
):
    merged = _both_ways(config, catalog, fake_client, values, stale, base)
    event(f"writers {len(values)}, base fields: {bool(base)}, read in bulk: {all(merged)}")


def _both_ways(config: Any, catalog: Any, fake_client: Any, values: Any, stale: int, base: Any) -> list[bool]:
    """One engine's chunks (*values*: one writer's lines each; writer *stale* stale) and *base*
    fields, read in bulk and line by line: both must show the same. Whether each merge of the
    bulk read took the engine in bulk (True) or left it to the line-by-line read."""
    from tests.chunked import bucket_tag

    histogram = "latency_seconds|" + bucket_tag(catalog.get("latency_seconds"))
    names = "\n".join([*_COUNTERS, *_GAUGES, histogram])
    client = fake_client()
    client.flushall()
    keys = Keys(config.namespace)
    w = StatsWriter(config, catalog, engines=[0], client=fake_client(), start=False)
    w.counter("tokens").labels(engine=0).inc(1)
    assert w.flush()  # the namespace's catalogue and engine index, by a real writer
    w._closed = True
    client.delete(keys.counters("0"))
    now_ms = int(client.time()[0]) * 1000
    for i, lines in enumerate(values):
        writer = f"node:{i}"
        client.zadd(keys.writers, {writer: now_ms - (10**9 if i == stale else 0)})  # one may be stale
        client.hset(keys.counters("0"), chunked.chunk_field(writer, 0), "\n".join(lines))
        client.hset(keys.counters("0"), chunked.chunk_field(writer, 0) + chunked.NAMES_SUFFIX, names)
    for name, value in base.items():
        client.hset(keys.counters("0"), histogram if name == "H" else name, value)

    def read() -> tuple[str, Any]:
        reader = StatsReader(config, catalog, client=fake_client())
        text = RedisCollector(reader).render_text()
        snap = reader.snapshot()
        return text, snap

    in_bulk = decoder.in_bulk
    merged: list[bool] = []

    def bulk_or_not(*args: Any, **kw: Any) -> Any:
        found = in_bulk(*args, **kw)
        merged.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decoder, "in_bulk", bulk_or_not)
        bulk_text, bulk = read()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decoder, "in_bulk", lambda *args, **kw: None)  # line by line
        lines_text, lines = read()
    assert texts(samples(bulk_text)) == texts(samples(lines_text))  # NaN (inf + -inf) too
    assert skipped_of(samples(bulk_text)) == skipped_of(samples(lines_text))
    assert repr(series(bulk)) == repr(series(lines))
    assert dict(bulk.skipped) == dict(lines.skipped)
    # the series line for line (ordering included), but for times and ages; the numbers above
    # (a group one writer holds prints its stored text: "12" where the line by line read
    # prints 12.0, the same number)
    assert [x.rpartition(" ")[0] for x in stable(bulk_text)] == [
        x.rpartition(" ")[0] for x in stable(lines_text)
    ]
    return merged


def _chunk(counters: tuple[str, ...] = ("3", "4", "5"), histogram: str = "1.5 0 1 2 3 4") -> list[str]:
    return [*counters, "0|1.0", "0|2.0", "0|3.0", "0|4.0", histogram]


_BEYOND_FLOAT = "2" + "0" * 308  # 2e308: float() of the text is inf, float() of the int raises
_BASE = {"tokens": "1", "requests|stop": "2", "requests|length": "3", "H": "1 0 1 2 3 4"}

# (stored values the JSON scanner or the int/float reads of the bulk path may read otherwise than
# the line-by-line rules, whether the bulk path takes the engine (else it leaves it to the
# line-by-line read), base fields). One writer, two or three: each with its own case.
_ADVERSARIAL: dict[str, tuple[list[list[str]], bool, dict[str, str]]] = {
    # sums JSON reads as ints, exponents, infinities, many digits
    "sum 12, one writer": ([_chunk(histogram="12 0 1 2 3 4")], True, {}),
    "sum 12, two writers": ([_chunk(histogram="12 0 1 2 3 4")] * 2, True, {}),
    "sums 1E5, 1e+5, 0.0": (
        [_chunk(histogram=f"{x} 0 1 2 3 4") for x in ("1E5", "1e+5", "0.0")],
        True,
        {},
    ),
    "sum 1e999 (inf), one writer": ([_chunk(histogram="1e999 0 1 2 3 4")], True, {}),
    "sum 1e999 plus a 301-digit int": (
        [_chunk(histogram="1e999 0 1 2 3 4"), _chunk(histogram="1" + "0" * 300 + " 0 1 2 3 4")],
        True,
        {},
    ),
    "sum of 17 digits plus 0.1": (
        [_chunk(histogram="12345678901234567 0 1 2 3 4"), _chunk(histogram="0.1 0 1 2 3 4")],
        True,
        {},
    ),
    "sum of 601 digits": ([_chunk(histogram="1" * 300 + "." + "1" * 300 + " 0 1 2 3 4"), _chunk()], True, {}),
    "sum beyond a float, an int": ([_chunk(histogram=_BEYOND_FLOAT + " 0 1 2 3 4"), _chunk()], False, {}),
    "sum beyond a float, one writer": ([_chunk(histogram=_BEYOND_FLOAT + " 0 1 2 3 4")], False, {}),
    "sum over 4,300 digits": ([_chunk(histogram="9" * 5000 + " 0 1 2 3 4"), _chunk()], False, {}),
    **{
        f"sum {x!r}": ([_chunk(histogram=f"{x} 0 1 2 3 4"), _chunk()], False, {})
        for x in (".5", "5.", "+", "+1", "-1.5", "1e-400", "1_0", "\u0661.5", "0x1", "01.5")
    },
    # counts beyond 2**53 and 2**63, beyond a float, not integers, not ASCII, not one line
    "counts over 2**63, two writers": ([_chunk(histogram=f"1.5 0 1 2 3 {2**63 + 1}")] * 2, True, {}),
    "counts over 2**53, three writers": (
        [_chunk(histogram=f"1.5 0 1 2 3 {2**53 + 1}")] * 2 + [_chunk()],
        True,
        {},
    ),
    "count beyond a float, one writer": ([_chunk(histogram="1.5 0 1 2 3 " + _BEYOND_FLOAT)], False, {}),
    "count beyond a float, two writers": (
        [_chunk(histogram="1.5 0 1 2 3 " + _BEYOND_FLOAT), _chunk()],
        False,
        {},
    ),
    "counts of 600 digits": ([_chunk(histogram="1.5 0 1 2 3 " + "9" * 600)] * 2, False, {}),
    **{
        f"count {x!r}": ([_chunk(histogram=f"1.5 0 1 2 3 {x}"), _chunk()], False, {})
        for x in ("1e5", "1E5", "5.0", "-0", "+4", "04", "4_0", "\u0664", "4\r", "\t4", "4e0")
    },
    "an extra space": ([_chunk(histogram="1.5  0 1 2 3"), _chunk()], False, {}),
    "a trailing space": ([_chunk(histogram="1.5 0 1 2 3 "), _chunk()], False, {}),
    "an empty histogram line": ([_chunk(histogram=""), _chunk()], False, {}),
    # counters JSON refuses (read as text), beyond a float, over 600 digits, not ASCII
    "counter 007, one writer": ([_chunk(counters=("007", "4", "5"))], True, {}),
    "counters 007 and 00": (
        [_chunk(counters=("007", "4", "5")), _chunk(counters=("0", "00", "5"))],
        True,
        {},
    ),
    "counter beyond a float, one writer": ([_chunk(counters=(_BEYOND_FLOAT, "4", "5"))], True, {}),
    "counter beyond a float, two writers": ([_chunk(counters=(_BEYOND_FLOAT, "4", "5")), _chunk()], True, {}),
    "counters of 600 digits, two writers": ([_chunk(counters=("9" * 600, "4", "5"))] * 2, True, {}),
    "counters 1.5 and 1e5": ([_chunk(counters=("1.5", "1e5", "5")), _chunk()], True, {}),
    "counter of 601 digits": ([_chunk(counters=("9" * 601, "4", "5")), _chunk()], False, {}),
    "counter of a non-ASCII digit": ([_chunk(counters=("\u0664", "4", "5")), _chunk()], False, {}),
    "an empty counter line": ([_chunk(counters=("", "4", "5")), _chunk()], False, {}),
    # base fields (what gc folds in) with the chunks
    "base: a counter 1.5": ([_chunk()] * 2, True, {**_BASE, "tokens": "1.5"}),
    "base: a counter 007": ([_chunk()], True, {**_BASE, "tokens": "007"}),
    "base: a counter beyond a float": ([_chunk()] * 2, True, {**_BASE, "tokens": _BEYOND_FLOAT}),
    "base: a sum beyond a float": ([_chunk()] * 2, False, {**_BASE, "H": _BEYOND_FLOAT + " 0 1 2 3 4"}),
    "base: counts over 2**63": ([_chunk()], True, {**_BASE, "H": f"1 0 1 2 3 {2**64}"}),
}


@pytest.mark.parametrize("stale", [1, 3])  # the second writer stale, or none
@pytest.mark.parametrize("case", list(_ADVERSARIAL))
def test_values_json_reads_otherwise_than_int_and_float_show_as_line_by_line(
    config, catalog, fake_client, case, stale
):
    """Stored values where the bulk read's JSON scanner, or float() of the ints it makes, may
    differ from the line-by-line read's int() and float() of the text: both reads show the same
    (and none raises), whether the bulk read takes the engine or leaves it to the line-by-line
    read, as each case says. A sum, count or counter beyond a float (2**1024) made the bulk
    read raise (float() of an int raises where float() of its text gives inf)."""
    values, bulk, base = _ADVERSARIAL[case]
    merged = _both_ways(config, catalog, fake_client, values, stale, base)
    assert merged == [bulk, bulk]  # /metrics, then the snapshot
