"""``GET /snapshot``: one namespace as JSON, with rates and quantiles over its recent window.

Every engine's up, age, counters, gauges and histograms (p50/p90/p99 since start), then over the
last *window* seconds the rates and quantiles, and fleet totals (``docs/snapshot.md``; JSON
Schema ``redis_stats/schemas/snapshot.schema.json``). ``?name[]=`` keeps only those metrics,
``?buckets=0`` leaves out the since-start histograms' buckets.


The window is the namespace's :class:`~redis_stats.server.states.sampler.Window`: the snapshots
its requests and its sampler took (docs/snapshot.md, "The window").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from redis_stats.server.http import Request, Response, encode_body
from redis_stats.server.states.sampler import window_of

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer"]


def answer(app: App, request: Request) -> Response:
    """``/snapshot`` of the request's namespace (one body built at a time in the process)."""
    source = app.source(request)
    window = window_of(source)
    window.asked()
    names = request.params.get("name[]")
    buckets = request.params.get("buckets", ["1"])[-1] != "0"
    with source.building:
        status, doc = window.document(names, buckets)
        text = json.dumps(doc, allow_nan=False)  # strict JSON: Snapshot.to_dict is
        del doc
        body, _size = encode_body(text, request.gzip_ok)
    return Response(status, body, gzipped=request.gzip_ok)
