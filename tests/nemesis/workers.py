"""The processes of the nemesis run, each recording what it did (:mod:`tests.nemesis.history`).

    python -m tests.nemesis.workers KIND DIR NAME URL NAMESPACE SEED [ARG...]

KIND:

- ``sync`` / ``asyncio`` ENGINE: a real writer (the vLLM catalogue, with the load lane) counting
  known amounts on its engine: prompt tokens (a counter), request latencies (a histogram, every
  observation 0.3 s), requests running (a gauge). Before each chunk of records it writes ``rec``
  (its totals once the chunk is recorded: a bound); after a flush that Redis confirmed with
  nothing pending, ``ack`` (the totals confirmed). SIGTERM: close, ``closed`` (and ``ack`` when
  the close confirmed everything).
- ``fork`` ENGINE: the same, and it forks two children (a writer made before the fork carries on
  in each, counting for the child); each child records for a while, closes and exits, and
  another is forked (a worker recycled).
- ``lease``: a log-line printer (:class:`~redis_stats.reporting.StatsReporter` under a
  :class:`~redis_stats.leader.LeaseLeader`): every line it would print is recorded (``print``,
  with the lease's fencing token).
- ``watch`` PORT: a router following an exporter's ``/watch`` (long polls; the whole state again
  every few seconds): every answer recorded.
- ``observe`` PORT...: reads ``/metrics`` and ``/load`` of each exporter, over and over: every
  answer recorded (the counters, histograms and gauges the writers write; the load states).

``NEMESIS_SKEW`` (seconds): this process's wall clock is that far off (``time.time``, which the
writer reads for what it stamps before Redis answers and for its self-metrics).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from tests.nemesis.history import Recorder

AMOUNT = 7  # prompt tokens per record
LATENCY = 0.3  # every observation
COUNTER = "vllm:prompt_tokens"
HISTOGRAM = "vllm:e2e_request_latency_seconds"
GAUGE = "vllm:num_requests_running"
TENANTS = ("acme", "globex", "initech", None)  # None: the ledger's "(none)"


def _usage_recorder(writer: Any) -> Any:
    """The writer's usage ledger (``redis_stats.usage``), or None in a release without it."""
    try:
        from redis_stats.usage import UsageRecorder
    except ImportError:
        return None
    if not hasattr(writer, "attach"):  # a previous release's writer (the module found elsewhere)
        return None
    return UsageRecorder(writer)


def _arrivals(writer: Any) -> Any:
    """The writer's arrivals (``in_flight``), or None in a release without them."""
    try:
        from redis_stats.writer.arrivals import Arrivals
    except ImportError:
        return None
    if not hasattr(writer.load, "count_arrivals"):  # a previous release's writer
        return None
    return Arrivals(writer)


def draining(directory: str) -> bool:
    """Whether the harness asked every front end and router to let its requests end (the file
    ``drain`` in the run's directory): ``in_flight`` and ``booked`` must come back to 0."""
    return os.path.exists(os.path.join(directory, "drain"))


def skew_clock() -> None:
    """Shift ``time.time`` by ``NEMESIS_SKEW`` seconds (a host whose clock is off)."""
    skew = float(os.environ.get("NEMESIS_SKEW") or 0)
    if skew:
        real = time.time
        time.time = lambda: real() + skew


def config(url: str, namespace: str) -> Any:
    from redis_stats import StatsConfig

    return StatsConfig(
        url=url,
        namespace=namespace,
        flush_interval=0.25,
        stale_after=3.0,
        connect_timeout_ms=500,
        socket_timeout_ms=500,
        close_timeout=10.0,
        lease_ttl=2.0,
    )


class Stop:
    """Set by SIGTERM: the loops end, the writers close."""

    def __init__(self) -> None:
        self.asked = False
        signal.signal(signal.SIGTERM, self._ask)

    def _ask(self, *_: Any) -> None:
        self.asked = True


class Workload:
    """What one writer process records, and the lines that say so."""

    def __init__(self, rec: Recorder, writer: Any, engine: int, model: str, seed: int) -> None:
        self.rec = rec
        self.writer = writer
        self.model = model
        self.series = f"{engine}|{model}"
        self.usage = _usage_recorder(writer)
        self.arrivals = _arrivals(writer)
        self.open: list[Any] = []  # arrivals not ended yet
        self.u: dict[str, list[int]] = {}  # usage recorded per tenant: requests, prompt, cached, generation
        self.rng = random.Random(seed)
        self.tokens = writer.metric(COUNTER).labels(engine, model_name=model)
        self.latency = writer.metric(HISTOGRAM).labels(engine, model_name=model)
        self.running = writer.metric(GAUGE).labels(engine, model_name=model)
        self.c = 0  # prompt tokens recorded
        self.h = 0  # observations recorded
        self.next_gauge = 0.0
        self.next_ack = 0.0

    def restart_as_child(self, rec: Recorder, seed: int) -> None:
        """In a forked child: its own history and totals (the child is a new writer)."""
        self.rec, self.rng, self.c, self.h = rec, random.Random(seed), 0, 0
        self.u, self.open = {}, []  # the parent's: not this writer's to count or end

    def chunk(self) -> None:
        """Record one chunk, announced first."""
        n = self.rng.randint(1, 40)
        self.c += n * AMOUNT
        self.h += n
        tenant = self.rng.choice(TENANTS)
        if self.usage is not None:
            u = self.u.setdefault(tenant or "(none)", [0, 0, 0, 0])
            for i, v in enumerate((1, n * AMOUNT, n, 2 * n)):
                u[i] += v
        self.rec("rec", s=self.series, c=self.c, h=self.h, u=self.u)
        for _ in range(n):
            self.tokens.inc(AMOUNT)
            self.latency.observe(LATENCY)
        if self.usage is not None:
            self._use(tenant, n)
        self._arrive()
        now = time.monotonic()
        if now >= self.next_gauge:
            value = self.rng.randrange(0, 64)
            self.rec("gauge", s=self.series, v=value)
            self.running.set(value)
            self.next_gauge = now + self.rng.uniform(0.1, 0.5)

    def _use(self, tenant: str | None, n: int) -> None:
        from redis_stats.usage import Usage

        self.usage.record(
            Usage(tenant=tenant, adapter=None, model=self.model, prompt_tokens=n * AMOUNT,
                  cached_prompt_tokens=n, generation_tokens=2 * n)
        )  # fmt: skip

    def _arrive(self) -> None:
        """Requests arrive and end (``in_flight``); all end once the harness drains."""
        if self.arrivals is None:
            return
        if draining(os.path.dirname(self.rec.path)):
            for arrival in self.open:
                arrival.end()
            self.open = []
            return
        for _ in range(self.rng.randint(0, 2)):
            self.open.append(self.arrivals.begin())
        for _ in range(min(len(self.open), self.rng.randint(0, 2))):
            self.open.pop(0).end()

    def ack_due(self) -> tuple[int, int, float, dict[str, list[int]]] | None:
        """The totals to acknowledge if a flush is due now (then made by the caller), and when
        it is sent (``t0`` of the ``ack`` line: Redis applied it after that)."""
        now = time.monotonic()
        if now < self.next_ack:
            return None
        self.next_ack = now + self.rng.uniform(0.2, 1.0)
        return self.c, self.h, now, {k: list(v) for k, v in self.u.items()}

    def acked(self, totals: tuple[int, int, float, dict[str, list[int]]], ok: bool) -> None:
        if ok and not self.writer.pending():
            self.rec("ack", s=self.series, c=totals[0], h=totals[1], t0=totals[2], u=totals[3])

    def closed(self, ok: bool, t0: float) -> None:
        self.rec("closed", s=self.series, ok=ok, c=self.c, h=self.h)
        if ok:
            self.rec("ack", s=self.series, c=self.c, h=self.h, t0=t0, u=self.u)


def _writer_parts(argv: list[str]) -> tuple[Recorder, Any, int, str, int]:
    directory, name, url, namespace, seed, engine = argv[:6]
    rec = Recorder(directory, name)
    rec.start(engine=int(engine), skew=float(os.environ.get("NEMESIS_SKEW") or 0))
    return rec, config(url, namespace), int(engine), name.split(".")[0], int(seed)


def _make_sync_writer(cfg: Any, engine: int, name: str) -> Any:
    from redis_stats import StatsWriter
    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.integrations.vllm.load import VLLM_LOAD

    return StatsWriter(cfg, vllm_catalog(), engines=[engine], role=name.replace(".", "-"), load=VLLM_LOAD)


def run_sync(argv: list[str], stop: Stop) -> None:
    rec, cfg, engine, model, seed = _writer_parts(argv)
    writer = _make_sync_writer(cfg, engine, rec.name)
    work = Workload(rec, writer, engine, model, seed)
    _sync_loop(work, stop, deadline=float("inf"))
    t0 = time.monotonic()
    work.closed(writer.close(), t0)


def _sync_loop(work: Workload, stop: Stop, deadline: float) -> None:
    while not stop.asked and time.monotonic() < deadline:
        work.chunk()
        totals = work.ack_due()
        if totals is not None:
            work.acked(totals, work.writer.flush())
        time.sleep(0.01)


def run_fork(argv: list[str], stop: Stop) -> None:
    rec, cfg, engine, model, seed = _writer_parts(argv)
    writer = _make_sync_writer(cfg, engine, rec.name)
    work = Workload(rec, writer, engine, model, seed)
    children: dict[int, str] = {}
    born = 0
    while not stop.asked:
        while len(children) < 2 and not stop.asked:
            born += 1
            child_name = f"{rec.name}.c{born}"
            pid = os.fork()
            if pid == 0:
                _child(work, Recorder(argv[0], child_name), seed * 1000 + born, stop)
            children[pid] = child_name
        _sync_loop(work, stop, deadline=time.monotonic() + 1.0)
        for pid in list(children):
            if os.waitpid(pid, os.WNOHANG)[0]:
                del children[pid]
    for pid in children:  # the children close too
        os.kill(pid, signal.SIGTERM)
    t0 = time.monotonic()
    work.closed(writer.close(), t0)
    for pid in children:
        os.waitpid(pid, 0)


def _child(work: Workload, rec: Recorder, seed: int, stop: Stop) -> None:
    """A forked worker: records for 5-30 s through handles bound before the fork, closes, exits."""
    rec.start(engine=int(work.series.split("|")[0]), forked=True)
    work.restart_as_child(rec, seed)
    stop.asked = False
    _sync_loop(work, stop, deadline=time.monotonic() + work.rng.uniform(5, 30))
    t0 = time.monotonic()
    work.closed(work.writer.close(), t0)
    os._exit(0)


def run_asyncio(argv: list[str], stop: Stop) -> None:
    asyncio.run(_async_main(argv, stop))


async def _async_main(argv: list[str], stop: Stop) -> None:
    from redis_stats.aio import AsyncStatsWriter
    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.integrations.vllm.load import VLLM_LOAD

    rec, cfg, engine, model, seed = _writer_parts(argv)
    writer = AsyncStatsWriter(cfg, vllm_catalog(), engines=[engine], role=model, load=VLLM_LOAD)
    writer.start()
    work = Workload(rec, writer, engine, model, seed)
    while not stop.asked:
        work.chunk()
        totals = work.ack_due()
        if totals is not None:
            work.acked(totals, await writer.flush())
        await asyncio.sleep(0.01)
    t0 = time.monotonic()
    work.closed(await writer.close(), t0)


def run_lease(argv: list[str], stop: Stop) -> None:
    from redis_stats import StatsReader
    from redis_stats.connection import make_client
    from redis_stats.keys import Keys
    from redis_stats.leader import LeaseLeader
    from redis_stats.reporting import StatsReporter

    directory, name, url, namespace = argv[:4]
    rec = Recorder(directory, name)
    rec.start()
    cfg = config(url, namespace)
    # The pair fails over to a lagging replica: a renewal counts only once the replica holds it
    # (docs/logging.md, "The log lease"; issue 48, SEED=855465088). Shorter than a renewal period.
    leader = LeaseLeader(
        make_client(cfg), Keys(namespace), name, ttl=cfg.lease_ttl, wait_replicas=1, wait_timeout_ms=200
    )

    def lines(previous: Any, current: Any) -> list[Any]:
        rec("print", token=leader.token)  # called only when the reporter would print
        return []

    reporter = StatsReporter(StatsReader(cfg), leader, lines=lines, interval=0.25)
    reporter.start()
    while not stop.asked:
        time.sleep(0.05)
    reporter.close(2.0)
    rec("closed")


def get(url: str, timeout: float, accept: str = "") -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read()
            status = answer.status
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError):
        return 0, None  # refused, reset, timed out: no answer
    if "json" in accept:
        try:
            return status, json.loads(body)
        except ValueError:
            return -1, body[:200].decode(errors="replace")  # an answer that is not JSON
    return status, body.decode(errors="replace")


def states(doc: dict[str, Any]) -> dict[str, Any]:
    """Each engine's state and requests running, of a ``/load`` or ``/watch`` document."""
    engines = doc.get("engines") or {}
    items = engines.items() if isinstance(engines, dict) else ((e.get("engine"), e) for e in engines)
    fields = ("state", "requests_running", "in_flight", "booked")
    return {str(k): [e.get(f) for f in fields] for k, e in items if isinstance(e, dict)}


def book(directory: str, url: str, namespace: str, seed: int, stop: Stop) -> None:
    """A router's dispatches, booked (:mod:`redis_stats.bookings`) and ended 0.1-1 s later; all
    ended once the harness drains (``booked`` back to 0)."""
    try:
        from redis_stats.bookings import Bookings
    except ImportError:
        return
    rng = random.Random(seed)
    bookings = Bookings(config(url, namespace))
    open_: list[tuple[float, Any]] = []
    while not stop.asked:
        now = time.monotonic()
        drain = draining(directory)
        if not drain and rng.random() < 0.5:
            open_.append((now + rng.uniform(0.1, 1.0), bookings.book(rng.randrange(0, 5))))
        for due, booking in [b for b in open_ if drain or b[0] <= now]:
            booking.end()
            open_.remove((due, booking))
        time.sleep(0.05)
    bookings.close()


def run_watch(argv: list[str], stop: Stop) -> None:
    directory, name, port = argv[0], argv[1], int(argv[5])
    rec = Recorder(directory, name)
    rec.start(port=port)
    threading.Thread(target=book, args=(directory, argv[2], argv[3], int(argv[4]), stop), daemon=True).start()
    base = f"http://127.0.0.1:{port}/watch"
    epoch, seq, whole_at = None, None, 0.0
    while not stop.asked:
        t0 = time.monotonic()
        if seq is None or t0 - whole_at > 5.0:  # the whole state: at first, and now and then
            status, doc = get(base, 5.0, "application/json")
            whole_at = t0
            ok = status == 200 and isinstance(doc, dict)
            rec(
                "watch_state",
                t0=t0,
                status=status,
                epoch=doc.get("epoch") if ok else None,
                seq=doc.get("seq") if ok else None,
                states=states(doc) if ok else None,
            )
            if ok:
                epoch, seq = doc.get("epoch"), doc.get("seq")
            else:
                time.sleep(0.2)
            continue
        status, doc = get(f"{base}?since={seq}&epoch={epoch}&wait=2", 6.0, "application/json")
        if status != 200 or not isinstance(doc, dict):
            rec("watch_poll", t0=t0, status=status, since=seq, epoch=epoch)
            seq = None
            time.sleep(0.2)
            continue
        events = [[e.get("engine"), e.get("seq"), e.get("state")] for e in doc.get("events") or []]
        rec(
            "watch_poll",
            t0=t0,
            status=status,
            since=seq,
            epoch=epoch,
            got_epoch=doc.get("epoch"),
            seq=doc.get("seq"),
            gap=bool(doc.get("gap")),
            events=events,
            states=states(doc) if doc.get("gap") else None,
        )
        if doc.get("epoch") != epoch or doc.get("gap"):
            epoch = doc.get("epoch")
        seq = doc.get("seq", seq)


def parse_metrics(text: str) -> dict[str, Any]:
    """The writers' series of a ``/metrics`` answer: counters, histograms, gauges by ``engine|model``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {"c": {}, "h": {}, "g": {}}
    for family in text_string_to_metric_families(text):
        if family.name not in (COUNTER, HISTOGRAM, GAUGE):
            continue
        for sample in family.samples:
            series = f"{sample.labels.get('engine')}|{sample.labels.get('model_name')}"
            if family.name == COUNTER and sample.name.endswith("_total"):
                out["c"][series] = sample.value
            elif family.name == GAUGE:
                out["g"][series] = sample.value
            elif family.name == HISTOGRAM:
                h = out["h"].setdefault(series, {"b": {}})
                if sample.name.endswith("_bucket"):
                    h["b"][sample.labels["le"]] = sample.value
                elif sample.name.endswith("_count"):
                    h["count"] = sample.value
                elif sample.name.endswith("_sum"):
                    h["sum"] = sample.value
    return out


def ledger(url: str, namespace: str) -> dict[str, list[int]]:
    """Every tenant's all-time usage (requests, prompt, cached, generation) in the ledger."""
    from redis_stats.usage.read import UsageReader

    reader = UsageReader(config(url, namespace))
    try:
        return {t or "(none)": list(reader.tenant(t).total.values[:4]) for t in TENANTS}
    finally:
        reader.client.close()


def _read_usage(rec: Recorder, url: str, namespace: str) -> None:
    t0 = time.monotonic()
    try:
        rec("usage", t0=t0, u=ledger(url, namespace))
    except Exception as exc:  # Redis down: no read
        rec("usage", t0=t0, error=type(exc).__name__)


def run_observe(argv: list[str], stop: Stop) -> None:
    directory, name = argv[0], argv[1]
    ports = [int(p) for p in argv[5:]]
    rec = Recorder(directory, name)
    rec.start(ports=ports)
    while not stop.asked:
        for port in ports:
            t0 = time.monotonic()
            status, text = get(f"http://127.0.0.1:{port}/metrics", 5.0)
            parsed = parse_metrics(text) if status == 200 and isinstance(text, str) else None
            rec("metrics", t0=t0, port=port, status=status, **(parsed or {}))
            t0 = time.monotonic()
            status, doc = get(f"http://127.0.0.1:{port}/load", 5.0, "application/json")
            ok = status == 200 and isinstance(doc, dict)
            rec("load", t0=t0, port=port, status=status, states=states(doc) if ok else None)
        _read_usage(rec, argv[2], argv[3])
        time.sleep(0.2)
    rec("closed")


KINDS = {
    "sync": run_sync,
    "asyncio": run_asyncio,
    "fork": run_fork,
    "lease": run_lease,
    "watch": run_watch,
    "observe": run_observe,
}


def main() -> None:
    skew_clock()
    kind, argv = sys.argv[1], sys.argv[2:]
    KINDS[kind](argv, Stop())


if __name__ == "__main__":
    main()
