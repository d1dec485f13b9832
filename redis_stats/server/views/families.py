"""``GET /families``: every family a namespace's catalogue holds, with its current total per engine.

The live page's cards and charts are vLLM's figures; a namespace written by the library holds its
own families (``requests``, ``queue_depth``, ...), which the page showed nothing of. This view is
the generic one: for each family of the catalogue some engine holds series of (name, kind, help,
label names; not the families a reader was merely given, vLLM's for the exporter) and each engine,
one number — a counter's total (its series added up), a gauge's current sum (live engines only:
a down engine's gauges are not current), a histogram's count of observations (and their sum) —
and over the namespace's window the per-second rate of counters and histogram counts. Columnar:
``engines`` lists the engines once, each family's ``values`` (``rates``, ``sums``) follow it.

One read of the namespace, through its ``/snapshot`` window (the read is kept there too, so it
feeds the window and the history like a ``/snapshot`` request), one body built at a time.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from redis_stats.catalog import COUNTER, GAUGE, HISTOGRAM
from redis_stats.config import redact
from redis_stats.errors import error_kind
from redis_stats.server.http import Request, Response, encode_body, json_response
from redis_stats.server.states.sampler import redis_address, window_of
from redis_stats.server.states.window import increase
from redis_stats.snapshot import Snapshot, json_number

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer", "families_document"]


def _per_engine(snap: Snapshot) -> dict[str, list[dict[int, float]]]:
    """family -> [value by engine, sum by engine (histograms)], each engine's series added up."""
    out: dict[str, list[dict[int, float]]] = {}
    for e in snap.engines.values():
        for kind_series in (e.counters, e.gauges):
            for (name, _labels), v in kind_series.items():
                found = out.setdefault(name, [{}, {}])[0]
                found[e.engine] = found.get(e.engine, 0.0) + v
        for (name, _labels), h in e.histograms.items():
            count, total = out.setdefault(name, [{}, {}])
            count[e.engine] = count.get(e.engine, 0.0) + h.count
            total[e.engine] = total.get(e.engine, 0.0) + h.sum
    return out


def families_document(now: Snapshot, earlier: Snapshot | None) -> dict[str, Any]:
    """The ``/families`` document of *now*, rates over the window from *earlier* (None: none)."""
    engines = sorted(now.engines)
    seconds = now.time - earlier.time if earlier is not None else None
    values, before = _per_engine(now), _per_engine(earlier) if earlier is not None else {}
    families = []
    for spec in sorted(now.catalog, key=lambda s: s.name):
        found = values.get(spec.name)
        if found is None:  # a family no engine holds a series of (a reader's own catalogue's)
            continue
        value_of = found[0]
        row: dict[str, Any] = {
            "name": spec.name,
            "kind": spec.kind,
            "help": spec.help,
            "labels": list(spec.labels),
            "values": [json_number(value_of[e], nan=None) if e in value_of else None for e in engines],
            "total": json_number(sum(value_of.values()), nan=None) if value_of else None,
        }
        if spec.kind == HISTOGRAM:
            row["sums"] = [json_number(found[1][e], nan=None) if e in found[1] else None for e in engines]
        if spec.kind in (COUNTER, HISTOGRAM):
            row["rates"] = _rates(engines, value_of, before.get(spec.name, [{}])[0], earlier, seconds)
        families.append(row)
    return {
        "time": json_number(now.time),
        "window_seconds": seconds,
        "engines": engines,
        "up": [now.engines[e].up for e in engines],
        "kinds": [COUNTER, GAUGE, HISTOGRAM],
        "families": families,
    }


def _rates(
    engines: list[int],
    now: dict[int, float],
    before: dict[int, float],
    earlier: Snapshot | None,
    seconds: float | None,
) -> list[float | str | None]:
    """Per engine, the increase of *now* over *before* per second; None without a window or for
    an engine the window's first read lacks (new, or back after Redis lost its keys)."""
    if not seconds or earlier is None:
        return [None] * len(engines)
    return [
        json_number(increase(now[e], before.get(e, 0.0)) / seconds, nan=None)
        if e in now and e in earlier.engines
        else None
        for e in engines
    ]


def answer(app: App, request: Request) -> Response:
    """``/families`` of the request's namespace (a ``503`` with the reason when Redis cannot be read)."""
    source = app.source(request)
    window = window_of(source)
    window.asked()
    reader = source.reader
    with source.building:
        try:
            snap = reader.snapshot(source.part)
        except Exception as exc:
            return json_response(
                503, {"error": error_kind(exc), "detail": redact(str(exc), reader.config.url)}
            )
        earlier = window.keep(snap)
        doc = families_document(snap, earlier)
        doc["source"] = {"namespace": source.namespace, "redis": redis_address(reader.config.url)}
        body, _size = encode_body(json.dumps(doc, allow_nan=False), request.gzip_ok)
    return Response(200, body, gzipped=request.gzip_ok)
