"""Test helpers for schema 2: what a writer's chunks in an engine's hash hold, and garbage planted
in one series' line (docs/key-schema.md).

The field encoding here is written from docs/key-schema.md ("Field encoding"), not imported from
the package: tests that plant data by hand check the documented format, through the public API.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from prometheus_client.utils import floatToGoString

from redis_stats.catalog import MetricSpec

NAMES_SUFFIX = "|n"
"""A chunk's names field is its values field and this."""
_UNESCAPES = {"\\": "\\", "/": "|", "n": "\n"}


def encode(components: tuple[str, ...] | list[str]) -> str:
    """A series field: the components joined by ``|``, each with ``\\`` as ``\\\\``, ``|`` as
    ``\\/`` and a newline as ``\\n``."""
    return "|".join(c.replace("\\", "\\\\").replace("|", "\\/").replace("\n", "\\n") for c in components)


def decode(field: str) -> list[str]:
    """The components of a series field (ValueError on an escape the format does not have)."""

    def unescape(found: re.Match[str]) -> str:
        if found.group(1) not in _UNESCAPES:
            raise ValueError(f"bad escape in {field!r}")
        return _UNESCAPES[found.group(1)]

    return [re.sub(r"\\(.)", unescape, part) for part in field.split("|")]


def chunk_field(writer: str, index: int) -> str:
    """The values field of chunk *index* of *writer*: ``@|<writer>|<index>``."""
    return encode(("@", writer, str(index)))


def chunk_writer(field: str) -> str | None:
    """The writer of a chunk's values field, or None if *field* is not one."""
    try:
        parts = decode(field)
    except ValueError:
        return None
    ok = len(parts) == 3 and parts[0] == "@" and parts[2].isascii() and parts[2].isdigit()
    return parts[1] if ok else None


def bucket_tag(spec: MetricSpec) -> str:
    """``h:<8 hex>``, the last component of a histogram's series fields: the SHA-1 of its bounds
    as ``le`` writes them (``+Inf`` last), joined by commas."""
    text = ",".join(str(floatToGoString(b)) for b in (*spec.buckets, float("inf")))
    return "h:" + hashlib.sha1(text.encode()).hexdigest()[:8]


def chunk_lines(client: Any, key: str) -> dict[tuple[str, str], tuple[str, int]]:
    """``(writer, series field) -> (values field, line index)`` of every line of every chunk."""
    found = client.hgetall(key)
    out = {}
    for name, values in found.items():
        writer = chunk_writer(name)
        if writer is None:
            continue
        names = found.get(name + NAMES_SUFFIX, "")
        for i, series in enumerate(names.split("\n") if names else []):
            out[(writer, series)] = (name, i)
        assert len(names.split("\n") if names else []) == len(values.split("\n") if values else [])
    return out


def series_values(client: Any, key: str) -> dict[tuple[str, str], str]:
    """``(writer, series field) -> value`` as the writers' chunks hold them."""
    found = client.hgetall(key)
    out = {}
    for (writer, series), (name, i) in chunk_lines(client, key).items():
        out[(writer, series)] = found[name].split("\n")[i]
    return out


def set_series_value(client: Any, key: str, series_prefix: str, value: str) -> str:
    """Replace the value of the first chunk line whose series field starts with *series_prefix*
    (garbage by hand); returns that series field."""
    for (_writer, series), (name, i) in chunk_lines(client, key).items():
        if series.startswith(series_prefix):
            values = client.hget(key, name).split("\n")
            values[i] = value
            client.hset(key, name, "\n".join(values))
            return series
    raise AssertionError(f"no series {series_prefix!r} in {key}")


def add_series_line(client: Any, key: str, writer: str, series: str, value: str) -> None:
    """Append a series line to *writer*'s first chunk in *key* (by hand: another program's)."""
    name = chunk_field(writer, 0)
    names, values = client.hget(key, name + NAMES_SUFFIX), client.hget(key, name)
    client.hset(key, name + NAMES_SUFFIX, f"{names}\n{series}" if names else series)
    client.hset(key, name, f"{values}\n{value}" if names else value)


def writer_fields(client: Any, key: str, writer: str) -> list[str]:
    """The fields of *writer*'s chunks (values and names) in *key*."""
    return [f for f in client.hkeys(key) if chunk_writer(f.removesuffix(NAMES_SUFFIX)) == writer]
