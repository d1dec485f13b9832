"""The checker over a nemesis run's history (:mod:`tests.nemesis.history`).

What the store promises, checked against every read recorded:

- **counters** (``vllm:prompt_tokens``) and histogram counts never above what the writers had
  recorded by the time of the read (their ``rec`` lines, written before the records); at the end,
  once the faults stopped and the writers closed, equal to what was acknowledged: a writer that
  closed (``closed ok``) exactly, a killed one between its last acknowledged flush and what it
  had recorded (what it had not flushed is the only loss). Only two faults take acknowledged
  data away by design, and the checker follows them: Redis sent back to an older RDB (what the
  writers had acknowledged by then; a live writer stores its state again) and keys evicted
  under ``maxmemory-policy allkeys-lru`` (a dead writer's may be gone).
- **histograms** never torn: the count equals the ``+Inf`` bucket, the buckets never decrease,
  the sum is the count times the one value observed.
- **gauges** (``vllm:num_requests_running``, on ``/metrics`` and ``/load``) only ever a value a
  writer of that series set.
- **``/load``** and **``/watch``** answer no engine ``up`` while the store cannot be read (Redis
  down or frozen, the exporters cut off: past a grace of :data:`GRACE` s); ``/watch`` sequence
  numbers increase within an epoch; every state is one of the documented ones; an engine never
  goes from ``down`` to ``stale`` between two reads a second apart (a heartbeat comes back as
  ``up``).
- **log-line printers**: never two at once (a print with an older fencing token after one with
  a newer token: a holder that went on printing after another took over).
- **outages reported as one**: in each process's log, an outage's start and its end alternate.

Each anomaly is printed with the seed, the faults around it and the reads that show it.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.nemesis.history import load

__all__ = ["Report", "check", "check_events", "snapshot_series"]

GRACE = 3.0
"""Seconds an exporter may go on answering from its last read once the store cannot be read
(``/load`` says 503 within 1.2 s, docs/load.md; the rest is the loaded machine's)."""

STATES = {"up", "stale", "down", "gone", "unknown"}

KILL_SLACK = 1.5
"""Seconds of records a writer killed while Redis answered may lose: docs/operations.md says less
than a flush interval (0.25 s here); the rest is the loaded machine's (a flush's round trip, a
flusher thread waiting for the GIL)."""

KILL_CLEAR = 5.0
"""Seconds before a kill without a fault in the way of the writer's flushes (Redis, the writers'
proxy, a pause of that writer) for :data:`KILL_SLACK` to be the bound."""

KNOWN = {}
"""Anomalies already filed, by the start of their text, with where: printed, not counted as new
(the run fails only on a new one). Remove an entry when its fix lands."""
LATENCY = 0.3
USAGE_FIELDS = ("requests", "prompt tokens", "cached prompt tokens", "generation tokens")


@dataclass
class Anomaly:
    what: str
    at: float
    reads: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Report:
    seed: int
    anomalies: list[Anomaly]
    checked: Counter[str]
    faults: Counter[str]
    start: float
    fault_windows: list[tuple[float, float, str]]
    finals: dict[str, tuple[float, int, int]] = field(default_factory=dict)
    ledger_lost: dict[str, float] = field(default_factory=dict)

    def around(self, t: float, margin: float = 5.0) -> list[str]:
        return [
            f"{w} [{a - self.start:.1f}s .. {b - self.start:.1f}s]"
            for a, b, w in self.fault_windows
            if a - margin <= t <= b + margin
        ]

    @property
    def new(self) -> list[Anomaly]:
        """The anomalies not :data:`KNOWN`."""
        return [a for a in self.anomalies if known(a) is None]

    def summary(self, injected: Counter[str] | None = None) -> str:
        lines = [f"nemesis SEED={self.seed}: faults injected by kind:"]
        lines += [f"  {kind}: {n}" for kind, n in sorted((injected or self.faults).items())]
        lines.append("reads and events checked:")
        lines += [f"  {kind}: {n}" for kind, n in sorted(self.checked.items())]
        lines.append(
            "the end state (the library's read, after the writers closed): value, acknowledged, recorded"
        )
        lines += [f"  {s}: {v:g}, {low}, {high}" for s, (v, low, high) in sorted(self.finals.items())]
        if self.ledger_lost:
            lines.append(
                "acknowledged usage Redis going back took from the ledger (not sent again, docs/usage.md):"
            )
            lines += [f"  {k}: {v:g}" for k, v in sorted(self.ledger_lost.items())]
        lines.append(f"anomalies: {len(self.new)} new, {len(self.anomalies) - len(self.new)} known")
        shown: Counter[str] = Counter()
        for a in self.anomalies:
            where = known(a)
            shown[where or a.what[:40]] += 1
            if shown[where or a.what[:40]] > 3:
                continue  # the first three of a kind
            lines.append(f"- at {a.at - self.start:.1f}s: {a.what}" + (f" [known: {where}]" if where else ""))
            lines.append(f"  faults around it: {'; '.join(self.around(a.at)) or 'none'}")
            for r in a.reads[:4]:
                lines.append(f"  read: {json.dumps(r)[:600]}")
            lines.append(f"  replay: make nemesis SEED={self.seed}")
        return "\n".join(lines)


def known(a: Anomaly) -> str | None:
    """Where *a* is already filed, or None."""
    return next((where for start, where in KNOWN.items() if a.what.startswith(start)), None)


def snapshot_series(snap: Any) -> dict[str, Any]:
    """The writers' series of a library snapshot, as :func:`tests.nemesis.workers.parse_metrics`
    gives them from ``/metrics``."""
    out: dict[str, Any] = {"c": {}, "h": {}, "g": {}}
    for engine, e in snap.engines.items():
        for (name, labels), value in e.counters.items():
            if name == "vllm:prompt_tokens":
                out["c"][f"{engine}|{labels[0]}"] = value
        for (name, labels), value in e.gauges.items():
            if name == "vllm:num_requests_running":
                out["g"][f"{engine}|{labels[0]}"] = value
        for (name, labels), h in e.histograms.items():
            if name == "vllm:e2e_request_latency_seconds":
                buckets = {_le(b): c for b, c in zip(h.bounds, h.cumulative)}
                out["h"][f"{engine}|{labels[0]}"] = {"b": buckets, "count": h.count, "sum": h.sum}
    return out


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class _Bounds:
    """Per process, what it had recorded (``rec``) and what the store must hold of it (``ack``,
    lowered by a time travel or an eviction), over time."""

    KEEP = 120.0  # seconds of floor changes kept to look back from (an RDB is noted once it is written)

    def __init__(self, increments: bool = False) -> None:
        # increments: the floor of a store of increments (the usage ledger), which a Redis gone
        # back loses for good: a live writer's next flushes add to what is left, never restore it.
        self.increments = increments
        self.lost: dict[str, tuple[int, ...]] = {}  # process -> what Redis going back took of it
        self.series: dict[str, str] = {}  # process -> series
        self.of_series: dict[str, list[str]] = defaultdict(list)  # series -> its processes
        self.recorded: dict[str, tuple[list[float], list[tuple[int, ...]]]] = defaultdict(lambda: ([], []))
        self.floor: dict[str, tuple[int, ...]] = {}  # process -> the values the store must hold now
        # Recent changes of the floor, (when, process, its value before), and the floors saved at
        # the moments Redis may go back to (an RDB taken, a replica last in sync).
        self.changes: deque[tuple[float, str, tuple[int, ...] | None]] = deque()
        self.saved: dict[float, dict[str, tuple[int, ...]]] = {}
        self.last_loss = -math.inf  # when acknowledged data last went away by design

    @staticmethod
    def parts(e: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...]]]:
        """(process, series, values) of a ``rec`` or ``ack`` line: the writer's series (prompt
        tokens, observations), and each tenant's usage as a series of its own (``usage|<tenant>``,
        requests, prompt, cached and generation tokens) under a process ``<p>#<tenant>``."""
        out = [(e["p"], e["s"], (e["c"], e["h"]))]
        out += [(f"{e['p']}#{t}", f"usage|{t}", tuple(v)) for t, v in (e.get("u") or {}).items()]
        return out

    def rec(self, e: dict[str, Any]) -> None:
        for p, s, values in self.parts(e):
            if p not in self.series:
                self.series[p] = s
                self.of_series[s].append(p)
            times, recorded = self.recorded[p]
            times.append(e["t"])
            recorded.append(values)

    def ack(self, e: dict[str, Any]) -> None:
        straddles = e.get("t0", -math.inf) < self.last_loss  # sent before data went away, answered after
        for p, _, values in self.parts(e):
            lost = (*self.lost.get(p, ()), 0, 0, 0, 0)[: len(values)]
            floor = (*self.floor.get(p, ()), 0, 0, 0, 0)[: len(values)]
            value = tuple(v - x for v, x in zip(values, lost))
            if not straddles:
                self._set(e["t"], p, value)
            elif self.increments:  # what it added may be gone for good: never counted on
                self.lost[p] = tuple(x + max(0, v - f) for x, v, f in zip(lost, value, floor))

    def _set(self, t: float, p: str, value: tuple[int, ...] | None) -> None:
        self.changes.append((t, p, self.floor.get(p)))
        if value is None:
            self.floor.pop(p, None)
        else:
            self.floor[p] = value
        while self.changes and self.changes[0][0] < t - self.KEEP:
            self.changes.popleft()

    def raise_floor(self, t: float, p: str, value: tuple[int, ...]) -> None:
        lost = self.lost.get(p, ())
        value = tuple(v - (lost[i] if i < len(lost) else 0) for i, v in enumerate(value))
        if value > self.floor.get(p, ()):
            self._set(t, p, value)

    def save(self, taken: float) -> None:
        """The floor as it was at *taken* (a copy Redis may be sent back to)."""
        floor = dict(self.floor)
        for t, p, before in reversed(self.changes):
            if t <= taken:
                break
            if before is None:
                floor.pop(p, None)
            else:
                floor[p] = before
        self.saved[taken] = floor

    def travel(self, taken: float, now: float) -> None:
        saved = self.saved.get(taken, {})
        for p in list(self.floor):
            self._went_back(p, self.floor[p], saved.get(p, ()))
            self._set(now, p, None)
        for p, value in saved.items():
            self._set(now, p, value)

    def evicted(self, now: float) -> None:
        for p in list(self.floor):
            self._went_back(p, self.floor[p], ())
            self._set(now, p, None)

    def _went_back(self, p: str, before: tuple[int, ...], after: tuple[int, ...]) -> None:
        if self.increments:
            after = (*after, 0, 0, 0, 0)[: len(before)]
            lost = (*self.lost.get(p, ()), 0, 0, 0, 0)[: len(before)]
            self.lost[p] = tuple(x + b - a for x, b, a in zip(lost, before, after))

    def upper(self, series: str, t: float) -> tuple[int, ...]:
        total = [0, 0, 0, 0]
        for p in self.of_series.get(series, ()):
            times, values = self.recorded[p]
            i = bisect.bisect_right(times, t) - 1
            if i >= 0:
                total = [a + b for a, b in zip(total, (*values[i], 0, 0))]
        return tuple(total)

    def lower(self, series: str) -> tuple[int, ...]:
        total = [0, 0, 0, 0]
        for p in self.of_series.get(series, ()):
            total = [a + b for a, b in zip(total, (*self.floor.get(p, ()), 0, 0, 0, 0))]
        return tuple(total)


class _Checker:
    def __init__(self, events: list[dict[str, Any]], seed: int) -> None:
        self.events = events
        self.seed = seed
        self.anomalies: list[Anomaly] = []
        self.checked: Counter[str] = Counter()
        self.bounds = _Bounds()
        self.inc = _Bounds(increments=True)  # the ledger's floor, as a store of increments
        self.both = (self.bounds, self.inc)
        self.gauges: dict[str, set[float]] = defaultdict(set)
        self.engine_gauges: dict[str, set[float]] = defaultdict(set)
        self.outages: list[tuple[float, float]] = []
        self.windows: list[tuple[float, float, str]] = []
        self.faults: Counter[str] = Counter()
        self.start = next((e["t"] for e in events if e["k"] == "deployed"), events[0]["t"] if events else 0.0)
        self.closed_at = next((e["t"] for e in events if e["k"] == "writers_closed"), math.inf)
        self.max_token = (0, "")
        self.watch: dict[str, tuple[Any, int]] = {}
        self.load_states: dict[tuple[int, str], tuple[float, str]] = {}
        self.finals: dict[str, tuple[float, int, int]] = {}
        self.ledger_lost: dict[str, float] = {}  # acknowledged usage Redis going back took (documented)
        self.flush_faults: list[tuple[float, float, str]] = []
        self.incarnation: dict[str, str] = {}  # slot -> its process now
        self._scan_windows()

    def flag(self, what: str, at: float, *reads: dict[str, Any]) -> None:
        self.anomalies.append(Anomaly(what, at, list(reads)))

    def _scan_windows(self) -> None:
        """The faults' windows (for the report) and when the exporters could not read Redis."""
        open_faults: dict[str, float] = {}
        down_since: float | None = None
        for e in self.events:
            k = e["k"]
            if k == "fault":
                if e["phase"] == "start":
                    open_faults[e["what"]] = e["t"]
                    of = e.get("of")
                    self.faults[f"{e['kind']} {of}" if of else e["kind"]] += 1
                else:
                    self.windows.append((open_faults.pop(e["what"], e["t"]), e["t"], e["what"]))
                    if e["target"] in ("redis", "w") or e["kind"] == "pause":
                        # In the way of a writer's flushes (a pause: of that process only).
                        who = e["target"] if e["kind"] == "pause" else ""
                        self.flush_faults.append((self.windows[-1][0], e["t"], who))
                    if e["kind"] == "partition" and e["target"] == "r":
                        self.outages.append((self.windows[-1][0], e["t"]))
            elif k in ("redis_down", "redis_frozen") and down_since is None:
                down_since = e["t"]
            elif k in ("redis_up", "redis_thawed") and down_since is not None:
                self.outages.append((down_since, e["t"]))
                down_since = None
        end = self.events[-1]["t"] if self.events else 0.0
        self.windows += [(t, end, w) for w, t in open_faults.items()]
        if down_since is not None:
            self.outages.append((down_since, end))

    def in_outage(self, t0: float, t1: float) -> bool:
        """Whether a read made from *t0* to *t1* fell entirely inside an outage, past the grace."""
        return any(a + GRACE <= t0 and t1 <= b for a, b in self.outages)

    def run(self) -> None:
        handlers = {
            "rec": lambda e: [b.rec(e) for b in self.both],
            "ack": lambda e: [b.ack(e) for b in self.both],
            "gauge": self._gauge,
            "metrics": self._metrics,
            "final": self._final,
            "load": self._load,
            "watch_state": self._watch_state,
            "watch_poll": self._watch_poll,
            "print": self._print,
            "travel": lambda e: [b.travel(e["taken"], e["t"]) for b in self.both],
            "failover": lambda e: [b.travel(e["taken"], e["t"]) for b in self.both],
            "rdb": lambda e: [b.save(e["taken"]) for b in self.both],
            "replica_synced": lambda e: [b.save(e["taken"]) for b in self.both],
            "evict_end": self._evict_end,
            "usage": self._usage,
            "drained": self._drained,
            "spawn": lambda e: self.incarnation.__setitem__(e["slot"], e["name"]),
            "killed": self._killed,
        }
        for e in self.events:
            if e["k"] == "loss":  # Redis is killed to come back older (a time travel, a failover)
                for b in self.both:
                    b.last_loss = e["t"]
            if e["k"] == "evict" and e.get("lru"):
                self.lru = True
            handler = handlers.get(e["k"])
            if handler is not None:
                handler(e)

    def _killed(self, e: dict[str, Any]) -> None:
        """A writer killed while its flushes went through loses less than a flush interval of
        records (docs/operations.md): its floor is what it had recorded :data:`KILL_SLACK` s
        before, unless a fault stood in the way of its flushes in the :data:`KILL_CLEAR` s before."""
        slot, k = e["slot"], e["t"]
        name = self.incarnation.get(slot)
        if name is None or name not in self.bounds.series:
            return
        if any(a <= k and b >= k - KILL_CLEAR and who in ("", slot) for a, b, who in self.flush_faults):
            return
        self.checked["writers killed with their flushes going through"] += 1
        for p in [p for p in self.bounds.series if p == name or p.startswith(name + "#")]:
            times, values = self.bounds.recorded[p]
            i = bisect.bisect_right(times, k - KILL_SLACK) - 1
            if i >= 0:
                for b in self.both:
                    b.raise_floor(k, p, values[i])

    def _evict_end(self, e: dict[str, Any]) -> None:
        if getattr(self, "lru", False):
            for b in self.both:
                b.last_loss = e["t"]
                b.evicted(e["t"])
            self.lru = False

    def _gauge(self, e: dict[str, Any]) -> None:
        self.gauges[e["s"]].add(float(e["v"]))
        self.engine_gauges[e["s"].split("|")[0]].add(float(e["v"]))

    def _metrics(self, e: dict[str, Any]) -> None:
        if e.get("status") != 200:
            return
        self.checked["/metrics reads"] += 1
        self._series(e, final=e["t0"] > self.closed_at + 1.0)

    def _final(self, e: dict[str, Any]) -> None:
        self.checked["final reads (library)"] += 1
        self._series(e, final=True)
        for tenant, values in (e.get("u") or {}).items():
            for i, what in enumerate(USAGE_FIELDS):
                s = f"usage|{tenant}"
                self.checked["final ledger values"] += 1
                self.finals[f"ledger {what} {s}"] = (
                    values[i],
                    self.bounds.lower(s)[i],
                    self.bounds.upper(s, e["t"])[i],
                )
                if values[i] < self.inc.lower(s)[i] or values[i] < self.bounds.lower(s)[i] - 1e-6:
                    self._final_value(s, f"ledger {what}", values[i], e, i, self.inc)
                if self.inc.lower(s)[i] <= values[i] < self.bounds.lower(s)[i] and e["k"] == "final":
                    # docs/usage.md: batches Redis lost going back are not sent again
                    self.ledger_lost[f"{what} of {tenant}"] = self.bounds.lower(s)[i] - values[i]

    def _usage(self, e: dict[str, Any]) -> None:
        """A read of the ledger while faults run: never above what was recorded."""
        for tenant, values in (e.get("u") or {}).items():
            self.checked["ledger values"] += 4
            high = self.bounds.upper(f"usage|{tenant}", e["t"])
            for i, what in enumerate(USAGE_FIELDS):
                if values[i] > high[i]:
                    self.flag(
                        f"ledger {what} of {tenant} = {values[i]} above what was recorded ({high[i]})",
                        e["t"],
                        e,
                    )

    def _drained(self, e: dict[str, Any]) -> None:
        """After every front end's requests and router's bookings ended: 0 in flight, 0 booked."""
        self.checked["/load reads after the drain"] += 1
        if e.get("status") != 200:
            self.flag(
                f"/load of port {e['port']} answered {e.get('status')} after the faults stopped", e["t"], e
            )
            return
        for engine, st in (e.get("states") or {}).items():
            state, _, in_flight, booked = (*st, None, None, None)[:4]
            if (state == "up" and (in_flight or 0) != 0) or (booked or 0) != 0:
                what = f"engine {engine} {state} with in_flight {in_flight}, booked {booked} after the drain"
                self.flag(what, e["t"], e)

    def _series(self, e: dict[str, Any], final: bool) -> None:
        t = e["t"]
        for s, value in e.get("c", {}).items():
            self.checked["counter values"] += 1
            up_c = self.bounds.upper(s, t)[0]
            if value > up_c + 1e-6:
                self.flag(f"counter {s} = {value:g} above what was recorded ({up_c})", t, e)
            if final:
                self._final_value(s, "counter", value, e, 0)
        for s, h in e.get("h", {}).items():
            self.checked["histogram values"] += 1
            self._histogram(s, h, e, final)
        for s, value in e.get("g", {}).items():
            self.checked["gauge values"] += 1
            if float(value) not in self.gauges[s]:
                self.flag(f"gauge {s} = {value:g}, a value no writer set", t, e)

    def _final_value(
        self, s: str, what: str, value: float, e: dict[str, Any], i: int, bounds: _Bounds | None = None
    ) -> None:
        self.checked[f"final {what} values"] += 1
        low, high = (bounds or self.bounds).lower(s)[i], self.bounds.upper(s, e["t"])[i]
        if e["k"] == "final":
            self.finals[f"{what} {s}"] = (value, low, high)
        if not low - 1e-6 <= value <= high + 1e-6:
            self.flag(
                f"final {what} {s} = {value:g}: acknowledged {low}, recorded {high} "
                f"({'lost' if value < low else 'invented'} {abs(value - (low if value < low else high)):g})",
                e["t"],
                e,
            )
        elif low == high:
            self.checked[f"final {what} values exact"] += 1

    def _histogram(self, s: str, h: dict[str, Any], e: dict[str, Any], final: bool) -> None:
        t = e["t"]
        buckets = sorted(((float(le), v) for le, v in h.get("b", {}).items()), key=lambda x: x[0])
        count, inf = h.get("count"), h.get("b", {}).get("+Inf")
        values = [v for _, v in buckets]
        torn = count is None or inf is None or count != inf or values != sorted(values)
        if not torn and abs(h.get("sum", 0.0) - LATENCY * count) > 1e-6 * max(1.0, count):
            torn = True
        if torn:
            self.flag(f"histogram {s} torn: count {count}, +Inf {inf}, sum {h.get('sum')}", t, e)
            return
        up_h = self.bounds.upper(s, t)[1]
        if count > up_h:
            self.flag(f"histogram {s} count {count:g} above what was observed ({up_h})", t, e)
        if final:
            self._final_value(s, "histogram count", count, e, 1)

    def _load(self, e: dict[str, Any]) -> None:
        self.checked["/load reads"] += 1
        states = e.get("states")
        if e.get("status") == 200 and states and self.in_outage(e["t0"], e["t"]):
            up = sorted(k for k, v in states.items() if v[0] == "up")
            if up:
                self.flag(
                    f"/load answered 200 with engines {up} up while the store could not be read", e["t"], e
                )
        for engine, st in (states or {}).items():
            state, running, in_flight, booked = (*st, None, None, None)[:4]
            self._state(f"/load of port {e['port']}", int(engine), state, e)
            if (in_flight or 0) < 0 or (booked or 0) < 0:
                self.flag(
                    f"/load engine {engine}: in_flight {in_flight}, booked {booked} (negative)", e["t"], e
                )
            if running is not None and float(running) not in self.engine_gauges[engine]:
                self.flag(
                    f"/load engine {engine} requests_running {running}, a value no writer set", e["t"], e
                )
            key = (int(engine), str(e["port"]))
            before = self.load_states.get(key)
            if before and before[1] == "down" and state == "stale" and e["t0"] - before[0] < 1.0:
                self.flag(f"/load engine {engine} went from down to stale (not through up)", e["t"], e)
            self.load_states[key] = (e["t"], state)

    def _state(self, where: str, engine: int, state: Any, e: dict[str, Any]) -> None:
        if state not in STATES:
            self.flag(f"{where}: engine {engine} in state {state!r}, not one of {sorted(STATES)}", e["t"], e)

    def _watch_state(self, e: dict[str, Any]) -> None:
        self.checked["/watch whole states"] += 1
        states = e.get("states")
        if e.get("status") == 200 and states and self.in_outage(e["t0"], e["t"]):
            up = sorted(k for k, v in states.items() if v[0] == "up")
            if up:
                self.flag(
                    f"/watch answered 200 with engines {up} up while the store could not be read", e["t"], e
                )
        if e.get("status") == 200:
            self.watch[e["p"]] = (e.get("epoch"), e.get("seq") or 0)

    def _watch_poll(self, e: dict[str, Any]) -> None:
        if e.get("status") != 200:
            return
        self.checked["/watch long polls"] += 1
        epoch, since = e.get("epoch"), e.get("since") or 0
        if e.get("got_epoch") != epoch or e.get("gap"):
            return  # a new epoch (the exporter restarted) or a gap: the whole state again
        seqs = [s for _, s, _ in e.get("events") or []]
        if seqs and (seqs != sorted(set(seqs)) or seqs[0] <= since):
            self.flag(
                f"/watch events out of order within epoch {epoch}: since {since}, seqs {seqs}", e["t"], e
            )
        if (e.get("seq") or 0) < since:
            self.flag(f"/watch seq went back within epoch {epoch}: {since} -> {e.get('seq')}", e["t"], e)
        for engine, _, state in e.get("events") or []:
            self._state("/watch", engine, state, e)
        self.checked["/watch events"] += len(seqs)

    def _print(self, e: dict[str, Any]) -> None:
        self.checked["log-line prints"] += 1
        token, holder = e["token"], e["p"]
        if token < self.max_token[0]:
            self.flag(
                f"log-line printer {holder} printed with fencing token {token} after "
                f"{self.max_token[1]} printed with {self.max_token[0]} (two printers at once, or a "
                "token handed out again)",
                e["t"],
                e,
            )
        elif token > self.max_token[0]:
            self.max_token = (token, holder)

    def logs(self, directory: Path) -> None:
        """Outages reported as one: in each process's log, starts and ends alternate."""
        pattern = re.compile(r"(.*?) (?:failed \(.*\): outage started|works again: outage ended)")
        for path in sorted(directory.glob("*.log")):
            open_: dict[str, bool] = {}
            for line in path.read_text(errors="replace").splitlines():
                m = pattern.search(line)
                if not m:
                    continue
                self.checked["outage lines"] += 1
                subject, started = m.group(1)[-160:], "outage started" in line
                if open_.get(subject, False) == started:
                    twice = "started" if started else "ended"
                    what = f"{path.name}: outage {twice} twice in a row: {line[:300]}"
                    self.flag(what, self.start, {"log": path.name})
                open_[subject] = started


def check_events(events: list[dict[str, Any]], seed: int, directory: Path | None = None) -> Report:
    """The checker over *events* (and the processes' logs in *directory*)."""
    c = _Checker(events, seed)
    c.run()
    if directory is not None:
        c.logs(directory)
    return Report(seed, c.anomalies, c.checked, c.faults, c.start, c.windows, c.finals, c.ledger_lost)


def check(directory: str | Path, seed: int) -> Report:
    """The checker over the history in *directory*."""
    return check_events(load(directory), seed, Path(directory))


def main() -> None:
    """``python -m tests.nemesis.checker DIR SEED``: check a run's history again."""
    import sys

    print(check(sys.argv[1], int(sys.argv[2])).summary())


if __name__ == "__main__":
    main()
