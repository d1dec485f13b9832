"""``POST /bookings``: a router not written in Python books its dispatches through the exporter.

The HTTP form of :class:`redis_stats.bookings.Bookings` (docs/routers.md, "Router replicas"), served
only by an exporter started with ``--bookings`` (``ServeOptions.bookings``): it writes Redis, so
it is a private route (credentials, or ``--insecure-private-views``). Every parameter is in the
query string; the request has no body::

    POST /bookings?op=book&router=r1&engine=3&request_id=abc    book (and extend r1's lease)
    POST /bookings?op=end&router=r1&engine=3&request_id=abc     the request ended at the router
    POST /bookings?op=renew&router=r1                           extend the lease (every lease / 3)
    POST /bookings?op=release&router=r1                         end the lease and its bookings

``lease`` and ``bound`` (seconds, 0.1-3600 and 0.01-3600; default 2 and 2) as the Python client's.
The answer is ``{"router", "op", "lease_lost"}`` (``end``: ``"ended"``, whether it was still
stored): ``lease_lost`` true says the store had lost the router's lease (Redis restarted empty),
and the router books its open bookings again. A bad parameter is a ``400`` naming it; a store that
refuses the write (a read-only user) a ``503`` saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis_stats.bookings import BOUND, LEASE, BookingStore, check_engine, check_request_id, check_router
from redis_stats.config import redact
from redis_stats.errors import error_kind
from redis_stats.server.http import HTTPError, Request, Response, json_response

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer"]

OPS = ("book", "end", "renew", "release")


def _seconds(request: Request, name: str, default: float, low: float) -> float:
    text = request.one(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= 3600.0:
        raise HTTPError(400, f"{name}={text!r}: give {low} to 3600 seconds")
    return value


def _engine(request: Request) -> int:
    text = request.one("engine") or ""
    if not (text.isascii() and text.isdigit()):
        raise HTTPError(400, f"engine={text!r}: give the engine's index as /load shows it (an int from 0)")
    try:
        return check_engine(int(text))
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None


def _checked(check: Any, value: Any) -> Any:
    try:
        return check(value)
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None


def answer(app: App, request: Request) -> Response:
    """``POST /bookings`` (module docstring)."""
    if not app.options.bookings:
        raise HTTPError(
            404, "this exporter does not take bookings: start it with --bookings (docs/routers.md)"
        )
    op = request.one("op")
    if op not in OPS:
        raise HTTPError(400, f"op={op!r}: give one of {', '.join(OPS)}")
    router = _checked(check_router, request.one("router"))
    lease = _seconds(request, "lease", LEASE, 0.1)
    source = app.source(request)
    store = BookingStore(source.reader.config, source.reader.client)
    doc: dict[str, Any] = {"router": router, "op": op}
    try:
        if op in ("book", "end"):
            engine = _engine(request)
            request_id = _checked(check_request_id, request.one("request_id"))
            if op == "book":
                bound = _seconds(request, "bound", BOUND, 0.01)
                doc["lease_lost"] = store.book(router, lease, bound, request_id, engine)
            else:
                doc["ended"] = store.end(engine, request_id)
        else:
            doc["lease_lost"] = store.lease(router, lease, op)
    except HTTPError:
        raise
    except Exception as exc:  # the store refused or could not be reached: nothing was booked
        config = source.reader.config
        detail = redact(str(exc), config.url)
        return json_response(
            503, {"error": error_kind(exc), "detail": f"the store did not take it: {detail}"}
        )
    return json_response(200, doc, (("Cache-Control", "no-store"),))
