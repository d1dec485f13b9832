"""What a read costs, checked by structure rather than by time (docs/key-schema.md, "Reading
schema 2"): a chunk's names field is parsed once per catalogue, an unchanged chunk is not parsed
again, and the bulk read of writers' chunks shows exactly what the line-by-line read shows."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from redis_stats import RedisCollector, StatsReader, StatsWriter
from redis_stats._core import fields, merge, snapshot
from redis_stats.keys import Keys
from tests.reader.test_bad_data import samples, skipped_of


def _writers(config: Any, catalog: Any, fake_client: Any, engines: list[int]) -> list[StatsWriter]:
    """Two API servers of the same engines recording the same series (the common case)."""
    out = []
    for role, n in (("api0", 3), ("api1", 5)):
        w = StatsWriter(config, catalog, engines=engines, client=fake_client(), start=False, role=role)
        for e in engines:
            w.counter("tokens").labels(engine=e).inc(n + e)
            w.counter("requests").labels(engine=e, reason="stop").inc(n)
            w.gauge("inflight").labels(engine=e).set(n)
            w.gauge("running").labels(engine=e).set(n)
            w.histogram("latency_seconds").labels(engine=e).observe(0.1 * n)
        assert w.flush()
        out.append(w)
    return out


def _stable(text: str) -> list[str]:
    return [x for x in text.splitlines() if "duration" not in x and "age_seconds" not in x]


def _texts(found: dict[Any, float]) -> dict[Any, str]:
    return {k: repr(v) for k, v in found.items()}


def _series(snap: Any) -> dict[int, Any]:
    return {
        e: [sorted(d.items()) for d in (s.counters, s.gauges, s.histograms)] for e, s in snap.engines.items()
    }


def test_a_names_field_is_parsed_once_and_an_unchanged_chunk_is_not_parsed_again(
    config, catalog, fake_client, monkeypatch
):
    layouts: list[Any] = []
    parses: list[Any] = []

    class CountedLayout(merge.Layout):
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            layouts.append(self)

    real_parse = merge.parse_chunk

    def counted_parse(*args: Any) -> Any:
        parses.append(args)
        return real_parse(*args)

    monkeypatch.setattr(snapshot, "Layout", CountedLayout)
    monkeypatch.setattr(merge, "parse_chunk", counted_parse)
    engines = [0, 1, 2]
    a, b = _writers(config, catalog, fake_client, engines)
    reader = StatsReader(config, catalog, client=fake_client())
    collector = RedisCollector(reader)

    def both() -> tuple[str, Any]:
        return collector.render_text(), reader.snapshot()

    text, snap = both()
    assert snap.engines[2].counter("tokens") == 3 + 2 + 5 + 2
    assert len(layouts) == 1  # two writers x three engines, one series set: one names field
    assert len(parses) == 2 * len(engines)  # every chunk, once for both render paths
    text2, snap2 = both()
    assert (samples(text2), _series(snap2)) == (samples(text), _series(snap))
    assert len(layouts) == 1 and len(parses) == 6  # nothing parsed again

    # One writer moves on in one engine: only that chunk is parsed again, and the totals move.
    b.counter("tokens").labels(engine=1).inc(100)
    assert b.flush()
    text3, snap3 = both()
    assert len(layouts) == 1 and len(parses) == 6 + 1
    assert snap3.engines[1].counter("tokens") == 3 + 1 + 5 + 1 + 100
    assert 'tokens_total{engine="1"} 110\n' in text3

    # A writer adds a series: its names field changes, and that one is parsed (once).
    a.counter("requests").labels(engine=0, reason="length").inc(1)
    assert a.flush()
    text4, snap4 = both()
    assert len(layouts) == 2
    assert snap4.engines[0].counter("requests", "length") == 1
    assert 'requests_total{engine="0",reason="length"} 1\n' in text4
    for w in (a, b):
        w._closed = True


def test_a_fleet_with_more_chunks_than_ten_thousand_keeps_its_parses(
    config, catalog, fake_client, monkeypatch
):
    """The chunk parses kept were capped at 10,000 and cleared past it, at every read: past 5,000
    engines x 2 writers every chunk was parsed again at every scrape. The cache now holds the
    last read's parses, however many (up to merge.KEPT_CEILING)."""
    parses: list[Any] = []
    real_parse = merge.parse_chunk

    def counted_parse(*args: Any) -> Any:
        parses.append(args)
        return real_parse(*args)

    monkeypatch.setattr(merge, "parse_chunk", counted_parse)
    engines = list(range(5_100))
    for role, n in (("api0", 3), ("api1", 5)):
        w = StatsWriter(config, catalog, engines=engines, client=fake_client(), start=False, role=role)
        for e in engines:
            w.counter("tokens").labels(engine=e).inc(n)
        assert w.flush()
        w._closed = True
    reader = StatsReader(config, catalog, client=fake_client())
    snap = reader.snapshot()
    assert len(snap.engines) == len(engines) and snap.engines[4_321].counter("tokens") == 8
    assert len(parses) == 2 * len(engines) > 10_000
    collector = RedisCollector(reader)
    text = collector.render_text()
    assert 'tokens_total{engine="5099"} 8\n' in text
    assert reader.snapshot().engines[5_099].counter("tokens") == 8
    assert len(parses) == 2 * len(engines)  # nothing parsed again, by either path
    assert len(reader._decoder._kept) == 2 * len(engines)  # exactly the last read's parses


def test_chunk_parses_kept_are_the_last_reads_up_to_the_ceiling(config, catalog, fake_client, monkeypatch):
    parses: list[Any] = []
    real_parse = merge.parse_chunk

    def counted_parse(*args: Any) -> Any:
        parses.append(args)
        return real_parse(*args)

    monkeypatch.setattr(merge, "parse_chunk", counted_parse)
    monkeypatch.setattr(merge, "KEPT_CEILING", 4)
    writers = _writers(config, catalog, fake_client, [0, 1, 2])
    reader = StatsReader(config, catalog, client=fake_client())
    first = _series(reader.snapshot())
    assert len(parses) == 6 and len(reader._decoder._kept) == 4  # past the ceiling: not kept
    assert _series(reader.snapshot()) == first
    assert len(parses) == 6 + 2  # the four kept are reused, the other two parsed again
    for w in writers:
        w._closed = True


def test_a_busy_fleets_old_parses_are_dropped_when_a_read_ends(config, catalog, fake_client):
    """The parses of chunks that changed were held until the next read began: two reads' worth
    of parses between scrapes of a busy fleet (every chunk changes). A read now drops them when
    it ends, by either path, and keeps exactly the ones it used."""
    writers = _writers(config, catalog, fake_client, [0, 1, 2])
    reader = StatsReader(config, catalog, client=fake_client())
    collector = RedisCollector(reader)
    kept = reader._decoder._kept
    for read in (reader.snapshot, collector.render_text, reader.snapshot):
        for w in writers:  # every chunk changes between two reads
            for e in (0, 1, 2):
                w.counter("tokens").labels(engine=e).inc(1)
            assert w.flush()
        read()
        held = [*kept.last.values(), *kept.now.values()]
        assert len(held) == 6  # the six chunks just read; none of the read before
        assert {text for text, _ in held} == {text for text, _ in kept.now.values()}
    for w in writers:
        w._closed = True


def test_parsed_names_are_kept_per_namespace(config, catalog, fake_client):
    """Caches do not cross namespaces: each reader keeps its own (a names field of the same
    text means the same series only against its own namespace's catalogue)."""
    names = "tokens\nrequests|stop"
    one = StatsReader(config, catalog, client=fake_client())._decoder
    other = StatsReader(config, catalog, client=fake_client())._decoder
    other.keys = Keys("another")
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
def _chunk_values(draw: Any) -> list[str]:
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
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.integers(1, 3).flatmap(lambda n: st.lists(_chunk_values(), min_size=n, max_size=n)),
    stale=st.integers(0, 3),
    base=_base,
)
def test_the_bulk_read_shows_what_the_line_by_line_read_shows(
    config, catalog, fake_client, values, stale, base
):
    from redis_stats._core.snapshot import layout_of

    histogram = "latency_seconds|" + layout_of(catalog.get("latency_seconds"))
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
        client.hset(keys.counters("0"), fields.chunk_field(writer, 0), "\n".join(lines))
        client.hset(keys.counters("0"), fields.chunk_field(writer, 0) + fields.NAMES_SUFFIX, names)
    for name, value in base.items():
        client.hset(keys.counters("0"), histogram if name == "H" else name, value)

    def read() -> tuple[str, Any]:
        reader = StatsReader(config, catalog, client=fake_client())
        text = RedisCollector(reader).render_text()
        snap = reader.snapshot()
        return text, snap

    real_merge = snapshot.SnapshotDecoder.merge
    merged: list[bool] = []

    def spy(*args: Any, **kw: Any) -> Any:
        found = real_merge(*args, **kw)
        merged.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(snapshot.SnapshotDecoder, "merge", spy)
        bulk_text, bulk = read()
    event(f"writers {len(values)}, base fields: {bool(base)}, read in bulk: {all(merged)}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(snapshot.SnapshotDecoder, "merge", lambda *args, **kw: None)  # line by line
        lines_text, lines = read()
    assert _texts(samples(bulk_text)) == _texts(samples(lines_text))  # NaN (inf + -inf) too
    assert skipped_of(samples(bulk_text)) == skipped_of(samples(lines_text))
    assert repr(_series(bulk)) == repr(_series(lines))
    assert dict(bulk.skipped) == dict(lines.skipped)
    # the text itself, line for line (ordering included), but for times and ages
    assert _stable(bulk_text) == _stable(lines_text)
