"""Reading the usage ledger: one tenant's totals for a budget check (:meth:`UsageReader.tenant`,
one round trip), usage grouped by tenant, adapter or model over a window of UTC hours
(:meth:`UsageReader.query`), and the top tenants with what the others add up to
(:meth:`UsageReader.top`: ``/metrics``)."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import add
from typing import Any

from redis_stats.config import StatsConfig
from redis_stats.connection import Client, make_client
from redis_stats.keys import Keys, parse_shard_counts
from redis_stats.usage.layout import (
    FIELDS,
    UsageKeys,
    day_of,
    decode_entity,
    decode_values,
    hour_of,
    tenant_shard,
)
from redis_stats.usage.record import NO_ADAPTER, clean_name

__all__ = [
    "BY",
    "DEFAULT_DAYS",
    "DEFAULT_HOURS",
    "Answer",
    "Row",
    "TenantUsage",
    "Totals",
    "UsageQueryError",
    "UsageReader",
    "parse_time",
]

BY = ("tenant", "adapter", "model")
"""What usage can be grouped by (any of them together)."""

DEFAULT_HOURS, DEFAULT_DAYS = 72, 400
"""The retention assumed of a ledger no writer has written yet."""

MAX_BUCKETS = 1_000
"""The most buckets one query reads (a window of ~2.7 years of days, or hours and days mixed)."""


class UsageQueryError(ValueError):
    """A query the ledger cannot answer as asked (the message says which value and why)."""


@dataclass(frozen=True)
class Totals:
    """The eight numbers of one tenant, entity or group (:data:`~redis_stats.usage.layout.FIELDS`)."""

    values: tuple[int, ...] = (0,) * len(FIELDS)

    def __add__(self, other: Totals) -> Totals:
        return Totals(tuple(a + b for a, b in zip(self.values, other.values)))

    def __sub__(self, other: Totals) -> Totals:
        return Totals(tuple(a - b for a, b in zip(self.values, other.values)))

    def get(self, name: str) -> int:
        """One number by its field name (``requests``, ``prompt_tokens``, ``stop``, ...)."""
        return self.values[FIELDS.index(name)]

    def as_dict(self) -> dict[str, int]:
        """Field name -> number."""
        return dict(zip(FIELDS, self.values))


@dataclass(frozen=True)
class TenantUsage:
    """One tenant's usage: all time, this UTC day and this UTC hour (as of the read)."""

    tenant: str
    total: Totals
    day: Totals
    hour: Totals


@dataclass(frozen=True)
class Row:
    """One group of a query: its names (by what it was grouped by) and its totals."""

    names: tuple[str, ...]
    totals: Totals


@dataclass
class Answer:
    """A query's answer: one page of rows, how many rows there are in all, and every row's sum."""

    by: tuple[str, ...]
    since: int | None
    until: int | None
    rows: list[Row]
    count: int
    total: Totals
    skipped: int = 0
    """Stored fields that were not readable (garbage), left out."""
    buckets: list[str] = field(default_factory=list)
    """The buckets read (``h:YYYYMMDDHH``, ``d:YYYYMMDD``, or ``all``)."""


_RELATIVE = re.compile(r"^(\d{1,6})([hd])$")


def parse_time(text: str, now: float) -> int:
    """A time as the CLI and ``GET /usage`` take it, in unix seconds: ``now``, ``24h`` / ``7d``
    (that long ago), a unix time, or UTC ``YYYY-MM-DD``, ``YYYY-MM-DDTHH`` or
    ``YYYY-MM-DDTHH:MM[:SS][Z]``. Raises :class:`UsageQueryError` for anything else."""
    text = text.strip()
    if text == "now":
        return int(now)
    m = _RELATIVE.match(text)
    if m:
        return int(now) - int(m.group(1)) * (3600 if m.group(2) == "h" else 86400)
    if text.isascii() and text.isdigit() and len(text) <= 12:
        return int(text)
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            return calendar.timegm(time.strptime(text.removesuffix("Z"), fmt))
        except ValueError:
            continue
    raise UsageQueryError(
        f"time {text[:40]!r} is not understood: give now, 24h, 7d, a unix time or a UTC date "
        "(2026-12-07, 2026-12-07T13, 2026-12-07T13:00:00Z)"
    )


def _checked(by: tuple[str, ...], sort: str | None) -> tuple[str, ...]:
    """*by* as given, once checked with *sort* (a :class:`UsageQueryError` naming a bad one)."""
    for b in by:
        if b not in BY:
            raise UsageQueryError(f"by={b[:40]!r}: group by one or more of {', '.join(BY)}")
    if not by or len(set(by)) != len(by):
        raise UsageQueryError(f"by={','.join(by)[:80]!r}: name each of {', '.join(BY)} at most once")
    if sort is not None and sort not in FIELDS:
        raise UsageQueryError(f"sort={sort[:40]!r}: sort by one of {', '.join(FIELDS)}")
    return by


def _grouped(
    hashes: list[dict[str, Any]], by: tuple[str, ...], want: tuple[str | None, ...], tenants: bool
) -> tuple[dict[tuple[str, ...], list[int]], int]:
    """The fields of *hashes* (entity or, *tenants*, tenant -> values) added up per name *by*
    groups, only those matching *want* (tenant, adapter, model; None: any); and how many fields
    were garbage (skipped)."""
    groups: dict[tuple[str, ...], list[int]] = {}
    skipped = 0
    pick = [BY.index(b) for b in by]
    for fields in hashes:
        for field_name, text in fields.items():
            values = decode_values(text)
            parts = (field_name, "", "") if tenants else decode_entity(field_name)
            if values is None or parts is None:
                skipped += 1
                continue
            if any(w is not None and w != p for w, p in zip(want, parts)):
                continue
            name = tuple(parts[i] for i in pick)
            found = groups.get(name)
            if found is None:
                groups[name] = list(values)
            else:
                found[:] = map(add, found, values)
    return groups, skipped


def _text(x: Any) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


class UsageReader:
    """Reads the usage ledger of ``config.namespace`` (every shard its writers used). *client*
    overrides the one built from ``config.url``; *clock* gives unix seconds."""

    def __init__(
        self, config: StatsConfig, *, client: Client | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.client: Any = client if client is not None else make_client(config)
        self._clock = clock
        self._keys = Keys(config.namespace)
        self._counts: set[int] = {config.shards}
        self._counts_at = -1e9

    def now(self) -> float:
        """The reader's clock (unix seconds): what relative times (``24h``) count from."""
        return self._clock()

    # -- which shards ---------------------------------------------------------------------------
    def shard_counts(self) -> set[int]:
        """Every K the namespace's writers used (shard 0's catalogue lists them), read again at
        most every 10 s."""
        now = time.monotonic()
        if now - self._counts_at > 10:
            listed = parse_shard_counts(_text(self.client.hget(self._keys.meta, "shards") or ""))
            self._counts, self._counts_at = listed | {self.config.shards}, now
        return self._counts

    def _all(self) -> list[UsageKeys]:
        return [UsageKeys(k) for k in self._keys.all_shards(self.shard_counts())]

    def _of_tenant(self, tenant: str) -> list[UsageKeys]:
        shards = {self._keys.shard(tenant_shard(tenant, k), k) for k in self.shard_counts()}
        return [UsageKeys(k) for k in sorted(shards, key=lambda k: k.root)]

    # -- the budget check -----------------------------------------------------------------------
    def tenant(self, tenant: str | None) -> TenantUsage:
        """*tenant*'s usage (the name as the client sent it; None: the requests with no tenant):
        all time, this UTC day and this UTC hour. One round trip of three ``HGET`` per shard."""
        name = clean_name(tenant)
        hour = hour_of(self._clock())
        pipe = self.client.pipeline(transaction=False)
        shards = self._of_tenant(name)
        for uk in shards:
            pipe.hget(uk.tenants, name)
            pipe.hget(uk.tenant_day(day_of(hour)), name)
            pipe.hget(uk.tenant_hour(hour), name)
        replies = pipe.execute(raise_on_error=False)
        sums = [Totals(), Totals(), Totals()]
        for i, reply in enumerate(replies):
            values = decode_values(reply) if not isinstance(reply, Exception) else None
            if values is not None:
                sums[i % 3] += Totals(values)
        return TenantUsage(name, *sums)

    # -- retention and windows ------------------------------------------------------------------
    def retention(self) -> tuple[int, int]:
        """(hours, days) the hour and day buckets are kept: the shortest any shard's writers
        last wrote with (:data:`DEFAULT_HOURS`, :data:`DEFAULT_DAYS` before any wrote)."""
        hours, days = [], []
        pipe = self.client.pipeline(transaction=False)
        for uk in self._all():
            pipe.hmget(uk.conf, ["hours", "days"])
        for h, d in pipe.execute():
            hours += [int(h)] if h is not None and _text(h).isdigit() else []
            days += [int(d)] if d is not None and _text(d).isdigit() else []
        return min(hours, default=DEFAULT_HOURS), min(days, default=DEFAULT_DAYS)

    def window(self, since: int, until: int | None) -> tuple[int, int]:
        """The window ``[since, until)`` (unix seconds; *until* None: now) as the ledger holds it:
        widened to whole UTC hours (*since* down, *until* up)."""
        if until is None:
            until = int(self._clock())
        return since - since % 3600, until + (-until) % 3600

    def buckets(self, since: int, until: int) -> tuple[list[int], list[int]]:
        """The (hours, days) whose buckets add up to the window ``[since, until)`` (unix seconds,
        whole UTC hours: :meth:`window`): whole days by their day bucket, the rest by hour.
        Raises :class:`UsageQueryError` for a window reversed, too long, or reaching a bucket
        the retention has dropped."""
        if until <= since:
            raise UsageQueryError(f"until={until} is not after since={since}")
        now_hour = hour_of(self._clock())
        until = min(until, (now_hour + 1) * 3600)
        first, last = since // 3600, until // 3600  # hours [first, last)
        keep_hours, keep_days = self.retention()
        hours: list[int] = []
        days: list[int] = []
        h = first
        while h < last:
            if h % 24 == 0 and h + 24 <= last:
                days.append(h // 24)
                h += 24
            else:
                hours.append(h)
                h += 1
            if len(hours) + len(days) > MAX_BUCKETS:
                raise UsageQueryError(f"the window is more than {MAX_BUCKETS} buckets; make it shorter")
        if hours and hours[0] < now_hour - keep_hours:
            raise UsageQueryError(
                f"since={since}: hour buckets are kept {keep_hours} h, and this window needs hour "
                f"{time.strftime('%Y-%m-%dT%H', time.gmtime(hours[0] * 3600))}; start and end it on "
                "a UTC day boundary (day buckets) or within the hours kept"
            )
        if days and days[0] < day_of(now_hour) - keep_days:
            raise UsageQueryError(f"since={since}: day buckets are kept {keep_days} days; start it later")
        return hours, days

    # -- queries --------------------------------------------------------------------------------
    def query(
        self,
        by: Iterable[str] = ("tenant",),
        *,
        since: int | None = None,
        until: int | None = None,
        tenant: str | None = None,
        adapter: str | None = None,
        model: str | None = None,
        sort: str | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> Answer:
        """Usage grouped *by* tenant, adapter and/or model, all time (no window) or over
        ``[since, until)`` (whole UTC hours; *until* None: now), only of the *tenant*, *adapter*
        or *model* named; rows by name, or by *sort* (a field, largest first: top N is
        ``limit=N``); the page ``[offset, offset + limit)``."""
        by = _checked(tuple(by), sort)
        want = (
            clean_name(tenant) if tenant is not None else None,
            clean_name(adapter, NO_ADAPTER) if adapter is not None else None,
            clean_name(model, "(unknown)") if model is not None else None,
        )
        if since is not None:
            since, until = self.window(since, until)
        by_tenant_only = by == ("tenant",) and want[1] is None and want[2] is None
        keys, names = self._keys_of(since, until, by_tenant_only)
        groups, skipped = _grouped(self._read(keys), by, want, by_tenant_only)
        rows = [Row(n, Totals(tuple(v))) for n, v in groups.items()]
        rows.sort(key=lambda r: r.names)
        if sort is not None:
            rows.sort(key=lambda r: -r.totals.get(sort))
        total = sum((r.totals for r in rows), Totals())
        page = rows[offset : None if limit is None else offset + limit]
        return Answer(by, since, until, page, len(rows), total, skipped, names)

    def _keys_of(self, since: int | None, until: int | None, tenants: bool) -> tuple[list[str], list[str]]:
        shards = self._all()
        if since is None and until is None:
            return [uk.tenants if tenants else uk.totals for uk in shards], ["all"]
        if since is None:
            raise UsageQueryError("until= needs since= (a window has a start)")
        hours, days = self.buckets(*self.window(since, until))
        keys = []
        for uk in shards:
            keys += [uk.tenant_hour(h) if tenants else uk.entity_hour(h) for h in hours]
            keys += [uk.tenant_day(d) if tenants else uk.entity_day(d) for d in days]
        names = [f"h:{time.strftime('%Y%m%d%H', time.gmtime(h * 3600))}" for h in hours]
        names += [f"d:{time.strftime('%Y%m%d', time.gmtime(d * 86400))}" for d in days]
        return keys, names

    def _read(self, keys: list[str]) -> list[dict[Any, Any]]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        out = []
        for reply in pipe.execute(raise_on_error=False):
            # A key of another type (garbage) reads as nothing, never as a failed query.
            out.append({_text(k): v for k, v in reply.items()} if isinstance(reply, dict) else {})
        return out

    def tenant_count(self) -> int:
        """How many tenants the ledger holds (every shard's, added: a tenant is in one shard
        unless the namespace's K changed)."""
        pipe = self.client.pipeline(transaction=False)
        for uk in self._all():
            pipe.hlen(uk.tenants)
        return sum(n for n in pipe.execute(raise_on_error=False) if isinstance(n, int))

    # -- the top tenants ------------------------------------------------------------------------
    def top(self, n: int) -> tuple[list[tuple[str, Totals]], Totals]:
        """The *n* tenants with the most prompt + generation tokens of all time, with their
        totals, and what every other tenant adds up to (so that the whole stays exact)."""
        shards = self._all()
        pipe = self.client.pipeline(transaction=False)
        for uk in shards:
            pipe.zrevrange(uk.rank, 0, max(0, n - 1), withscores=True)
            pipe.get(uk.sum)
        replies = pipe.execute(raise_on_error=False)
        best: dict[str, float] = {}
        total = Totals()
        for ranked, whole in zip(replies[0::2], replies[1::2]):
            if isinstance(ranked, list):
                for member, score in ranked:
                    best[_text(member)] = best.get(_text(member), 0) + float(score)
            values = decode_values(whole) if not isinstance(whole, Exception) else None
            total += Totals(values) if values is not None else Totals()
        names = sorted(best, key=lambda t: (-best[t], t))[:n] if n > 0 else []
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            for uk in self._of_tenant(name):
                pipe.hget(uk.tenants, name)
        replies = pipe.execute(raise_on_error=False) if names else []
        tops: dict[str, Totals] = {name: Totals() for name in names}
        it = iter(replies)
        for name in names:
            for _ in self._of_tenant(name):
                reply = next(it)
                values = decode_values(reply) if not isinstance(reply, Exception) else None
                tops[name] += Totals(values) if values is not None else Totals()
        rest = total
        for t in tops.values():
            rest -= t
        return list(tops.items()), rest
