"""Where the usage ledger lives in Redis and how each stored text reads, both ways
(docs/key-schema.md, "Usage").

Every key is under the namespace's data prefix (``rs:{NS}:v2:u:...``, or a shard's own tag), so
no tenant, adapter or model name is ever part of a key name: they are hash fields and sorted-set
members only, and cannot reach another namespace's keys. A tenant lives in shard
``crc32(tenant) % K`` of a namespace split into K shards.

``u:seq`` (hash) writer -> last applied batch; ``u:seen`` (zset) writer -> ms of it; ``u:conf``
(hash) the retention in hours and days; ``u:e`` (hash) entity -> all-time values; ``u:t`` (hash)
tenant -> all-time values; ``u:rank`` (zset) tenant -> all-time prompt + generation tokens;
``u:sum`` (string) every tenant's all-time values; ``u:eh:<YYYYMMDDHH>`` / ``u:th:<...>`` entity
/ tenant -> values of that UTC hour; ``u:ed:<YYYYMMDD>`` / ``u:td:<...>`` the same by UTC day.

An **entity** is one (tenant, adapter, model): its field is the JSON array of the three.
**Values** are eight decimal integers separated by spaces: requests, prompt tokens, cached
prompt tokens, generation tokens, then requests by outcome: stop, length, abort, error.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass

from redis_stats.keys import Keys

__all__ = [
    "FIELDS",
    "OUTCOMES",
    "UsageKeys",
    "day_of",
    "decode_entity",
    "decode_values",
    "encode_entity",
    "encode_values",
    "hour_of",
    "tenant_shard",
]

OUTCOMES = ("stop", "length", "abort", "error")
"""How a request ended: stopped (EOS or a stop string), length-capped, aborted (by the client or
the server: what was generated counts), failed."""

FIELDS = ("requests", "prompt_tokens", "cached_prompt_tokens", "generation_tokens", *OUTCOMES)
"""The eight numbers of every stored value line, in order."""


def tenant_shard(tenant: str, shards: int) -> int:
    """The shard holding *tenant*'s usage in a namespace split into *shards*."""
    return zlib.crc32(tenant.encode("utf-8")) % shards if shards > 1 else 0


def hour_of(unix: float) -> int:
    """The UTC hour (hours since the epoch) *unix* seconds fall in."""
    return int(unix // 3600)


def day_of(hour: int) -> int:
    """The UTC day (days since the epoch) of *hour*."""
    return hour // 24


def hour_name(hour: int) -> str:
    """``YYYYMMDDHH`` of *hour* (UTC): the suffix of its bucket keys."""
    return time.strftime("%Y%m%d%H", time.gmtime(hour * 3600))


def day_name(day: int) -> str:
    """``YYYYMMDD`` of *day* (UTC)."""
    return time.strftime("%Y%m%d", time.gmtime(day * 86400))


def encode_entity(tenant: str, adapter: str, model: str) -> str:
    """The hash field of one (tenant, adapter, model): a compact JSON array (any text in it)."""
    return json.dumps([tenant, adapter, model], ensure_ascii=False, separators=(",", ":"))


def decode_entity(field: str) -> tuple[str, str, str] | None:
    """The (tenant, adapter, model) of an entity field; None if it is not one (garbage)."""
    try:
        parts = json.loads(field)
    except ValueError:
        return None
    if isinstance(parts, list) and len(parts) == 3 and all(isinstance(p, str) for p in parts):
        return parts[0], parts[1], parts[2]
    return None


def encode_values(values: list[int] | tuple[int, ...]) -> str:
    """One value line (the eight numbers, space separated)."""
    return " ".join(map(str, values))


def decode_values(text: str | bytes | None) -> tuple[int, ...] | None:
    """The eight numbers of a value line (missing trailing ones: 0); None if it is garbage."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    parts = text.split(" ")
    if len(parts) > len(FIELDS) or not all(p.isascii() and p.isdigit() and len(p) < 20 for p in parts):
        return None
    numbers = [int(p) for p in parts]
    return tuple(numbers + [0] * (len(FIELDS) - len(numbers)))


@dataclass(frozen=True)
class UsageKeys:
    """The usage keys of one shard of a namespace (*keys*: that shard's :class:`Keys`)."""

    keys: Keys

    @property
    def base(self) -> str:
        """The start of every usage key of the shard."""
        return self.keys.usage("")

    def fixed(self) -> list[str]:
        """KEYS[1..7] of ``usage.lua``: seq, seen, conf, totals, tenants, rank, sum."""
        return self.keys.usage_fixed()

    @property
    def conf(self) -> str:
        """Hash: the retention (``hours``, ``days``) the writers last wrote with."""
        return self.base + "conf"

    @property
    def totals(self) -> str:
        """Hash: entity -> all-time values."""
        return self.base + "e"

    @property
    def tenants(self) -> str:
        """Hash: tenant -> all-time values."""
        return self.base + "t"

    @property
    def rank(self) -> str:
        """Sorted set: tenant -> all-time prompt + generation tokens."""
        return self.base + "rank"

    @property
    def sum(self) -> str:
        """String: every tenant's all-time values."""
        return self.base + "sum"

    def entity_hour(self, hour: int) -> str:
        """Hash: entity -> values of UTC *hour*."""
        return f"{self.base}eh:{hour_name(hour)}"

    def tenant_hour(self, hour: int) -> str:
        """Hash: tenant -> values of UTC *hour*."""
        return f"{self.base}th:{hour_name(hour)}"

    def entity_day(self, day: int) -> str:
        """Hash: entity -> values of UTC *day*."""
        return f"{self.base}ed:{day_name(day)}"

    def tenant_day(self, day: int) -> str:
        """Hash: tenant -> values of UTC *day*."""
        return f"{self.base}td:{day_name(day)}"
