"""ServeOptions: how an exporter serves, checked once when it is made (the first bad value named)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis_stats.config import is_namespace
from redis_stats.endpoints import FamilyRole
from redis_stats.reader import EngineSlice
from redis_stats.server.thresholds import Threshold, threshold_problems

__all__ = [
    "ENGINE_KINDS",
    "FLEET_KINDS",
    "HISTORY_BUDGET",
    "MAX_NAMESPACES",
    "PER_ENGINE",
    "SUMMARY_KINDS",
    "VIEW_BUDGET",
    "VIEW_IDLE",
    "WINDOW_BUDGET",
    "FleetSummary",
    "HistorySpec",
    "ServeOptions",
]

MAX_NAMESPACES = 64
"""The most namespaces one exporter serves by default (``--max-namespaces``)."""

VIEW_BUDGET = 256 * 2**20
"""Bytes the exporter may keep for requests' parameters by default (``--view-budget``): readers
and renderers of slices and endpoints, ``/load`` bodies of slices (redis_stats/server/kept.py)."""

VIEW_IDLE = 60.0
"""Seconds an entry kept for a request's parameter stays after its last use (``--view-idle``)."""

LOAD_IDLE = 60.0
"""Seconds without a request after which the ``/load`` refresher stops (the next starts it)."""


#: The default budget of the window's kept snapshots, in bytes (``--window-budget``).
WINDOW_BUDGET = 64 * 2**20

#: A named fleet figure -> (kind, metric name). Kinds: ``rate`` (a counter's per-second increase
#: over the window, summed over engines and labels), ``sum`` / ``mean`` / ``max`` (a gauge over live
#: engines, summed over labels per engine first).
FleetSummary = Mapping[str, tuple[str, str]]
SUMMARY_KINDS = ("rate", "sum", "mean", "max")

#: A figure's name -> (metric, per engine, over engines). Per engine (each up engine's series of the
#: metric): ``rate`` a counter's per-second increase over the window, summed (0 without a series);
#: ``sum`` / ``max`` a gauge's values summed / the largest; ``p99`` the largest of a histogram's
#: p99 over the window (``rate`` and ``p99``: none for an engine the window does not measure). Over
#: engines: ``sum`` (an engine without a value counts 0; none when no engine has one), ``mean``,
#: ``max``, ``median`` (the lower one) of the finite values; or ``per_engine``: kept for each up
#: engine (``/history?engine=N``, the page's charts of the engines that need attention).
HistorySpec = Mapping[str, tuple[str, str, str]]
ENGINE_KINDS = ("rate", "sum", "max", "p99")
PER_ENGINE = "per_engine"
FLEET_KINDS = ("sum", "mean", "max", "median", PER_ENGINE)

#: The default bytes (estimated) of one namespace's history (``--history-budget``): the fleet's
#: figures and each engine's, 10 minutes of them (3.7 MB at 1,024 vLLM engines); past it the oldest
#: points go. Counted with its window in the view budget (``redis_stats_exporter_kept_bytes``).
HISTORY_BUDGET = 16 * 2**20


def summary_problems(summary: FleetSummary) -> list[str]:
    """What is wrong with a summary mapping (empty when it is usable)."""
    return [
        f"fleet summary {name!r}: kind {kind!r} is not one of {', '.join(SUMMARY_KINDS)}"
        for name, (kind, _metric) in summary.items()
        if kind not in SUMMARY_KINDS
    ]


def history_problems(spec: HistorySpec) -> list[str]:
    """What is wrong with a history spec (empty when it is usable)."""
    problems = []
    for name, (metric, engine, fleet) in spec.items():
        if engine not in ENGINE_KINDS:
            problems.append(
                f"history figure {name!r} ({metric}): per engine {engine!r} is not one of "
                f"{', '.join(ENGINE_KINDS)}"
            )
        if fleet not in FLEET_KINDS:
            problems.append(
                f"history figure {name!r} ({metric}): over engines {fleet!r} is not one of "
                f"{', '.join(FLEET_KINDS)}"
            )
    return problems


def _whole(name: str, value: Any, least: int, why: str, unit: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r} must be a whole number{unit} >= {least} ({why})")


def _seconds(name: str, value: Any, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name}={value!r} must be a positive number of seconds ({why})")


@dataclass(frozen=True)
class ServeOptions:
    """Every setting of an exporter (``redis-stats exporter``'s options, docs/cli.md).

    *engines* or *slice* limit it to part of one namespace; *namespaces* or *all_namespaces*
    make it serve several (``?namespace=`` picks one). *roles* declare the endpoint views' one
    series per family; *self_endpoint* is what ``?endpoint=self`` names; *summary* names fleet
    figures of ``/snapshot``, *history* those ``/history`` keeps for the live page's charts (in
    *history_budget* bytes per namespace), *page_thresholds* the page's warning thresholds
    (:mod:`redis_stats.server.thresholds`).
    *self_metrics* adds the exporter's own process to ``/metrics``.

    Access control (off by default; :mod:`redis_stats.server.access`): *web_config_file*, the
    Prometheus exporter-toolkit's web configuration file (TLS, client certificates, headers,
    basic-auth users); *web_token_file*, bearer tokens, one a line; *web_open*, the paths served
    without credentials (``["/healthz"]`` for a kubelet's probe); *insecure_private_views*, serve
    private views (per-tenant usage) without credentials all the same.

    Usage (docs/usage.md): *usage* serves ``GET /usage`` and puts the *usage_top* tenants (and
    one ``(other)`` series) in ``/metrics``: business data, so both then need credentials.
    """

    engines: Sequence[int] | None = None
    slice: EngineSlice | None = None
    host: str = "127.0.0.1"
    port: int = 9400
    gc_interval: float = 0.0
    request_timeout: float = 10.0
    max_connections: int = 64
    max_streams: int = 256
    window: float = 30.0
    window_budget: int = WINDOW_BUDGET
    history_budget: int = HISTORY_BUDGET
    view_budget: int = VIEW_BUDGET
    view_idle: float = VIEW_IDLE
    summary: FleetSummary = field(default_factory=dict)
    history: HistorySpec = field(default_factory=dict)
    page_thresholds: Mapping[str, Threshold] = field(default_factory=dict)
    self_metrics: bool = False
    load_refresh: float = 0.25
    load_idle: float = LOAD_IDLE
    namespaces: Sequence[str] | None = None
    all_namespaces: bool = False
    max_namespaces: int = MAX_NAMESPACES
    roles: Sequence[FamilyRole] = ()
    self_endpoint: str | None = None
    web_config_file: str | None = None
    web_token_file: str | None = None
    web_open: Sequence[str] = ()
    insecure_private_views: bool = False
    bookings: bool = False
    """Serve ``POST /bookings``: routers not written in Python book their dispatches through the
    exporter (it writes Redis: a private route, never served without credentials unless
    *insecure_private_views*; docs/routers.md, "Router replicas")."""
    usage: bool = False
    usage_top: int = 10

    def __post_init__(self) -> None:
        _seconds("request_timeout", self.request_timeout, "a connection's time to send its request")
        _seconds("window", self.window, "the /snapshot rates")
        _seconds("load_refresh", self.load_refresh, "the /load refresh")
        _seconds("load_idle", self.load_idle, "the /load refresher's idle time")
        _seconds("view_idle", self.view_idle, "how long a slice's or endpoint's reader is kept unused")
        _whole("max_connections", self.max_connections, 1, "connections served at once; more get 503")
        _whole("max_streams", self.max_streams, 1, "streams and long polls open at once, apart from requests")
        _whole(
            "window_budget",
            self.window_budget,
            0,
            "the /snapshot window's; 0 keeps none: no rates",
            " of bytes",
        )
        _whole(
            "history_budget",
            self.history_budget,
            0,
            "the live page's history, fleet and engines",
            " of bytes",
        )
        _whole("view_budget", self.view_budget, 0, "kept for requests' slices and endpoints", " of bytes")
        _whole("max_namespaces", self.max_namespaces, 1, "namespaces served at most")
        _whole("usage_top", self.usage_top, 0, "tenants in /metrics with --usage; the rest is (other)")
        if self.usage_top > 1000:
            raise ValueError(f"usage_top={self.usage_top!r}: at most 1000 tenants in /metrics (bounded)")
        if not self.gc_interval >= 0:
            raise ValueError(f"gc_interval={self.gc_interval!r} must be a number of seconds >= 0 (0: no gc)")
        problems = summary_problems(self.summary) + history_problems(self.history)
        problems += threshold_problems(self.page_thresholds)
        if problems:
            raise ValueError("; ".join(problems))
        if isinstance(self.web_open, str) or any(
            not isinstance(p, str) or not p.startswith("/") for p in self.web_open
        ):
            raise ValueError(f"web_open={self.web_open!r} must be a list of paths, e.g. ['/healthz']")
        self._check_parts()

    def _check_parts(self) -> None:
        if self.slice is not None and self.engines is not None:
            raise ValueError(
                f"engines={list(self.engines)!r} and slice={self.slice} both limit the view: give one"
            )
        if self.several and (self.engines is not None or self.slice is not None):
            raise ValueError(
                "engines= and slice= serve part of one namespace: not with several (scrape "
                "?namespace=NS&slice=i/N instead)"
            )
        if self.all_namespaces and self.namespaces is not None:
            raise ValueError("give namespaces=[...] or all_namespaces=True, not both")
        self._check_namespaces(self.namespaces or ())

    def _check_namespaces(self, names: Sequence[str]) -> None:
        bad = [n for n in names if not is_namespace(n)]
        if bad:
            raise ValueError(f"namespaces {bad!r}: not namespace names (1 to 128 of A-Z a-z 0-9 . _ - / :)")
        if len(set(names)) > self.max_namespaces:
            raise ValueError(
                f"{len(set(names))} namespaces given, more than "
                f"max_namespaces={self.max_namespaces}: give fewer, or a larger --max-namespaces"
            )

    @property
    def several(self) -> bool:
        """Whether the exporter serves several namespaces (``?namespace=`` picks one)."""
        return self.all_namespaces or self.namespaces is not None

    @property
    def part(self) -> list[int] | EngineSlice | None:
        """The engines of its one namespace the exporter serves (None: all)."""
        if self.slice is not None:
            return self.slice
        return None if self.engines is None else list(self.engines)
