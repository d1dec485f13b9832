"""What cannot be encoded is refused where it enters (issue 12.2), with fakeredis.

Label values: ``labels()`` returns a child or raises CatalogError, never anything else; a value
that could not be sent (a lone surrogate) is refused there, so it never stops a writer's flushes.
Amounts: ``inc``/``set``/``observe`` never raise; what is not a real number within the float range
is dropped and counted as ``invalid_value``; a flush after any sequence stores exactly the rest.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redis_stats import CatalogError, StatsReader, StatsWriter
from tests.chunked import series_values

FLOAT_MAX = sys.float_info.max
I64_MAX = 2**63 - 1
_examples = itertools.count()


class FloatLike:
    """Like a numpy 0-d array: not a ``numbers.Real``, but ``float()`` works."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"FloatLike({self.value!r})"


class Hostile:
    """Every conversion raises something unusual."""

    def __float__(self) -> float:
        raise RuntimeError("no float")

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("no order")

    __le__ = __gt__ = __ge__ = __lt__

    def __neg__(self) -> Hostile:
        raise RuntimeError("no neg")


AMOUNTS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([10**400, -(10**400), I64_MAX, I64_MAX + 1, 2**1023 * 2 - 1, 10**308, 2**1024]),
    st.floats(),
    st.floats(min_value=0, max_value=1e6),
    st.decimals(),
    st.sampled_from([Decimal(x) for x in ("NaN", "sNaN", "-Infinity", "1e400", "2.5")]),
    st.fractions(),
    st.just(Fraction(10**400, 3)),
    st.booleans(),
    st.text(max_size=5),
    st.none(),
    st.complex_numbers(max_magnitude=10),
    st.builds(FloatLike, st.floats()),
    st.just(Hostile()),
)


def expected_real(x: object) -> float | int | None:
    """The number a valid amount stands for, None if it is not a real number at all."""
    if isinstance(x, (str, bytes, complex)) or x is None or isinstance(x, Hostile):
        return None
    if isinstance(x, int):  # bool too
        return int(x)
    try:
        return float(x)  # Decimal, Fraction, FloatLike
    except (OverflowError, ValueError):
        return None


def counter_ok(x: object) -> bool:
    v = expected_real(x)
    return v is not None and v == v and 0 <= v <= FLOAT_MAX


def finite_ok(x: object) -> bool:
    v = expected_real(x)
    return v is not None and v == v and -FLOAT_MAX <= v <= FLOAT_MAX


@pytest.fixture
def cfg(config):
    return config.replace(max_label_length=10_000)


def _writer(cfg, catalog, fake_client) -> StatsWriter:
    return StatsWriter(cfg, catalog, engines=[0], client=fake_client(), start=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(st.tuples(st.sampled_from(["inc", "set", "ginc", "gdec", "observe"]), AMOUNTS), max_size=25)
)
def test_amounts_never_raise_and_a_flush_stores_exactly_the_valid_part(cfg, catalog, fake_client, ops):
    w = _writer(cfg.replace(namespace=f"{cfg.namespace}-{next(_examples)}"), catalog, fake_client)
    counter = w.counter("tokens").labels(engine=0)
    gauge = w.gauge("running").labels(engine=0)
    hist = w.histogram("latency_seconds").labels(engine=0)
    total = Fraction(0)  # exact: the stored total may only differ by float rounding
    gauge_value = 0.0
    gauge_set = False
    observed, observed_sum = 0, 0.0
    invalid = 0
    for op, x in ops:
        if op == "inc":
            counter.inc(x)
            if counter_ok(x):
                total += Fraction(expected_real(x))
            else:
                invalid += 1
        elif op == "set":
            gauge.set(x)
            try:
                v = float(x)  # set() takes what float() takes, as prometheus_client's Gauge.set
            except Exception:
                v = math.nan
            if v == v:
                gauge_value, gauge_set = v, True
            else:
                invalid += 1
        elif op in ("ginc", "gdec"):
            (gauge.inc if op == "ginc" else gauge.dec)(x)
            if finite_ok(x):
                v = expected_real(x)
                gauge_value += v if op == "ginc" else -v
                gauge_set = True
            else:
                invalid += 1
        else:
            hist.observe(x)
            if finite_ok(x):
                observed += 1
                observed_sum += expected_real(x)
            else:
                invalid += 1
    assert w.drops.get("invalid_value", 0) == invalid
    assert w.flush()
    assert not w.stats.errors
    reader = StatsReader(w.config, catalog, client=fake_client())
    engine = reader.snapshot().engines[0]
    stored = engine.counter("tokens")
    dropped = stored == 0 and w.drops.get("invalid_value", 0) == invalid + 1
    if total > FLOAT_MAX * (1 + 2**-52):  # valid amounts whose sum passed the float range
        assert dropped
    elif total > FLOAT_MAX:
        # Within rounding of the largest float: float addition may round the sum down to it
        # (stored) or past it (dropped and counted); either is exact to float precision.
        assert dropped or stored == FLOAT_MAX
    else:
        assert stored == pytest.approx(float(total), rel=1e-9)
    if gauge_set:
        assert engine.gauge("running") == pytest.approx(gauge_value, rel=1e-12)
    h = engine.histogram("latency_seconds")
    assert h.count == observed
    if math.isfinite(observed_sum):
        assert h.sum == pytest.approx(observed_sum, rel=1e-9, abs=1e-9)


def test_issue_amounts_are_dropped_not_raised_nor_stored(cfg, catalog, fake_client):
    w = _writer(cfg, catalog, fake_client)
    w.gauge("running").labels(engine=0).set(10**400)
    w.gauge("running").labels(engine=0).inc(10**400)
    w.histogram("latency_seconds").labels(engine=0).observe(10**400)
    w.counter("tokens").labels(engine=0).inc(Decimal("NaN"))
    w.counter("tokens").labels(engine=0).inc(10**400)
    w.counter("tokens").labels(engine=0).inc(2**64)  # beyond HINCRBY: sent as a float
    w.counter("tokens").labels(engine=0).inc(5)
    assert w.drops == {"invalid_value": 5}
    assert w.flush()
    snap = StatsReader(cfg, catalog, client=fake_client()).snapshot()
    assert snap.engines[0].counter("tokens") == float(2**64 + 5)
    stored = series_values(fake_client(), w.keys.counters(0))[(w.writer_id, "tokens")]
    assert len(stored) < 40  # no 401-digit literal


LABEL_VALUES = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(codec=None, categories=None), max_size=8),  # surrogates included
    st.builds(
        lambda a, cp, b: a + chr(cp) + b,
        st.text(max_size=3),
        st.integers(0xD800, 0xDFFF),
        st.text(max_size=3),
    ),
    st.integers(),
    st.floats(),
    st.decimals(),
    st.booleans(),
    st.none(),
    st.binary(max_size=4),
    st.just(Hostile()),
    st.sampled_from(["a|b", "\\", "\\/", "|", ""]),
)


def _encodable(v: object) -> str | None:
    try:
        text = str(v)
        text.encode("utf-8")
    except Exception:
        return None
    return text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(LABEL_VALUES, max_size=12))
def test_label_values_bind_or_raise_catalog_error_and_flushes_store_the_valid_ones(
    cfg, catalog, fake_client, values
):
    w = _writer(cfg.replace(namespace=f"{cfg.namespace}-{next(_examples)}"), catalog, fake_client)
    metric = w.counter("requests")
    expected: dict[str, int] = {}
    for v in values:
        text = _encodable(v)
        if text is None:
            with pytest.raises(CatalogError, match="'reason'"):
                metric.labels(engine=0, reason=v)
            continue
        metric.labels(engine=0, reason=v).inc()
        expected[text] = expected.get(text, 0) + 1
    assert w.flush()
    assert not w.stats.errors
    snap = StatsReader(w.config, catalog, client=fake_client()).snapshot()
    counters = snap.engines[0].counters
    got = {labels[0]: value for (name, labels), value in counters.items() if name == "requests"}
    assert got == expected


def test_lone_surrogate_label_is_refused_and_the_writer_keeps_flushing(cfg, catalog, fake_client):
    w = _writer(cfg, catalog, fake_client)
    tokens = w.counter("tokens").labels(engine=0)
    bad = json.loads('"\\ud800"')
    with pytest.raises(CatalogError, match=r"label 'reason' value '\\ud800' cannot be encoded as UTF-8"):
        w.counter("requests").labels(engine=0, reason=bad)
    for _ in range(4):
        for _ in range(100):
            tokens.inc()
        assert w.flush()
    assert not w.stats.errors
    assert StatsReader(cfg, catalog, client=fake_client()).snapshot().total("tokens") == 400
