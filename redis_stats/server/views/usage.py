"""``GET /usage``: the usage ledger of a namespace (docs/usage.md, "Reading"), served only with
``--usage`` and, as business data, only with credentials (the route is private).

- ``?tenant=T`` alone: T's totals all time, this UTC day and this UTC hour (a budget check: one
  round trip to Redis);
- ``?by=tenant,adapter,model`` (any of them; default ``tenant``), ``?since=`` / ``?until=`` (a
  window of whole UTC hours: ``24h``, ``7d``, ``2026-12-07``, ``2026-12-07T13``, a unix time;
  none: all time), ``?tenant=`` / ``?adapter=`` / ``?model=`` (only those), ``?sort=<field>``
  (largest first: with ``?limit=N``, the top N), ``?offset=`` / ``?limit=`` (a page: 100 rows
  unless said, 10,000 at most), ``?format=csv`` (or ``Accept: text/csv``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from redis_stats.errors import error_kind
from redis_stats.server.http import HTTPError, Request, Response, json_response
from redis_stats.server.states.usage import UsageState
from redis_stats.usage.read import UsageQueryError, parse_time
from redis_stats.usage.render import answer_csv, answer_document, tenant_document

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer"]

PAGE, MAX_PAGE = 100, 10_000


def _whole(request: Request, name: str, default: int, top: int) -> int:
    text = request.one(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or int(text) > top:
        raise HTTPError(400, f"{name}={text[:40]!r}: give a whole number from 0 to {top}")
    return int(text)


def answer(app: App, request: Request) -> Response:
    """The ledger's answer to the request's query (module docstring)."""
    if not app.options.usage:
        raise HTTPError(404, "usage is not served by this exporter: start it with --usage")
    source = app.source(request)
    state = source.state(UsageState)
    reader = state.reader
    by, since, until = request.one("by"), request.one("since"), request.one("until")
    tenant = request.one("tenant")
    try:
        if tenant is not None and by is None and since is None and until is None:
            return json_response(200, tenant_document(reader.tenant(tenant), source.namespace))
        now = reader.now()
        offset = _whole(request, "offset", 0, 10**9)
        limit = _whole(request, "limit", PAGE, MAX_PAGE)
        result = reader.query(
            (by or "tenant").split(","),
            since=parse_time(since, now) if since is not None else None,
            until=parse_time(until, now) if until is not None else None,
            tenant=tenant,
            adapter=request.one("adapter"),
            model=request.one("model"),
            sort=request.one("sort"),
            offset=offset,
            limit=limit,
        )
    except UsageQueryError as exc:
        raise HTTPError(400, str(exc)) from None
    except RedisError as exc:
        raise HTTPError(503, f"the usage ledger cannot be read now ({error_kind(exc)}); try again") from None
    if request.one("format") == "csv" or "text/csv" in (request.header("Accept") or ""):
        return Response(200, answer_csv(result).encode(), "text/csv; charset=utf-8")
    return json_response(200, answer_document(result, source.namespace, offset, limit))
