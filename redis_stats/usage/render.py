"""The usage ledger's answers in every format it is served in: a JSON document (``GET /usage``,
``redis-stats usage --format json``), CSV, and Prometheus families of the top tenants with an
``(other)`` series (``/metrics``). Every name in them came from a client: JSON escapes it
(``json.dumps``, ASCII only), CSV quotes it and defuses a leading formula character, and
prometheus_client escapes label values."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.exceptions import RedisError

from redis_stats.usage.layout import FIELDS
from redis_stats.usage.read import Answer, TenantUsage, UsageReader
from redis_stats.usage.record import OTHER

__all__ = ["UsageCollector", "answer_csv", "answer_document", "iso", "tenant_document"]

_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def iso(t: int | None) -> str | None:
    """Unix seconds as UTC ISO 8601 (``2026-12-07T13:00:00Z``), None as None."""
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def answer_document(answer: Answer, namespace: str, offset: int, limit: int | None) -> dict[str, Any]:
    """A query's answer as the JSON document of ``GET /usage`` (docs/usage.md, "Reading")."""
    return {
        "namespace": namespace,
        "by": list(answer.by),
        "since": iso(answer.since),
        "until": iso(answer.until),
        "buckets": answer.buckets,
        "count": answer.count,
        "offset": offset,
        "limit": limit,
        "rows": [dict(zip(answer.by, r.names)) | r.totals.as_dict() for r in answer.rows],
        "total": answer.total.as_dict(),
        "skipped": answer.skipped,
    }


def tenant_document(usage: TenantUsage, namespace: str) -> dict[str, Any]:
    """One tenant's totals (all time, this UTC day, this UTC hour) as JSON: a budget check."""
    return {
        "namespace": namespace,
        "tenant": usage.tenant,
        "total": usage.total.as_dict(),
        "day": usage.day.as_dict(),
        "hour": usage.hour.as_dict(),
    }


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA):
        return "'" + value  # a spreadsheet would run it as a formula (CSV injection)
    return value


def answer_csv(answer: Answer) -> str:
    """A query's page of rows as CSV with a header line (names quoted as needed)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*answer.by, *FIELDS])
    for row in answer.rows:
        writer.writerow([_cell(n) for n in row.names] + list(row.totals.values))
    return out.getvalue()


_FAMILIES = (
    ("requests", "Requests finished"),
    ("prompt_tokens", "Prompt tokens"),
    ("cached_prompt_tokens", "Prompt tokens served from a cache"),
    ("generation_tokens", "Generated tokens"),
)


class UsageCollector:
    """The top *top* tenants (most prompt + generation tokens, all time) as Prometheus counters
    labelled ``tenant``, and one ``tenant="(other)"`` series holding every other tenant, so that
    the families add up to the ledger's exact total in a bounded scrape; plus the number of
    tenants. One read of the ledger per scrape (two round trips)."""

    def __init__(self, reader: UsageReader, top: int, labels: dict[str, str] | None = None) -> None:
        self.reader = reader
        self.top = top
        self.labels = dict(labels or {})

    def collect(self) -> Iterator[Metric]:
        """The usage families (prometheus_client's collector protocol); none while the ledger
        cannot be read (the scrape still answers: ``redis_stats_up`` says why)."""
        try:
            tops, other = self.reader.top(self.top)
            tenants_held = self.reader.tenant_count()
        except RedisError:
            return
        names = [*self.labels, "tenant"]
        rows = [(name, totals) for name, totals in tops] + [(OTHER, other)]
        for field, help_text in _FAMILIES:
            family = CounterMetricFamily(
                f"redis_stats_usage_{field}",
                f"{help_text}, by tenant: the top tenants by tokens and {OTHER} for the rest "
                "(redis_stats usage ledger, exact across every writer)",
                labels=names,
            )
            for name, totals in rows:
                family.add_metric([*self.labels.values(), name], totals.get(field))
            yield family
        tenants = GaugeMetricFamily(
            "redis_stats_usage_tenants", "Tenants the usage ledger holds", labels=list(self.labels)
        )
        tenants.add_metric(list(self.labels.values()), tenants_held)
        yield tenants
