"""``GET /endpoints`` and ``/metrics?endpoint=<id>`` / ``?engine=<n>``: the endpoint views.

An **endpoint** is what a router sends requests to: one API server address (``StatsConfig.endpoint``,
stored by each writer), serving one or several engines (data-parallel ranks). Its engines are those
whose writers stored that endpoint (redis_stats/_core/liveness.py, ``endpoint_of``).

- ``/endpoints``: every endpoint, its engines, each engine's ``state`` (``up``, ``stale``,
  ``down``: the one rule of every view), ``age_seconds`` and ``seq``, and whether the endpoint is
  up (one engine up is enough). From a read of the load feed (no series).
- ``/metrics?endpoint=<id>``: the Model Server Protocol families (those a role is declared for:
  ``redis_stats.endpoints``) as exactly one series each, without ``engine``, aggregated over the
  endpoint's live engines by the family's role; every other family as ``/metrics`` shows it (with
  ``engine``), for the endpoint's engines only; ``redis_stats_endpoint_up`` 1, or 0 when no
  engine of it is up (then none of the protocol families is served: a router reading them reads
  "nothing known", not a zero). ``?endpoint=self`` on the view inside a vLLM pod: its own.
- ``/metrics?engine=<n>``: one engine's view, every family without the ``engine`` label (for a
  router that addresses each data-parallel rank as an endpoint of its own).

Which engines an endpoint has is taken from a load-feed read at most :data:`MAP_TTL` seconds old
(an endpoint's engines change when its pod restarts with another data-parallel size: rarely),
read again at once when a view's read finds one of them served behind another endpoint, or an
endpoint asked for is not in it; the engines' series and states come from the view's own read,
one consistent read of those engines, which decides who is live. The plain ``/metrics`` scrape
does none of this.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.utils import floatToGoString

from redis_stats._core.decoder import Decoded
from redis_stats._core.liveness import DOWN
from redis_stats.catalog import GAUGE
from redis_stats.endpoints import FamilyRole, aggregate
from redis_stats.load import LoadView
from redis_stats.prometheus.exposition import TextRenderer, label_pairs
from redis_stats.prometheus.slices import family_of
from redis_stats.reader import SNAPSHOT_LEAN, StatsReader

if TYPE_CHECKING:
    from redis_stats.prometheus.collector import RedisCollector
    from redis_stats.prometheus.slices import ScrapeQuery

__all__ = [
    "ENDPOINT_UP",
    "MAP_TTL",
    "EndpointRenderer",
    "EndpointViews",
    "UnknownEndpoint",
    "endpoints_document",
]

ENDPOINT_UP = "redis_stats_endpoint_up"
ENDPOINT_UP_HELP = (
    "1 when at least one engine of this endpoint is up (its protocol families are served), else 0."
)

MAP_TTL = 10.0
"""Seconds a view keeps which engines each endpoint has before reading it again (a load-feed
read of the whole namespace: ~300 KB at 1,024 engines, so not once per scrape)."""

MISS_REREAD = 1.0
"""Seconds the map is kept at least before an endpoint or engine not in it makes a view read it
again."""

SELF = "self"
"""``?endpoint=self``: the endpoint of the process serving the view (the in-pod view's)."""


class UnknownEndpoint(LookupError):
    """An endpoint or engine the namespace does not hold (``404``): the message says which."""


def endpoints_document(view: LoadView, namespace: str | None = None) -> dict[str, Any]:
    """The ``/endpoints`` document of one load-feed read: ``endpoints`` (id -> ``up`` and its
    ``engines``, each with ``state``, ``age_seconds``, ``seq``), the engines with no endpoint
    stored (``unassigned``), and the read's ``time``."""
    doc: dict[str, Any] = {"time": round(view.time, 3)}
    if namespace is not None:
        doc["namespace"] = namespace
    endpoints: dict[str, dict[str, Any]] = {}
    unassigned = []
    for e in sorted(view.engines):
        load = view.engines[e]
        state = load.state or ("up" if load.up else DOWN)
        entry = {"state": state, "age_seconds": round(load.age_seconds, 3), "seq": load.seq}
        if load.endpoint is None:
            unassigned.append(e)
            continue
        found = endpoints.setdefault(load.endpoint, {"up": False, "engines": {}})
        found["engines"][str(e)] = entry
        found["up"] = found["up"] or state != DOWN
    doc["endpoints"] = dict(sorted(endpoints.items()))
    doc["unassigned"] = unassigned
    return doc


def without_families(text: str, names: frozenset[str]) -> str:
    """*text* without the lines of the families *names* (gauges: their samples carry their name)."""
    if not names:
        return text
    return "".join(line for line in text.splitlines(keepends=True) if family_of(line) not in names)


def without_engine_label(text: str, engine: int) -> str:
    """*text* with ``engine="<engine>"`` taken out of every label set (a value holding that text
    is escaped, ``\\"``: never matched)."""
    label = f'engine="{engine}"'
    return text.replace("{" + label + "}", "").replace("{" + label + ",", "{").replace("," + label, "")


class EndpointRenderer:
    """A :class:`~redis_stats.prometheus.exposition.TextRenderer` for one endpoint (or one engine):
    the families of *roles* as one series each over the read's live engines, the others as the
    inner renderer writes them, then ``redis_stats_endpoint_up``. Given to the
    :class:`~redis_stats.prometheus.collector.RedisCollector` of those engines as its renderer:
    one read serves both."""

    def __init__(
        self,
        roles: Sequence[FamilyRole],
        labels: dict[str, str],
        *,
        endpoint: str | None = None,
        moved: Callable[[], None] | None = None,
    ) -> None:
        self.inner = TextRenderer(labels)
        self.roles = tuple(roles)
        self.labels = dict(labels)
        self.endpoint = endpoint
        self.moved = moved  # called when an engine read is served behind another endpoint now
        self.names = frozenset(r.family for r in self.roles)

    def render(self, decoded: Decoded) -> str:
        """The view's text of *decoded* (a read of the endpoint's engines)."""
        snap = decoded.snapshot()
        catalog = snap.catalog
        # only gauge families are replaced by their one series (endpoints.FamilyRole)
        gauges = frozenset(
            n for n in self.names if (spec := catalog.get(n)) is not None and spec.kind == GAUGE
        )
        text = without_families(self.inner.render(decoded), gauges)
        mine = [e for e in snap.engines.values() if self.endpoint is None or e.endpoint == self.endpoint]
        if len(mine) < len(snap.engines) and self.moved is not None:
            self.moved()  # the map is behind: read it again for the next scrape
        live = [e for e in mine if e.up]
        parts = [text]
        if live:
            parts.append(self._protocol(snap, live))
        head = dict(self.labels)
        if self.endpoint is not None:
            head["endpoint"] = self.endpoint
        parts.append(
            "# HELP "
            + ENDPOINT_UP
            + " "
            + ENDPOINT_UP_HELP
            + "\n# TYPE "
            + ENDPOINT_UP
            + " gauge\n"
            + ENDPOINT_UP
            + _braces(head)
            + " "
            + ("1" if live else "0")
            + "\n"
        )
        return "".join(parts)

    def _protocol(self, snap: Any, live: list[Any]) -> str:
        """The protocol families over *live*, one ``# HELP``/``# TYPE`` per family."""
        by_family: OrderedDict[str, list[str]] = OrderedDict()
        for role in self.roles:
            found = aggregate(snap, role, live)
            if found is None:
                continue
            labels, value = found
            line = role.family + _braces({**self.labels, **labels}) + " " + floatToGoString(value) + "\n"
            by_family.setdefault(role.family, []).append(line)
        out = []
        for family, lines in by_family.items():
            spec = snap.catalog.get(family)
            help_text = (spec.help if spec is not None else family).replace("\\", "\\\\").replace("\n", "\\n")
            out.append("# HELP " + family + " " + help_text + "\n# TYPE " + family + " gauge\n")
            out += lines
        return "".join(out)


def _braces(labels: dict[str, str]) -> str:
    return "{" + label_pairs(labels) + "}" if labels else ""


class EndpointViews:
    """The endpoint views of one namespace's exporter: which engines each endpoint has (a
    load-feed read kept :data:`MAP_TTL` seconds), and a collector per endpoint or engine asked
    for (at most :attr:`MAX_VIEWS`: its own reader, so its plan and caches are its own)."""

    MAX_VIEWS = 1024

    def __init__(
        self,
        reader: StatsReader,
        roles: Sequence[FamilyRole],
        *,
        labels: dict[str, str] | None = None,
        self_endpoint: str | None = None,
        namespace_label: bool = False,
    ) -> None:
        self.reader = reader
        self.roles = tuple(roles)
        self.labels = dict(labels or {})
        self.self_endpoint = self_endpoint
        self.namespace_label = namespace_label
        self._lock = threading.Lock()
        self._map: tuple[float, LoadView] | None = None
        self._views: OrderedDict[tuple[str, str], RedisCollector] = OrderedDict()

    def load_view(self, max_age: float = MAP_TTL) -> LoadView:
        """The namespace's load-feed read, kept while at most *max_age* seconds old: the map
        (:data:`MAP_TTL`), or, for an endpoint or engine not in it (a new one since?),
        :data:`MISS_REREAD`, so a client asking again and again for one that does not exist
        does not make every request a read of the whole namespace."""
        kept = self._map
        now = time.monotonic()
        if kept is not None and now - kept[0] < max_age:
            return kept[1]
        view = self.reader.load()
        self._map = (now, view)
        return view

    def forget(self) -> None:
        """Drop the kept map: the next endpoint view reads it again."""
        self._map = None

    def document(self) -> dict[str, Any]:
        """``/endpoints``: from a fresh load-feed read (it also refreshes the map)."""
        view = self.reader.load()
        self._map = (time.monotonic(), view)
        return endpoints_document(view, self.reader.config.namespace)

    def answer(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) of ``/endpoints``: :meth:`document`, or ``503`` with the
        reason when Redis cannot be read."""
        from redis_stats.config import redact
        from redis_stats.errors import error_kind

        try:
            return 200, self.document()
        except Exception as exc:
            return 503, {"error": error_kind(exc), "detail": redact(str(exc), self.reader.config.url)}

    def collector_of(self, query: ScrapeQuery, *, several: bool = False) -> RedisCollector:
        """The collector of a ``/metrics`` query's ``endpoint`` or ``engine`` (*several*: the
        exporter serves several namespaces, and this is not one namespace's view: ValueError)."""
        if several:
            raise ValueError(
                "an endpoint view is one namespace's: this exporter serves several, give "
                "?namespace=NS (GET /namespaces lists them)"
            )
        return self.collector(endpoint=query.endpoint, engine=query.engine)

    def resolve(self, endpoint: str) -> tuple[str, tuple[int, ...]]:
        """The endpoint *endpoint* names (``self``: this process's) and its engines;
        :class:`UnknownEndpoint` when the namespace holds none of it."""
        if endpoint == SELF:
            if self.self_endpoint is None:
                raise UnknownEndpoint(
                    "?endpoint=self names the endpoint of the process serving this view, and it has "
                    "none (set REDIS_STATS_ENDPOINT, or run the view inside vLLM); GET /endpoints lists them"
                )
            endpoint = self.self_endpoint
        view = self.load_view()
        engines = tuple(sorted(e for e, load in view.engines.items() if load.endpoint == endpoint))
        if not engines:
            view = self.load_view(MISS_REREAD)  # a new endpoint since the kept read?
            engines = tuple(sorted(e for e, load in view.engines.items() if load.endpoint == endpoint))
        if not engines:
            raise UnknownEndpoint(
                f"no engine of namespace {self.reader.config.namespace!r} is served behind endpoint "
                f"{endpoint!r} (GET /endpoints lists them)"
            )
        return endpoint, engines

    def check_engine(self, engine: int) -> None:
        """:class:`UnknownEndpoint` when the namespace lists no engine *engine*."""
        if engine not in self.load_view().engines and engine not in self.load_view(MISS_REREAD).engines:
            raise UnknownEndpoint(
                f"namespace {self.reader.config.namespace!r} has no engine {engine} "
                "(GET /endpoints lists them)"
            )

    def collector(self, *, endpoint: str | None = None, engine: int | None = None) -> RedisCollector:
        """The collector of ``?endpoint=`` or ``?engine=`` (made on first use, kept)."""
        from redis_stats.prometheus.collector import RedisCollector

        if endpoint is not None:
            name, engines = self.resolve(endpoint)
            key = ("endpoint", name)
        else:
            assert engine is not None
            self.check_engine(engine)
            name, engines, key = "", (engine,), ("engine", str(engine))
        with self._lock:
            found = self._views.get(key)
            if found is not None and found.engines == engines:
                self._views.move_to_end(key)
                return found
            reader = StatsReader(self.reader.config, self.reader.catalog, client=self.reader.client)
            reader.snapshot_fetch = SNAPSHOT_LEAN  # no writer self-metrics shown: read none
            made = RedisCollector(
                reader,
                engines=engines,
                writers=False,
                namespace_label=self.namespace_label,
                renderer=lambda labels: EndpointRenderer(
                    self.roles, labels, endpoint=name or None, moved=self.forget
                ),
            )
            self._views[key] = made
            while len(self._views) > self.MAX_VIEWS:
                self._views.popitem(last=False)
            return made


def endpoint_param(value: str) -> str:
    """A ``?endpoint=`` value checked (ValueError naming it when it cannot be an endpoint id)."""
    from redis_stats.config import is_endpoint

    if value != SELF and not is_endpoint(value):
        raise ValueError(
            f"endpoint={value!r} is not an endpoint id (1-128 of A-Z a-z 0-9 . _ - / : [ ] @, or 'self'); "
            "GET /endpoints lists them"
        )
    return value
