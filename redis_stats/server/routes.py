"""The route table: which view answers which path.

A view is a module of :mod:`redis_stats.server.views` with one function ``answer(app, request)``
(:class:`~redis_stats.server.app.App` and :class:`~redis_stats.server.http.Request` in,
:class:`~redis_stats.server.http.Response` out, or an :class:`~redis_stats.server.http.HTTPError`).
Adding a view is adding a module and a line to :data:`ROUTES`; the exporter gives the table to
its :class:`~redis_stats.server.app.App`.

A line is a view, or a :class:`~redis_stats.server.app.Route` that says more of it: ``private``
for business data (per-tenant usage), which the exporter never serves without credentials unless
its operator says ``--insecure-private-views`` (an exporter asked to serve one without either
refuses to start). Who may read what is this data, never a check in a view
(:mod:`redis_stats.server.access`).
"""

from __future__ import annotations

from redis_stats.server.app import Route, View
from redis_stats.server.views import (
    bookings,
    endpoints,
    families,
    get_load,
    health,
    history,
    load,
    loads,
    metrics,
    namespaces,
    page,
    pool,
    snapshot,
    usage,
    watch,
)

__all__ = ["ROUTES"]

ROUTES: dict[str, View | Route] = {
    "/": page.answer,
    "/metrics": Route(metrics.answer, private=lambda o: o.usage and o.usage_top > 0),
    "/snapshot": snapshot.answer,
    "/history": history.answer,
    "/families": families.answer,
    "/load": load.answer,
    "/endpoints": endpoints.answer,
    "/get_load": get_load.answer,
    "/v1/loads": loads.answer,
    "/loads": loads.fleet_answer,
    "/pool": pool.answer,
    "/watch": watch.answer,
    "/healthz": health.answer,
    "/namespaces": namespaces.answer,
    # POST only, and only with --bookings: it writes the store (routers' bookings)
    "/bookings": Route(bookings.answer, private=lambda options: options.bookings, writes=True),
    # Business data (per-tenant usage): private with --usage (the view answers 404 without it).
    "/usage": Route(usage.answer, private=lambda o: o.usage),
}
"""Path -> the view answering it (``GET`` and ``HEAD``; a route that writes: ``POST``)."""
