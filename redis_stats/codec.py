"""Every text the store holds, written and read here (docs/key-schema.md): one module, one format.

- **a series' field**: components joined by ``|``: the metric name, the label values in declared
  order, then, for a histogram, its bucket layout (``h:<8 hex>``). In each component ``\\`` is
  written ``\\\\``, ``|`` is written ``\\/`` and a newline ``\\n``, so a ``|`` in a field is always a
  separator and a field is always one line. Label values with none of these (nearly all) are
  stored as they are, and decoding them is one ``str.split``;
- **a writer's chunk**: ``@|<writer>|<k>`` holds the values of up to :data:`CHUNK_SIZE` series,
  one line each, and ``@|<writer>|<k>|n`` their fields, one line each in the same order;
- **a value line**, by kind: a counter's total (``str`` of an int, ``repr`` of a float); a
  histogram's ``"<sum> <c0> ... <cN>"`` (cumulative counts, ``+Inf`` last); a gauge's
  ``"<stamp ms>|<value>"`` (its stamp in the server's clock). Read one line at a time
  (:func:`number_text`, :func:`gauge_parts`, :func:`histogram_numbers`) or a chunk's column at a
  time (:func:`counter_column`, :func:`histogram_column`, :func:`gauge_column`: the fast path of
  every read, which leaves to the line-by-line rules whatever it does not take);
- **a writer's stats hash**: the fields every reader judges a writer by (:data:`LIVENESS_FIELDS`);
- **a load entry**: a writer's router numbers for one engine (:func:`encode_entry`,
  :func:`decode_entries`; its version and :data:`FIELDS`), which redis_stats/load.py rolls up.

The one other place that reads these texts is ``gc.lua``'s fold of a departed writer's totals
(it adds value lines in Lua). A reader takes what a writer one release older or newer may have
written: a value line with parts it does not know after the ones it does is read as those ones.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, pairwise
from json import JSONDecoder
from json.scanner import make_scanner
from math import isnan
from typing import Any, NamedTuple

SEP = "|"
_UNESCAPE_RE = re.compile(r"\\(.)")
_UNESCAPES = {"\\": "\\", "/": "|", "n": "\n"}


def _escape(component: str) -> str:
    if "\\" in component or SEP in component or "\n" in component:
        return component.replace("\\", "\\\\").replace(SEP, "\\/").replace("\n", "\\n")
    return component


def _unescape(component: str) -> str:
    def sub(match: re.Match[str]) -> str:
        char = match.group(1)
        if char not in _UNESCAPES:
            raise ValueError(f"bad escape \\{char} in field component {component!r}")
        return _UNESCAPES[char]

    return _UNESCAPE_RE.sub(sub, component)


def encode(components: tuple[str, ...] | list[str]) -> str:
    """Join *components* into one field."""
    return SEP.join([_escape(c) for c in components])


def decode(field: str) -> list[str]:
    """Split *field* back into its components (raises ValueError on a malformed escape)."""
    parts = field.split(SEP)
    if "\\" in field:
        parts = [_unescape(p) for p in parts]
    return parts


def bound_text(bound: float) -> str:
    """A bucket bound as Prometheus writes ``le`` (``0.005``, ``1e+06``, ``+Inf``)."""
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(bound))


def bucket_tag(bounds: tuple[float, ...] | list[float]) -> str:
    """``h:<8 hex>``: names a histogram's bucket bounds. It ends the field of a histogram series,
    so a reader never applies counts to the wrong bounds when a bucket list changes."""
    text = ",".join(bound_text(b) for b in bounds)
    return "h:" + hashlib.sha1(text.encode()).hexdigest()[:8]


# -- a writer's chunks (schema 2, see docs/key-schema.md) ------------------------------------------
#
# A writer keeps its absolute state of one engine in chunks of that engine's hash: the field
# ``@|<writer>|<k>`` holds the values of up to CHUNK_SIZE series, one per line, and the field
# ``@|<writer>|<k>|n`` their series fields, one per line in the same order. A series field starts
# with a metric name, never with "@", so a chunk field cannot be taken for a series.

LINES = "\n"


def chunk_text(lines: Iterable[str]) -> str:
    """A chunk's names or values: one line each."""
    return LINES.join(lines)


def chunk_lines(text: str) -> list[str]:
    """A chunk's names or values back as lines (none for ``""``)."""
    return text.split(LINES) if text else []


CHUNK_PREFIX = "@" + SEP
NAMES_SUFFIX = SEP + "n"
CHUNK_SIZE = 64


def chunk_field(writer: str, index: int) -> str:
    """The field of chunk *index* of *writer* (its values); its names are this + ``|n``."""
    return encode(("@", writer, str(index)))


def chunk_writer(field: str) -> str | None:
    """The writer of a chunk's values field ``@|<writer>|<k>``, or None if it is not one."""
    if "\\" not in field:  # no escape (every writer id but one holding |, \\ or a newline): no decode
        head, sep, index = field.rpartition(SEP)
        writer = head[2:]
        plain = sep and head.startswith(CHUNK_PREFIX) and SEP not in writer
        if plain and index.isdigit() and index.isascii():
            return writer
    try:
        parts = decode(field)
    except ValueError:
        return None
    # the index: ASCII digits only (isdigit alone takes "²")
    if len(parts) != 3 or parts[0] != "@" or not (parts[2].isdigit() and parts[2].isascii()):
        return None
    return parts[1]


# -- a writer's stats hash: the fields every reader judges it by ---------------------------------

STALE_FIELD = "stale_ms"
"""The field of a writer's stats hash that holds its ``stale_after`` in milliseconds."""

FLUSH_FIELD = "flush_ms"
"""The field of a writer's stats hash that holds its ``flush_interval`` in milliseconds."""

ENDPOINT_FIELD = "endpoint"
"""The field of a writer's stats hash that holds its ``endpoint`` (absent: none)."""

LIVENESS_FIELDS = (STALE_FIELD, FLUSH_FIELD, ENDPOINT_FIELD)
"""The fields of a writer's stats hash the liveness rule and the endpoint views read."""


# -- value lines: written ------------------------------------------------------------------------


def counter_text(total: int | float) -> str:
    """A counter's total as stored: ``str`` of an int (exact at any size), ``repr`` of a float."""
    return str(total) if total.__class__ is int else repr(total)


def histogram_text(total: float, counts: Sequence[int]) -> str:
    """A histogram as stored from its sum and its per-bucket counts: ``"<sum> <c0> ... <cN>"``,
    the counts cumulative (the ``+Inf`` bucket last: the count), so a reader prints them as they
    are."""
    return " ".join([repr(total), *map(str, accumulate(counts))])


def counter_total(text: str) -> int | float:
    """A counter's total back from its text as this writer stored it (``str`` of an int, ``repr``
    of a float): exact."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def gauge_text(stamp_ms: float, value: float) -> str:
    """A gauge as stored: ``"<stamp ms>|<value>"``, the stamp in the server's clock (ms, three
    decimals: microseconds), the value a float's ``repr``."""
    return f"{stamp_ms:.3f}|{float(value)!r}"


# -- value lines: read, one at a time -------------------------------------------------------------

# A number as Prometheus' text format writes it: what float() takes,
# but with no spaces, no "_" and no NaN (float() accepts all three; a NaN is no sample); the
# infinities come out as +Inf / -Inf. Checked with str methods, not a regex: this runs per sample.
NUMBER_CHARS = "0123456789.+-eE"
_INFINITIES = {"inf": "+Inf", "+inf": "+Inf", "-inf": "-Inf", "infinity": "+Inf", "+infinity": "+Inf"}
_INFINITIES["-infinity"] = "-Inf"
# An integer of more digits is not a count or a total: garbage. Python's int() refuses more than
# 4,300 digits by default (sys.set_int_max_str_digits, which may lower it to 640): without a
# bound, one such value in Redis would fail every read.
MAX_DIGITS = 600
# Below it, float() of an int is float() of its text; from 2**1024 on, float() of an int raises.
FLOAT_BOUND = 10**308


def number_text(raw: Any) -> str | None:
    """*raw* (a stored counter or gauge value) as sample text, or None when it is not a number.

    Numbers come back unchanged (what the flush script writes, so the text renderer prints them
    as they are); ``inf`` forms as ``+Inf``/``-Inf``; anything else (NaN, spaces, ``1_000``,
    words) is None: the value is skipped and counted as ``bad_value``.
    """
    if raw.__class__ is not str:
        return None
    if raw.isdigit() and raw.isascii():
        return raw if len(raw) <= MAX_DIGITS else None
    if raw.strip(NUMBER_CHARS):  # letters, spaces, "_", other digits: only an infinity passes
        return _INFINITIES.get(raw.lower())
    try:
        float(raw)
    except ValueError:  # "", "1.2.3", "--1"
        return None
    return raw


def counter_number(text: str | None) -> int | float | None:
    """A counter's sample text (as :func:`number_text` gives it; None: not a number) as the
    number a read adds up: an int when it is an integer below 10**308 (exact, however many
    writers), else a float."""
    if text is None:
        return None
    if text.isdigit():
        value = int(text)
        if value < FLOAT_BOUND:
            return value
    return float(text)


def gauge_parts(raw: Any) -> tuple[float, float, str] | None:
    """A stored gauge value ``"<wall ms>|<value>"`` as (stamp, value, value as sample text), or
    None when either part is not a number (the value by :func:`number_text`'s rule, inlined:
    this runs for every gauge of every scrape). Parts after the value (a newer writer's) are
    left out."""
    if raw.__class__ is not str:
        return None
    stamp_text, sep, value_text = raw.partition("|")
    value_text = value_text.partition("|")[0]
    try:
        stamp, value = float(stamp_text), float(value_text)
    except ValueError:
        return None
    if not sep or stamp != stamp or value != value:
        return None
    if value_text.strip(NUMBER_CHARS):  # float() took spaces, "_" or a word: only infinities
        text = _INFINITIES.get(value_text.lower())
        return None if text is None else (stamp, value, text)
    return stamp, value, value_text


def histogram_numbers(raw: Any, size: int) -> tuple[str, list[str], list[int] | list[float]] | None:
    """A stored histogram value ``"<sum> <c0> ... <cN>"`` (*size* cumulative counts, ``+Inf``
    last) as (sum text, count texts, counts as numbers: ints when they are all integers, as the
    writers store them), or None when it is malformed: too few parts, a part that is not a
    number, a negative count or counts that go down. Parts after the counts (a newer writer's)
    are left out."""
    if raw.__class__ is not str:
        return None
    parts = raw.split(" ")
    total = _sum_text(parts[0])
    if len(parts) < size + 1 or total is None:
        return None
    counts = _counts(parts[1 : size + 1])
    return None if counts is None else (total, counts[0], counts[1])


def histogram_counts(raw: str) -> tuple[float, list[int]]:
    """A stored histogram value as its sum and per-bucket counts (the cumulative counts taken
    apart: what a writer continuing from it adds to); ValueError when it is not one."""
    parts = raw.split(" ")
    cumulative = [int(x) for x in parts[1:]]
    return float(parts[0]), [b - a for a, b in zip([0, *cumulative], cumulative)]


def _sum_text(text: str) -> str | None:
    """A histogram's sum as sample text, None if it is not a number (:func:`number_text`'s
    rule, but for an integer of any length: a sum is a float)."""
    if text.strip(NUMBER_CHARS):
        return _INFINITIES.get(text.lower())
    try:
        float(text)
    except ValueError:
        return None
    return text


def _counts(texts: list[str]) -> tuple[list[str], list[int] | list[float]] | None:
    """A histogram's cumulative count texts as (texts, numbers), or None when one is not a
    number, is negative or is below the one before it."""
    joined = "".join(texts)
    if joined.isdigit() and joined.isascii() and all(texts):  # integers: what the flush writes
        ints = [] if max(map(len, texts)) > MAX_DIGITS else [*map(int, texts)]
        return (texts, ints) if ints and ints == sorted(ints) else None
    return _float_counts(texts)


def _float_counts(texts: list[str]) -> tuple[list[str], list[float]] | None:
    """:func:`_counts` of counts that are not all plain integers (``5.0``, ``1e5``)."""
    checked = [number_text(c) for c in texts]
    if None in checked:
        return None
    values = [float(t) for t in checked]  # type: ignore[arg-type]
    if values[0] < 0 or any(b < a for a, b in pairwise(values)):
        return None
    return checked, values  # type: ignore[return-value]


# -- value lines: read, a chunk's column at a time (the fast path) --------------------------------


class NotClean(Exception):
    """A value the column readers do not take: the line-by-line rules decide instead."""


_HISTOGRAM_CHARS = b"0123456789.+eE "
# The C scanner: (value, end) from a string and an index.
_scan_json: Callable[[str, int], tuple[Any, int]] = make_scanner(JSONDecoder())  # type: ignore[arg-type]


def counter_column(texts: Sequence[str]) -> tuple[Sequence[Any], bool, Sequence[str]]:
    """A chunk's counter lines as numbers (by :func:`counter_number`'s rule), whether all are
    ints, and their sample texts: one JSON scan when they are plain integers below 10**308, as
    writers store them; :class:`NotClean` for one that is not a number."""
    if not texts:
        return (), True, ()
    joined = "".join(texts)
    if joined.isdigit() and joined.isascii() and all(texts) and max(map(len, texts)) <= MAX_DIGITS:
        try:
            ints: list[int] = _scan_json("[" + ",".join(texts) + "]", 0)[0]
        except (ValueError, StopIteration):  # "007": int() of each reads it
            ints = [*map(int, texts)]
        if max(ints) < FLOAT_BOUND:
            return ints, True, texts
    checked = [number_text(raw) for raw in texts]
    if None in checked:
        raise NotClean
    numbers = [*map(counter_number, checked)]
    return numbers, all(n.__class__ is int for n in numbers), checked  # type: ignore[return-value]


def histogram_column(lines: Sequence[str], spaces: list[int]) -> tuple[list[Any], str]:
    """A chunk's histogram lines (each with its number of *spaces*: its counts) as one list of
    numbers, each line's sum then its cumulative counts, and the lines joined by spaces: one JSON
    scan; :class:`NotClean` where the line-by-line rules must decide (negative or non-integer
    counts, numbers beyond a float, garbage)."""
    if [line.count(" ") for line in lines] != spaces:  # each line its own number of parts
        raise NotClean
    joined = " ".join(lines)
    # Only digits, ".", "e", "E", "+" (no "-": a negative sum, rare, or "-0" as a count; no
    # letters: NaN, infinities, JSON's true/null/strings): what JSON then reads as numbers
    # exactly as int() and float() read them, or refuses ("007", "1e", "+1").
    if not joined.isascii() or joined.encode().translate(None, _HISTOGRAM_CHARS):
        raise NotClean  # (deleting the allowed bytes: ~20x faster than str.strip)
    try:
        numbers: list[Any] = _scan_json("[" + joined.replace(" ", ",") + "]", 0)[0]
    except (ValueError, StopIteration):  # "", "1e", "007", a count over 4,300 digits
        raise NotClean from None
    return numbers, joined


def gauge_column(lines: Sequence[str], bars: list[int]) -> list[tuple[float, float, str]]:
    """A chunk's gauge lines as ``(stamp, value, value text)``; :class:`NotClean` for anything
    :func:`gauge_parts` would have to decide."""
    if [line.count("|") for line in lines] != bars:  # each line one "|": "<stamp>|<value>"
        raise NotClean
    parts = "|".join(lines).split("|")
    value_texts = parts[1::2]
    if "".join(value_texts).strip(NUMBER_CHARS):  # an infinity or garbage: the line-by-line rules
        raise NotClean
    try:
        stamps = [*map(float, parts[0::2])]
        values = [*map(float, value_texts)]
    except ValueError:
        raise NotClean from None
    if any(map(isnan, stamps)):
        raise NotClean
    return [*zip(stamps, values, value_texts)]


# --- a load entry (docs/key-schema.md, the load hash; docs/load.md) ---------------------------

# The feed's fields, in the order an entry stores them. A release only ever APPENDS fields (never
# reorders or drops one): a reader takes the fields it knows of a newer writer's longer entry and
# None for the fields an older writer's shorter entry lacks, so during a rolling upgrade (writers
# and readers of two releases at once) every engine keeps its numbers. Gauges (every field not
# ``*_per_second``) roll up over an engine's live writers by their metric's mode; rates add up.
FIELDS = (
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "kv_cache_capacity_tokens",
    "prompt_tokens_per_second",
    "generation_tokens_per_second",
    # appended in 0.2 (issue 40): SGLang's model gateway reads them per data-parallel rank
    "max_running_requests",
    "prefix_cache_queries_per_second",
    "prefix_cache_hits_per_second",
    # appended in 0.3 (issue 47): requests the engine's front end holds (arrived, not yet ended),
    # counted by the process that received them (redis_stats.arrivals); summed over the writers
    "in_flight",
)

# The stored entry's format (its first component): the version of its layout, not of its field
# list (fields are appended within a version, above). An entry of another version is skipped and
# counted (``bad_entry``), so a writer that reorders fields never turns into wrong numbers here.
ENTRY_VERSION = "1"


class LoadEntry(NamedTuple):
    """One writer's entry for one engine, as stored (see :func:`encode_entry`)."""

    stored_ms: float
    """Server time (ms) the entry was stored: its age."""
    stamp_ms: float
    """The newest stamp of its gauges' values (server clock, ms): ``mostrecent`` picks the newest."""
    modes: int
    """Each gauge field's roll-up mode, two bits each (:data:`MODE_CODES`), field 0 lowest."""
    values: tuple[float | None, ...]
    """One per :data:`FIELDS` (None: not reported by this writer, or a field its release did not
    have yet)."""

    def mode(self, i: int) -> str:
        """The roll-up mode of gauge field *i*."""
        return _MODES[(self.modes >> (2 * i)) & 3]


# A gauge field's roll-up mode in an entry: its index here.
_MODES = ("mostrecent", "sum", "max", "min")
MODE_CODES = {mode: i for i, mode in enumerate(_MODES)}


def _text(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "null"
    return repr(float(value))


def encode_entry(stamp_ms: float, modes: Iterable[str], values: Iterable[float | None]) -> str:
    """The entry a writer sends (``load.lua`` puts the server time and a comma in front):
    ``<version>,<stamp ms>,<modes>,<value>,...`` in :data:`FIELDS` order, ``null`` for a field
    the writer does not report (or a value that is not finite): with brackets around it, a
    JSON list, so a reader parses every entry of a read in one call."""
    code = sum(MODE_CODES.get(m, 0) << (2 * i) for i, m in enumerate(modes))
    return ",".join([ENTRY_VERSION, f"{stamp_ms:.0f}", str(code), *map(_text, values)])


# What a stored entry may hold (digits, signs, exponents, commas, null): anything else (a list,
# a string, NaN, Infinity) is not read in bulk but entry by entry, and then skipped.
_PLAIN = str.maketrans("", "", "0123456789.eE+-,nul")
_HEAD = 4  # stored ms, version, stamp, modes: then the values
_WIDTH = _HEAD + len(FIELDS)
_MISSING = (None,) * len(FIELDS)
_NUMBER = functools.partial(operator.is_not, None)  # x is not None, as a C callable
_VERSION = int(ENTRY_VERSION)


def _checked(row: Any) -> LoadEntry | None:
    """An entry from a parsed row of any JSON, every element checked."""
    if row.__class__ is not list or len(row) < _HEAD:
        return None
    for x in row:
        if x is not None and x.__class__ not in (int, float):
            return None
    return _plain(row)


def _plain(row: list[Any]) -> LoadEntry | None:
    """An entry from a row known to hold numbers and nulls only (JSON's: an exponent past the
    float range reads as inf, an integer of hundreds of digits as an int beyond it: refused)."""
    try:
        if not all(map(math.isfinite, filter(_NUMBER, row))):  # every number, in C
            return None
    except OverflowError:
        return None
    if (
        len(row) < _HEAD
        or row[1] != _VERSION
        or row[3].__class__ is not int
        or row[0] is None
        or row[2] is None
    ):
        return None  # another layout (ENTRY_VERSION), or not an entry
    values = tuple(row[_HEAD:_WIDTH])
    if len(values) < len(FIELDS):  # an older writer's: the fields appended since are not reported
        values += _MISSING[len(values) :]
    return LoadEntry(row[0], row[2], row[3], values)


def decode_entry(stored: str) -> LoadEntry | None:
    """A stored entry (``<server ms>,`` + :func:`encode_entry`), or None when it is not one this
    version reads (another entry version, garbage)."""
    if stored.__class__ is not str:
        return None
    try:
        return _checked(json.loads("[" + stored + "]"))
    except (ValueError, RecursionError):
        return None


def decode_entries(stored: list[Any]) -> list[LoadEntry | None]:
    """:func:`decode_entry` of each of *stored*, in one JSON parse when they all look plain (the
    usual case: numbers and nulls only, checked on the text), else one by one."""
    if all(s.__class__ is str for s in stored):
        joined = "],[".join(stored)
        if not "".join(stored).translate(_PLAIN):
            try:
                rows = json.loads("[[" + joined + "]]")
            except ValueError:
                rows = None
            if rows is not None and len(rows) == len(stored):
                return [_plain(r) if r.__class__ is list else None for r in rows]
    return [decode_entry(s) for s in stored]


# --- a booking (docs/key-schema.md, the bookings hash; docs/routers.md) -------------------------
#
# ``book.lua`` stores ``<request id>`` -> ``<engine>|<ends ms>|<router>`` (the ends in the server's
# clock: the booking's bounded time); the router's lease is its score in the ``routers`` zset.


class Booking(NamedTuple):
    """One router's booking of one request on one engine, as stored."""

    engine: int
    ends_ms: float
    router: str


def decode_booking(stored: Any) -> Booking | None:
    """A stored booking (``<engine>|<ends ms>|<router>``), or None when it is not one."""
    if stored.__class__ is not str:
        return None
    engine, sep, rest = stored.partition(SEP)
    ends, sep2, router = rest.partition(SEP)
    if not (sep and sep2 and router and engine.isascii() and engine.isdigit() and len(engine) < 10):
        return None
    try:
        ends_ms = float(ends)
    except ValueError:
        return None
    return Booking(int(engine), ends_ms, router) if math.isfinite(ends_ms) else None
