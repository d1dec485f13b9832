"""Test helpers for schema 2: what a writer's chunks in an engine's hash hold, and garbage planted
in one series' line (docs/key-schema.md)."""

from __future__ import annotations

from typing import Any

from redis_stats._core import fields


def chunk_lines(client: Any, key: str) -> dict[tuple[str, str], tuple[str, int]]:
    """``(writer, series field) -> (values field, line index)`` of every line of every chunk."""
    found = client.hgetall(key)
    out = {}
    for name, values in found.items():
        writer = fields.chunk_writer(name)
        if writer is None:
            continue
        names = found.get(name + fields.NAMES_SUFFIX, "")
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
    name = fields.chunk_field(writer, 0)
    names, values = client.hget(key, name + fields.NAMES_SUFFIX), client.hget(key, name)
    client.hset(key, name + fields.NAMES_SUFFIX, f"{names}\n{series}" if names else series)
    client.hset(key, name, f"{values}\n{value}" if names else value)


def writer_fields(client: Any, key: str, writer: str) -> list[str]:
    """The fields of *writer*'s chunks (values and names) in *key*."""
    return [
        f for f in client.hkeys(key) if fields.chunk_writer(f.removesuffix(fields.NAMES_SUFFIX)) == writer
    ]
