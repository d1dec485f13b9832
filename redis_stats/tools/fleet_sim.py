"""``redis-stats simulate``: a fleet of N engines x M API servers writing to any Redis.

Each engine is a :class:`~redis_stats.tools.simulate.SimulatedEngine` under the fleet's load
(:class:`~redis_stats.tools.simulate.FleetLoad`: a few hot engines whose queues rise and drain),
recorded with the full vLLM catalogue through the real :class:`VllmRecorder` by M writers, one per
API server, as the vLLM plugin writes it (``role=api<rank>``, one owner per engine's node, the load
map of ``/load``, the cache configuration that gives ``/load`` its KV capacity).

The engines are split into a few processes (by default one per CPU core): thousands of writer
processes would not fit a machine, and one process would not carry a thousand engines. In each
process the writers share one Redis client and are flushed in turn by one loop, once per
``flush_interval``: every tick steps every engine by the time since the last, then flushes every
writer. A process whose tick takes longer than the interval says so (the machine carries less).

The parent starts them, prints what they report every ``report_interval`` seconds, and on Ctrl-C,
SIGTERM or the end of ``duration`` stops them: each closes every writer (its last flush, marked
closed in Redis), then prints what it recorded, so the totals printed at the end are what a reader
of the namespace reads.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any, TextIO

from redis_stats.catalog import Catalog
from redis_stats.config import ENV_PREFIX, StatsConfig
from redis_stats.tools.embedded import tied_to_me
from redis_stats.tools.redis_options import plural

__all__ = [
    "MAX_WRITERS",
    "SimulateOptions",
    "foreign_writers",
    "run_simulation",
    "simulated_catalog",
    "totals_in_redis",
]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# Flushes one process has in flight at once (threads on its one shared client's pool).
FLUSH_THREADS = 4
# Seconds the parent waits for a process to close its writers after SIGTERM before killing it.
CLOSE_WAIT = 60.0
MAX_WRITERS = 8_192
"""The most writers (engines x API servers) one simulation runs: each holds the full vLLM
catalogue in memory and flushes once per flush interval (four times the 1,024 x 2 the docs
measure; ``--engines 100000 --api-servers 64`` grew past 3.6 GB before it was refused)."""
# The owner every simulated writer records (as the vLLM plugin records its host and pid):
# ``<host>:simulate-<engine>``. A writer without one was not started by a simulation.
SIMULATED_OWNER = re.compile(r":simulate-\d+$")


@dataclass(frozen=True)
class SimulateOptions:
    """What ``redis-stats simulate`` runs."""

    engines: int = 64
    api_servers: int = 2
    processes: int = 0
    """0: one per CPU core (at most one per engine)."""
    duration: float | None = None
    period: float = 60.0
    """Seconds of a hot engine's cycle: a burst above its capacity, then a drain."""
    scale: float = 1.0
    """Multiplies every engine's arrival rate."""
    hot_every: int = 0
    """One engine in this many is hot (0: from the fleet's size)."""
    report_interval: float = 10.0
    model: str = MODEL
    seed: int = 0
    engines_per_endpoint: int = 0
    """Engines behind one endpoint (``simulate-<i>:8000``, as an API server's address), so the
    endpoint views (``/endpoints``, ``/metrics?endpoint=``) have something to show; 0: none."""

    def endpoint_of(self, engine: int) -> str | None:
        """The endpoint *engine*'s writers record (None without ``engines_per_endpoint``)."""
        n = self.engines_per_endpoint
        return f"simulate-{engine // n}:8000" if n else None

    def process_count(self) -> int:
        """How many processes the engines are split into."""
        wanted = self.processes or os.cpu_count() or 1
        return max(1, min(wanted, self.engines))

    def parts(self) -> list[list[int]]:
        """The engines of each process (contiguous ranges, as even as they can be)."""
        n = self.process_count()
        return [list(range(self.engines * i // n, self.engines * (i + 1) // n)) for i in range(n)]


@dataclass
class _Totals:
    """What one process (or the fleet) reported: since start, or over one report interval."""

    flushes: int = 0
    failed: int = 0
    generated: int = 0
    finished: int = 0
    rejected: int = 0
    slowest: float = 0.0  # the slowest tick, seconds
    late: int = 0  # ticks longer than the flush interval
    hot: dict[str, list[float]] = field(default_factory=dict)  # engine -> [waiting, running, kv]

    def add(self, other: dict[str, Any]) -> None:
        for name in ("flushes", "failed", "generated", "finished", "rejected", "late"):
            setattr(self, name, getattr(self, name) + int(other.get(name, 0)))
        self.slowest = max(self.slowest, float(other.get("slowest", 0.0)))
        self.hot.update(other.get("hot", {}))


def run_simulation(
    config: StatsConfig,
    opts: SimulateOptions,
    out: TextIO = sys.stdout,
    stop: threading.Event | None = None,
) -> int:
    """Run the fleet until *stop* is set (Ctrl-C and SIGTERM set it when this runs in the main
    thread) or ``opts.duration`` passes; returns the process exit code (0, or 1 when a process
    failed)."""
    from redis_stats.tools.stopping import stop_on_signals

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        with stop_on_signals(stop.set):
            return _Fleet(config, opts, out).run(stop)
    return _Fleet(config, opts, out).run(stop)


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


class _Fleet:
    """The processes of one simulation, their reports, and their end."""

    def __init__(self, config: StatsConfig, opts: SimulateOptions, out: TextIO) -> None:
        self.config = config
        self.opts = opts
        self.out = out
        self.children: list[subprocess.Popen[str]] = []
        self.parts = opts.parts()
        self.lock = threading.Lock()
        self.window = _Totals()  # since the last report
        self.final: dict[int, dict[str, Any]] = {}  # process -> its last line
        self.failed: list[str] = []
        self.said_slow: set[int] = set()
        self.readers: list[threading.Thread] = []

    def run(self, stop: threading.Event) -> int:
        from redis_stats.tools.simulate import FleetLoad

        opts = self.opts
        load = FleetLoad(opts.engines, period=opts.period, scale=opts.scale, hot_every=opts.hot_every)
        writers = opts.engines * opts.api_servers
        _say(
            self.out,
            f"simulating {opts.engines:,} engines x {opts.api_servers} API servers ({writers:,} writers "
            f"in {plural(len(self.parts), 'process', 'processes')}) into {self.config.safe_url}, namespace "
            f"{self.config.namespace!r}, model {opts.model!r}",
        )
        hot = load.hot()
        shown = ", ".join(str(e) for e in hot[:8]) + (", ..." if len(hot) > 8 else "")
        _say(
            self.out,
            f"  {plural(len(hot), 'hot engine')} ({shown}): their queue rises over a "
            f"{opts.period:g} s cycle, "
            f"then drains; the others run at 20-50 % of capacity (arrivals x{opts.scale:g})",
        )
        _say(
            self.out,
            f"  each process flushes its writers every {self.config.flush_interval:g} s "
            f"(REDIS_STATS_FLUSH_INTERVAL); Ctrl-C or SIGTERM stops them after each writer's last flush",
        )
        try:
            for index, engines in enumerate(self.parts):
                self.children.append(self._spawn(index, engines))
            self._wait(stop)
        finally:
            self._stop_children()
        return self._end()

    def _spawn(self, index: int, engines: list[int]) -> subprocess.Popen[str]:
        # The URL goes by environment, never argv (a command line is readable by every user of
        # the machine); the other REDIS_STATS_* variables are inherited as they are.
        env = dict(os.environ)
        env.update({ENV_PREFIX + "URL": self.config.url, ENV_PREFIX + "NAMESPACE": self.config.namespace})
        spec = {"index": index, "first": engines[0], "count": len(engines), "options": asdict(self.opts)}
        args = [sys.executable, "-m", "redis_stats.tools.fleet_sim", json.dumps(spec)]
        # Own session: a Ctrl-C in the terminal reaches this process only, which then stops each
        # child in order (their last flushes) instead of all of them dying at once; tied to this
        # process: none is left running when it is killed.
        proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=tied_to_me()
        )
        reader = threading.Thread(target=self._read, args=(index, proc), name=f"sim-{index}", daemon=True)
        reader.start()
        self.readers.append(reader)
        return proc

    def _read(self, index: int, proc: subprocess.Popen[str]) -> None:
        """One process's report lines (JSON, one a line), until it ends."""
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if "error" in report:
                    self.failed.append(f"process {index}: {report['error']}")
                elif report.get("done"):
                    self.final[index] = report
                else:
                    self.window.add(report)
                    if report.get("late") and index not in self.said_slow:
                        self.said_slow.add(index)  # once: the periodic lines count the late ticks
                        _say(self.out, _slow_line(index, self.parts[index], report, self.config))

    def _wait(self, stop: threading.Event) -> None:
        started = time.monotonic()
        end = None if self.opts.duration is None else started + self.opts.duration
        next_report = started + self.opts.report_interval
        while not stop.wait(0.2):
            now = time.monotonic()
            if end is not None and now >= end:
                return
            for index, child in enumerate(self.children):
                code = child.poll()
                if code is not None:
                    where = f"process {index} (engines {_span(self.parts[index])})"
                    with self.lock:
                        self.failed.append(f"{where} exited with code {code}")
                    return
            with self.lock:
                if self.failed:
                    return
                if now >= next_report:
                    window, self.window = self.window, _Totals()
                    _say(self.out, _report_line(now - started, window, self.config, self.opts))
                    next_report += self.opts.report_interval

    def _stop_children(self) -> None:
        """SIGTERM every process (each closes its writers: their last flushes), then wait."""
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CLOSE_WAIT
        for child in self.children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for reader in self.readers:
            reader.join(5)  # its process has ended: the rest of its lines are in the pipe

    def _end(self) -> int:
        total = _Totals()
        closed = unconfirmed = 0
        for report in self.final.values():
            total.add(report)
            closed += int(report.get("closed", 0))
            unconfirmed += int(report.get("unconfirmed", 0))
        missing = [i for i in range(len(self.children)) if i not in self.final]
        for problem in self.failed:
            _say(self.out, problem)
        confirmed = (
            "every last flush confirmed"
            if not unconfirmed
            else f"{unconfirmed:,} last flushes not confirmed by Redis: what they held is lost"
        )
        _say(
            self.out,
            f"simulate stopped: {closed:,} writers closed ({confirmed}); recorded "
            f"{total.generated:,} generation tokens, {total.finished:,} finished requests, "
            f"{total.rejected:,} rejected" + (f"; processes {missing} reported nothing" if missing else ""),
        )
        return 1 if self.failed or missing or unconfirmed else 0


def _span(engines: list[int]) -> str:
    return f"{engines[0]}..{engines[-1]}" if len(engines) > 1 else str(engines[0])


def _report_line(elapsed: float, window: _Totals, config: StatsConfig, opts: SimulateOptions) -> str:
    """One periodic line: what the fleet did over the last report interval."""
    per_s = window.generated / opts.report_interval
    hot = sorted(window.hot.items(), key=lambda kv: -kv[1][0])[:3]
    shown = "; ".join(f"engine {e}: {w:.0f} waiting, {r:.0f} running, KV {kv:.0%}" for e, (w, r, kv) in hot)
    return (
        f"[{elapsed:.0f} s] {window.flushes:,} flushes ({window.failed:,} failed), "
        f"{per_s:,.0f} generation tokens/s, {window.finished:,} requests finished, "
        f"{window.rejected:,} rejected; slowest tick {window.slowest:.2f} s of "
        f"{config.flush_interval:g} s ({window.late:,} late)" + (f"; {shown}" if shown else "")
    )


def _slow_line(index: int, engines: list[int], report: dict[str, Any], config: StatsConfig) -> str:
    return (
        f"process {index} (engines {_span(engines)}) is behind: a tick took {report['slowest']:.2f} s, "
        f"more than the {config.flush_interval:g} s flush interval, so its engines' updates come late; "
        "fewer --engines, more --processes (up to the cores), a lower --scale or a longer "
        "REDIS_STATS_FLUSH_INTERVAL"
    )


# -- one process ---------------------------------------------------------------------------------


class _Part:
    """The engines of one process: their simulations and writers, on one shared client."""

    def __init__(self, config: StatsConfig, opts: SimulateOptions, engines: list[int]) -> None:
        from redis_stats.connection import make_client
        from redis_stats.integrations.vllm import VllmRecorder
        from redis_stats.integrations.vllm.load import load_map_for
        from redis_stats.tools.simulate import FleetLoad, SimulatedEngine
        from redis_stats.writer import StatsWriter

        load = FleetLoad(opts.engines, period=opts.period, scale=opts.scale, hot_every=opts.hot_every)
        cache = load.cache_config()
        catalog = simulated_catalog()
        client = make_client(config)
        host = socket.gethostname()
        self.writers: list[Any] = []
        self.sims: list[SimulatedEngine] = []
        self.hot: list[SimulatedEngine] = []
        for e in engines:
            recorders = []
            # As the plugin's: max_running_requests from the engine's max_num_seqs (its profile's).
            scheduler = SimpleNamespace(max_num_seqs=load.profile(e).max_running)
            load_map = load_map_for(SimpleNamespace(scheduler_config=scheduler))
            endpoint = opts.endpoint_of(e)
            engine_config = config if endpoint is None else config.replace(endpoint=endpoint)
            for api in range(opts.api_servers):
                # As the vLLM plugin: role api<rank>, one owner for the API servers of one engine.
                writer = StatsWriter(
                    engine_config,
                    catalog,
                    engines=[e],
                    role=f"api{api}",
                    owner=f"{host}:simulate-{e}",
                    client=client,
                    start=False,
                    load=load_map,
                )
                recorder = VllmRecorder(writer, opts.model, [e], features=load.features())
                recorder.record_cache_config(cache)
                recorders.append(recorder)
                self.writers.append(writer)
            sim = SimulatedEngine(
                recorders,
                e,
                load.profile(e),
                seed=opts.seed * 1_000_003 + e,
                kv_capacity_tokens=load.kv_capacity_tokens,
            )
            self.sims.append(sim)
            if load.is_hot(e):
                self.hot.append(sim)
        self.reported = _Totals()
        self.pool = ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="simulate-flush")

    def tick(self, now: float) -> _Totals:
        """Step every engine to *now*, then flush every writer; what that added."""
        done = _Totals()
        before = [(s.generated, s.finished, s.rejected) for s in self.sims]
        for sim in self.sims:
            sim.step(now)
        # A few flushes at once: each waits for its round trip to Redis most of its time, and
        # one after the other a thousand of them took several seconds on a busy machine.
        for ok in self.pool.map(_flush, self.writers):
            if ok:
                done.flushes += 1
            else:
                done.failed += 1
        for sim, (g, f, r) in zip(self.sims, before):
            done.generated += sim.generated - g
            done.finished += sim.finished - f
            done.rejected += sim.rejected - r
        return done

    def hot_state(self) -> dict[str, list[float]]:
        return {str(s.engine): [s.waiting, s.running, s.kv_usage] for s in self.hot}

    def close(self) -> tuple[int, int]:
        """Close every writer (its last flush); (closed, unconfirmed). Once Redis fails to confirm
        one, the others get a short timeout: a dead Redis must not hold the stop for minutes."""
        self.pool.shutdown()
        unconfirmed = 0
        for writer in self.writers:
            if not writer.close(timeout=0.2 if unconfirmed else None):
                unconfirmed += 1
        return len(self.writers), unconfirmed


class _FirstWarnings(logging.Filter):
    """The first few writer warnings of a process: a thousand writers each log the same outage
    (the progress lines and the last line count failed and lost flushes). The end of an outage
    whose start was shown is shown too (redis_stats/outage.py: a start logged gets its end)."""

    SHOWN = 3

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0
        self.started: set[str] = set()  # the links whose outage start was shown

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        link, ended, _ = text.partition(" works again")
        if ended and link in self.started:
            self.started.discard(link)
            return True
        self.seen += 1
        if self.seen == self.SHOWN + 1:
            record.msg, record.args = "(the other writers' warnings of this process are left out)", ()
        elif self.seen <= self.SHOWN and "outage started" in text:
            self.started.add(text.partition(" failed (")[0])
        return self.seen <= self.SHOWN + 1


def _flush(writer: Any) -> bool:
    return bool(writer.flush())


def _emit(report: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def _ticks(interval: float, stop: threading.Event) -> Iterator[float]:
    """The start time of each tick, one per *interval* (a late tick is not made up for)."""
    due = time.monotonic()
    while not stop.is_set():
        yield due
        due += interval
        now = time.monotonic()
        if due < now:
            due = now
        stop.wait(due - now)


def run_part(
    config: StatsConfig, opts: SimulateOptions, engines: list[int], emit: Callable[[dict[str, Any]], None]
) -> None:
    """One process of the simulation, until SIGTERM (or Ctrl-C)."""
    from redis_stats.tools.stopping import stop_on_signals

    logging.getLogger("redis_stats.writer").addFilter(_FirstWarnings())
    stop = threading.Event()
    with stop_on_signals(stop.set):
        part = _Part(config, opts, engines)
        interval = config.flush_interval
        window, window_start = _Totals(), time.monotonic()
        for started in _ticks(interval, stop):
            done = part.tick(time.monotonic())
            took = time.monotonic() - started
            done.slowest = took
            done.late = int(took > interval)
            part.reported.add(asdict(done))
            window.add(asdict(done))
            if time.monotonic() - window_start >= 1.0:  # the parent sums them per report interval
                report = asdict(window)
                report["hot"] = part.hot_state()
                emit(report)
                window, window_start = _Totals(), time.monotonic()
        closed, unconfirmed = part.close()
        final = asdict(part.reported)
        final.update(done=True, closed=closed, unconfirmed=unconfirmed)
        emit(final)


def foreign_writers(config: StatsConfig) -> list[str]:
    """The writers of *config*'s namespace (live, stale or closed, until gc removes them) that no
    simulation started: their recorded owner is not a simulated engine's. A namespace that holds
    any is a real deployment's (or another program's), and simulated counters would stay in its
    totals for good."""
    from redis_stats.reader import StatsReader

    snap = StatsReader(config, simulated_catalog()).snapshot()
    return sorted(
        w for w, info in snap.writers.items() if not SIMULATED_OWNER.search(info.stats.get("owner", ""))
    )


def simulated_catalog() -> Catalog:
    """The simulated fleet's catalogue: vLLM's, with the cache configuration's labels that
    :meth:`FleetLoad.cache_config` writes (as the vLLM plugin takes them from vLLM)."""
    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.tools.simulate import FleetLoad

    return vllm_catalog(cache_config_labels=tuple(sorted(FleetLoad(1).cache_config())))


def totals_in_redis(config: StatsConfig) -> dict[str, float]:
    """The fleet's totals as a reader reads them: generation tokens, finished requests and
    rejections summed over every engine (what the end line of a run says it recorded)."""
    from redis_stats.reader import StatsReader

    snap = StatsReader(config, simulated_catalog()).snapshot()
    names = {
        "vllm:generation_tokens": "generated",
        "vllm:request_success": "finished",
        "vllm:admission_rejections": "rejected",
    }
    out = dict.fromkeys(names.values(), 0.0)
    for engine in snap.engines.values():
        for (name, _labels), value in engine.counters.items():
            if name in names:
                out[names[name]] += value
    return out


def _main() -> None:
    spec = json.loads(sys.argv[1])
    opts = SimulateOptions(**spec["options"])
    engines = list(range(spec["first"], spec["first"] + spec["count"]))
    try:
        config = StatsConfig.from_env()
        run_part(config, opts, engines, _emit)
    except Exception as exc:  # said to the parent, which prints it and stops the others
        from redis_stats.config import redact

        _emit({"error": f"{type(exc).__name__}: {redact(str(exc), os.environ.get(ENV_PREFIX + 'URL', ''))}"})
        raise SystemExit(1) from None


if __name__ == "__main__":
    _main()
