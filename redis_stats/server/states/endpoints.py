"""What the endpoint views of a namespace share: which engines each endpoint has, and one reader.

An **endpoint** is what a router sends requests to: one API server address (``StatsConfig.endpoint``,
stored by each writer), serving one or several engines (data-parallel ranks). Its engines are those
whose writers stored that endpoint (redis_stats/_core/read/liveness.py, ``endpoint_of``).

The views (:mod:`redis_stats.server.views.endpoints` and ``/metrics?endpoint=<id>`` /
``?engine=<n>``, :mod:`redis_stats.server.views.metrics`; ``/get_load``, ``/v1/loads`` by their
endpoint) and the vLLM middleware (:mod:`redis_stats.integrations.vllm.get_load`) read:

- :class:`EndpointMap`: which engines each endpoint has, taken from a load-feed read at most
  :data:`MAP_TTL` seconds old (an endpoint's engines change when its pod restarts with another
  data-parallel size: rarely), read again at once when a view's read finds one of them served
  behind another endpoint, or an endpoint asked for is not in it; the engines' series and states
  come from the view's own read, one consistent read of those engines, which decides who is live.
  The plain ``/metrics`` scrape does none of this.
- :class:`EndpointViews` and its :class:`EndpointRenderer`: the text of ``/metrics?endpoint=<id>``,
  the Model Server Protocol families (those a role is declared for: ``redis_stats.endpoints``) as
  exactly one series each, without ``engine``, aggregated over the endpoint's live engines by the
  family's role; every other family as ``/metrics`` shows it, for the endpoint's engines only;
  ``redis_stats_endpoint_up`` 1, or 0 when no engine of it is up (then none of the protocol
  families is served: a router reading them reads "nothing known", not a zero). A protocol family
  some live engine has no number of is not served either: ``redis_stats_endpoint_withheld{family,
  engine,reason}`` says which engine and why.

Every endpoint and engine view of a namespace is read by one reader (its plans, one per
endpoint, a few dozen bytes each, at most ``redis_stats.reader.MAX_PLANS``), which reads the
endpoint's engines and the writers holding chunks in them only (``SNAPSHOT_LEAN``): never every
writer of the fleet. Its collector and renderer are made for each request and gone with it:
nothing is kept per endpoint, so a thousand distinct endpoints asked once cost a request's
memory each, one at a time.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client.utils import floatToGoString

from redis_stats._core.read.decoder import Decoded
from redis_stats._core.read.liveness import DOWN
from redis_stats.catalog import GAUGE
from redis_stats.config import is_endpoint
from redis_stats.endpoints import FamilyRole, Withheld, aggregate
from redis_stats.load import LoadView
from redis_stats.prometheus.collector import ReadErrors, RedisCollector
from redis_stats.prometheus.exposition import TextRenderer, label_pairs
from redis_stats.prometheus.filters import without_families
from redis_stats.reader import SNAPSHOT_LEAN, StatsReader
from redis_stats.server.http import HTTPError
from redis_stats.server.source import Source

__all__ = [
    "ENDPOINT_UP",
    "MAP_TTL",
    "SELF",
    "EndpointMap",
    "EndpointRenderer",
    "EndpointViews",
    "EngineMoved",
    "UnknownEndpoint",
    "endpoint_param",
    "endpoints_document",
]

ENDPOINT_UP = "redis_stats_endpoint_up"
ENDPOINT_UP_HELP = (
    "1 when at least one engine of this endpoint is up (its protocol families are served), else 0."
)
WITHHELD = "redis_stats_endpoint_withheld"
WITHHELD_HELP = (
    "Protocol families of this view not served as one series: a live engine has none of it "
    "(no_series) or no number (not_a_number), or the total is no finite number (not_finite)."
)

MAP_TTL = 10.0
"""Seconds a view keeps which engines each endpoint has before reading it again (a load-feed
read of the whole namespace: ~300 KB at 1,024 engines, so not once per scrape)."""

MISS_REREAD = 1.0
"""Seconds the map is kept at least before an endpoint or engine not in it makes a view read it
again."""

SELF = "self"
"""``?endpoint=self``: the endpoint of the process serving the view (the in-pod view's)."""


class EngineMoved(Exception):
    """An engine the map put behind this endpoint is served behind another one now: the map was
    forgotten, and the view is read again from a new one (never an engine's series behind two
    endpoints, which a sum over the endpoints' views would count twice)."""


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
        # called, then EngineMoved raised, when an engine read is served behind another endpoint
        # now (None: rendered as read, the engines of this endpoint only in its protocol families)
        self.moved = moved
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
            self.moved()  # the map is behind: this scrape reads again, from a new map
            raise EngineMoved(self.endpoint)
        live = [e for e in mine if e.up]
        parts = [text]
        if live:
            parts.append(self._protocol(snap, live))
        head = dict(self.labels)
        if self.endpoint is not None:
            head["endpoint"] = self.endpoint
        parts.append(_gauge_header(ENDPOINT_UP, ENDPOINT_UP_HELP) + ENDPOINT_UP + _braces(head))
        parts.append(" " + ("1" if live else "0") + "\n")
        return "".join(parts)

    def _protocol(self, snap: Any, live: list[Any]) -> str:
        """The protocol families over *live*, one ``# HELP``/``# TYPE`` per family, then the
        families withheld."""
        by_family: OrderedDict[str, list[str]] = OrderedDict()
        withheld: list[Withheld] = []
        for role in self.roles:
            found = aggregate(snap, role, live)
            if found is None:
                continue
            if isinstance(found, Withheld):
                withheld.append(found)
                continue
            labels, value = found
            line = role.family + _braces({**self.labels, **labels}) + " " + floatToGoString(value) + "\n"
            by_family.setdefault(role.family, []).append(line)
        out = []
        for family, lines in by_family.items():
            if any(w.family == family for w in withheld):  # one role of it withheld: none of it
                continue
            spec = snap.catalog.get(family)
            help_text = (spec.help if spec is not None else family).replace("\\", "\\\\").replace("\n", "\\n")
            out.append("# HELP " + family + " " + help_text + "\n# TYPE " + family + " gauge\n")
            out += lines
        if withheld:
            out.append(self._withheld(withheld))
        return "".join(out)

    def _withheld(self, withheld: list[Withheld]) -> str:
        """``redis_stats_endpoint_withheld``: a line per family withheld, and why."""
        out = [_gauge_header(WITHHELD, WITHHELD_HELP)]
        for w in withheld:
            engine = {} if w.engine is None else {"engine": str(w.engine)}
            labels = {**self.labels, "family": w.family, **engine, "reason": w.reason}
            out.append(WITHHELD + _braces(labels) + " 1\n")
        return "".join(out)


def _gauge_header(name: str, help_text: str) -> str:
    return "# HELP " + name + " " + help_text + "\n# TYPE " + name + " gauge\n"


def _braces(labels: dict[str, str]) -> str:
    return "{" + label_pairs(labels) + "}" if labels else ""


class EndpointMap:
    """Which engines each endpoint of one namespace has: a load-feed read of *reader* kept
    :data:`MAP_TTL` seconds (read again sooner for an endpoint or engine not in it, at most every
    :data:`MISS_REREAD` seconds). *self_endpoint* is what ``?endpoint=self`` names."""

    def __init__(self, reader: StatsReader, *, self_endpoint: str | None = None) -> None:
        self.reader = reader
        self.self_endpoint = self_endpoint
        self._map: tuple[float, LoadView] | None = None

    @classmethod
    def of(cls, source: Source) -> EndpointMap:
        """The map of *source*'s namespace (a view state): a reader of its own, whose reads of
        the whole namespace would otherwise replace the load feed's plan of its engines."""
        return cls(source.new_reader(), self_endpoint=source.options.self_endpoint)

    @property
    def namespace(self) -> str:
        """The namespace mapped."""
        return self.reader.config.namespace

    def load_view(self, max_age: float = MAP_TTL) -> LoadView:
        """The namespace's load-feed read, kept while at most *max_age* seconds old."""
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
        return endpoints_document(view, self.namespace)

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
        engines = self._engines_of(endpoint, self.load_view())
        if not engines:
            engines = self._engines_of(endpoint, self.load_view(MISS_REREAD))  # a new endpoint since?
        if not engines:
            raise UnknownEndpoint(
                f"no engine of namespace {self.namespace!r} is served behind endpoint "
                f"{endpoint!r} (GET /endpoints lists them)"
            )
        return endpoint, engines

    @staticmethod
    def _engines_of(endpoint: str, view: LoadView) -> tuple[int, ...]:
        return tuple(sorted(e for e, load in view.engines.items() if load.endpoint == endpoint))

    def check_engine(self, engine: int) -> None:
        """:class:`UnknownEndpoint` when the namespace lists no engine *engine*."""
        if engine not in self.load_view().engines and engine not in self.load_view(MISS_REREAD).engines:
            raise UnknownEndpoint(
                f"namespace {self.namespace!r} has no engine {engine} (GET /endpoints lists them)"
            )

    def close(self) -> None:
        """Nothing runs."""


class EndpointViews:
    """What every endpoint and engine view of one namespace shares (a view state): the map, one
    reader of their engines (:data:`~redis_stats.reader.SNAPSHOT_LEAN`: the engines read and the
    writers holding chunks in them, a plan per endpoint), and the count of its failed reads."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.map = source.state(EndpointMap.of)
        self.reader = source.new_reader()
        self.reader.snapshot_fetch = SNAPSHOT_LEAN
        self.errors = ReadErrors()

    def collector(self, endpoint: str | None, engine: int | None, *, strict: bool = True) -> RedisCollector:
        """A collector of ``?endpoint=`` or ``?engine=`` for one request (made for it: nothing is
        kept per endpoint); :class:`UnknownEndpoint` when the namespace has no such one. *strict*:
        its text raises :class:`EngineMoved` when an engine moved to another endpoint since the
        map was read (read it again); else it renders what it read."""
        if endpoint is not None:
            name, engines = self.map.resolve(endpoint)
        else:
            assert engine is not None
            self.map.check_engine(engine)
            name, engines = "", (engine,)
        roles, forget = self.source.options.roles, self.map.forget if strict else None
        return RedisCollector(
            self.reader,
            engines=engines,
            writers=False,
            namespace_label=bool(self.source.labels),
            renderer=lambda labels: EndpointRenderer(roles, labels, endpoint=name or None, moved=forget),
            errors=self.errors,
        )

    def close(self) -> None:
        """Nothing runs."""


def endpoint_param(value: str | None) -> str | None:
    """A ``?endpoint=`` value checked: a ``400`` naming it when it cannot be an endpoint id."""
    if value is not None and value != SELF and not is_endpoint(value):
        raise HTTPError(
            400,
            f"endpoint={value!r} is not an endpoint id (1-128 of A-Z a-z 0-9 . _ - / : [ ] @, or 'self'); "
            "GET /endpoints lists them",
        )
    return value
