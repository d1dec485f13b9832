"""``redis-stats demo``: a simulated multi-node fleet writing to one Redis, one log, one /metrics.

The demo starts (unless given ``--redis-url``) a private Redis on a free loopback port with its
data in a temp dir, then N "nodes" in external-LB style — node R serves engine rank R — each with
several API-server processes that record vLLM-shaped load through the real vLLM recorder. The
engines are served two by two behind one endpoint (``demo-<R // 2>:8000``, as the writers of a
data-parallel pair behind one API server address store it; ``--engines-per-endpoint``), so every
router view has something to answer. Every API server runs a reporter; only API server 0 of the
node with engine 0 prints. The demo itself serves the Redis view (``/metrics``, ``/snapshot``,
``/load``, the routers' views, the live page). Ctrl-C stops every process it started and removes
its temp dir.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from redis_stats.config import ENV_PREFIX, StatsConfig, mask_url
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY
from redis_stats.reader import StatsReader
from redis_stats.server import Exporter
from redis_stats.tools.embedded import EmbeddedRedis, tied_to_me
from redis_stats.tools.fleet_sim import simulated_catalog
from redis_stats.tools.simulate import FleetLoad, LoadProfile
from redis_stats.tools.stopping import stop_on_signals

__all__ = ["DemoOptions", "command_line", "node_profile", "run_demo", "run_node"]

URL_ENV = ENV_PREFIX + "URL"  # how the demo hands the Redis URL to its node processes


@dataclass(frozen=True)
class DemoOptions:
    """What ``redis-stats demo`` runs."""

    redis_url: str | None = None
    nodes: int = 2
    first_engine: int = 0
    api_servers: int = 2
    port: int = 9400
    host: str = "127.0.0.1"
    namespace: str = "demo"
    duration: float | None = None
    log_interval: float = 5.0
    flush_interval: float = 0.5
    leader: str = "rank0"
    restart_after: float = 20.0
    """Seconds after a node process dies before the demo starts it again (0: never)."""
    engines_per_endpoint: int = 2
    """Engines served behind one endpoint (``demo-<i>:8000``): what the routers' views
    (``/get_load``, ``/v1/loads``) answer by; 0: no endpoint stored."""

    def endpoint_of(self, engine: int) -> str | None:
        """The endpoint engine *engine*'s writers store (None with ``engines_per_endpoint`` 0)."""
        n = self.engines_per_endpoint
        return f"demo-{engine // n}:8000" if n else None

    def endpoints(self) -> list[str]:
        """Every endpoint of the demo's engines, in order."""
        engines = range(self.first_engine, self.first_engine + self.nodes)
        return sorted({e for e in map(self.endpoint_of, engines) if e is not None})


def run_demo(
    opts: DemoOptions, out: TextIO = sys.stdout, ready: Callable[[Exporter], None] | None = None
) -> int:
    """Run the demo until Ctrl-C or SIGTERM (or ``opts.duration``); returns a process exit code."""
    stop = threading.Event()
    with stop_on_signals(stop.set):  # also while it shuts down: a second Ctrl-C cannot cut that short
        return _run(opts, out, ready, stop)


def _run(
    opts: DemoOptions, out: TextIO, ready: Callable[[Exporter], None] | None, stop: threading.Event
) -> int:
    """The demo's run: Redis, the node processes and the exporter, until *stop* (or the duration)."""
    server: EmbeddedRedis | None = None
    fleet: _Fleet | None = None
    exporter: Exporter | None = None
    try:
        _check_port(opts.host, opts.port)  # before Redis and the node processes start
        url = opts.redis_url
        if url is None:
            server = EmbeddedRedis().start()
            url = server.url
            _say(
                out,
                f"started a private {os.path.basename(server.binary)} at {mask_url(url)} "
                f"(data in {server.dir})",
            )
        config = _demo_config(opts, url)
        fleet = _Fleet(opts, config, out)
        fleet.start()
        reader = StatsReader(config, simulated_catalog())
        exporter = Exporter(
            reader, host=opts.host, port=opts.port, summary=VLLM_FLEET_SUMMARY, history=VLLM_PAGE_HISTORY
        ).start()
        _say(out, _usage(opts, exporter.url, url))
        if ready is not None:
            ready(exporter)
        deadline = None if opts.duration is None else time.monotonic() + opts.duration
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            fleet.watch(time.monotonic())
            stop.wait(0.2)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        _shut_down(exporter, fleet, server)
        if server is not None or fleet is not None:  # else it started nothing (the port refused)
            _say(out, "demo stopped: every process it started has exited and its temp dir is removed")


def _shut_down(exporter: Exporter | None, fleet: _Fleet | None, server: EmbeddedRedis | None) -> None:
    """Stop what the demo started, in order: the view, the nodes (their last flush), then Redis."""
    if exporter is not None:
        exporter.close()
    if fleet is not None:
        fleet.stop()
    if server is not None:
        server.close()


def _say(out: TextIO, text: str) -> None:
    # Flushed at once: the demo's lines interleave with its node processes' log lines.
    print(text, file=out, flush=True)


def _demo_config(opts: DemoOptions, url: str) -> StatsConfig:
    return StatsConfig(
        url=url,
        namespace=opts.namespace,
        flush_interval=opts.flush_interval,
        log_interval=opts.log_interval,
        stale_after=max(10.0, 4 * opts.flush_interval),
        leader=opts.leader,
    )


def _usage(opts: DemoOptions, view: str, url: str) -> str:
    """What to try once the fleet runs: the Redis view's URLs, what routers read (each view with
    an endpoint of this fleet), and the commands of a new shell."""
    return (
        f"Redis view of every engine: {view}/metrics\n"
        f"  try: curl -s {view}/metrics"
        " | grep -E '^vllm:(generation_tokens_total|num_requests_running)'\n"
        f"       curl -s {view}/snapshot | python3 -m json.tool | head -40\n"
        f"  live page: {view}/\n"
        f"{_router_usage(opts, view)}"
        f"  in another terminal (the URL by environment, not on the command line{_own(url)}):\n"
        f"       export REDIS_STATS_URL='{mask_url(url)}' REDIS_STATS_NAMESPACE={opts.namespace}\n"
        f"       {command_line()} top\n"
        f"       {command_line()} inspect\n"
        f"periodic log lines ({_printer(opts)}) every {opts.log_interval:g} s; Ctrl-C stops"
    )


def _router_usage(opts: DemoOptions, view: str) -> str:
    """The routers' views on this fleet (docs/routers.md), one command each."""
    lines = [
        f"curl -s {view}/load | python3 -m json.tool | head -30   # every engine's load",
        f"curl -N -H 'Accept: text/event-stream' {view}/watch   # each change as it comes",
        f"curl -s {view}/pool   # llm-d's pool averages",
    ]
    endpoints = opts.endpoints()
    if endpoints:
        first = endpoints[0]
        engines = [
            e
            for e in range(opts.first_engine, opts.first_engine + opts.nodes)
            if opts.endpoint_of(e) == first
        ]
        head = (
            f"  what routers read (engines {', '.join(map(str, engines))} behind endpoint {first}; "
            f"endpoints: {' '.join(endpoints)}):\n"
        )
        lines[:0] = [
            f"curl -s '{view}/get_load?endpoint={first}'   # vllm-router's {{\"load\": N}}",
            f"curl -s '{view}/v1/loads?endpoint={first}'   # SGLang's gateway: one entry per rank",
            f"curl -s {view}/loads   # every endpoint's ranks",
        ]
    else:
        head = "  what routers read (no endpoint stored: --engines-per-endpoint 0):\n"
    example = _example_router()
    if example is not None:
        lines.append(f"python3 {example} {view}   # a router following /watch")
    return head + "".join(f"       {line}\n" for line in lines)


def _example_router() -> str | None:
    """Where docs/examples/load_router.py is (a checkout's; a wheel does not ship it): relative
    to the working directory when under it."""
    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "load_router.py"
    if not path.is_file():
        return None
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class _Fleet:
    """The demo's node processes, one per (engine, API server) slot; a dead one starts again
    ``opts.restart_after`` seconds later (never with 0)."""

    def __init__(self, opts: DemoOptions, config: StatsConfig, out: TextIO) -> None:
        self.opts = opts
        self.config = config
        self.out = out
        self.slots = [
            (opts.first_engine + node, api) for node in range(opts.nodes) for api in range(opts.api_servers)
        ]
        self.children: list[subprocess.Popen[bytes]] = []
        self.restart_at: dict[int, float] = {}  # slot -> when its dead process starts again
        self.killed_at: dict[int, float] = {}  # slot -> when its process last died without closing

    def start(self) -> None:
        """Start every slot's process (each kept as it starts: :meth:`stop` stops what did)."""
        opts = self.opts
        for engine, api in self.slots:
            self.children.append(_spawn_node(self.config, opts, engine, api))
        last_engine = opts.first_engine + opts.nodes - 1
        processes = _plural(len(self.children), "process", "processes")
        _say(
            self.out,
            f"simulating {_plural(opts.nodes, 'node')} x {_plural(opts.api_servers, 'API server')} "
            f"({processes}, engines {opts.first_engine}..{last_engine})",
        )
        # The log lines show only the printer's pid: each node's, to kill it and watch failover.
        for node in range(opts.first_engine, last_engine + 1):
            pids = " ".join(str(c.pid) for c, (engine, _) in zip(self.children, self.slots) if engine == node)
            _say(self.out, f"  node {node}: kill {pids} to stop it")

    def watch(self, now: float) -> None:
        """Report each process that died since the last call; restart those whose time has come."""
        for i, child in enumerate(self.children):
            code = child.poll()
            if code is None:
                continue
            if i not in self.restart_at:
                self._exited(i, code, now)
            elif now >= self.restart_at[i]:
                self._restart(i)

    def _exited(self, i: int, code: int, now: float) -> None:
        opts = self.opts
        engine, api = self.slots[i]
        if code < 0:  # killed by a signal (Popen's code is minus its number): no last flush
            self.killed_at[i] = now
        then = (
            f"restarting it in {opts.restart_after:g} s"
            if opts.restart_after > 0
            else "not restarting it (--restart-after 0)"
        )
        _say(
            self.out,
            f"node {engine} API server {api} (pid {self.children[i].pid}) exited with code {code}; "
            f"the others go on; {self._effect(engine, api, now)}; {then}",
        )
        self.restart_at[i] = now + opts.restart_after if opts.restart_after > 0 else float("inf")

    def _effect(self, engine: int, api: int, now: float) -> str:
        # The rest of the fleet goes on. A process that exited (SIGTERM: `kill <pid>`, or an
        # error) closed its writer on the way out, which marks it closed in Redis: once no API
        # server of its node is left, its engine is DOWN at once. One killed by a signal it
        # cannot handle (kill -9) made no last flush: its engine stays up until that heartbeat
        # is stale_after old. A lease leader is replaced.
        slots = [j for j, (e, _) in enumerate(self.slots) if e == engine]
        if any(self.children[j].poll() is None for j in slots):
            effect = f"engine {engine} goes on through its other API servers"
        else:
            killed = max((self.killed_at.get(j, -math.inf) for j in slots), default=-math.inf)
            left = killed + self.config.stale_after - now
            effect = (
                f"engine {engine} shows DOWN in {left:.0f} s, when the heartbeat of an API server "
                "killed without its last flush (kill -9) is stale_after old"
                if left > 0
                else f"its writer closed, so engine {engine} shows DOWN now"
            )
        if self.config.leader == "rank0" and (engine, api) == (0, 0):
            effect += "; it printed the log, which pauses until it is back (--leader lease fails over)"
        return effect

    def _restart(self, i: int) -> None:
        engine, api = self.slots[i]
        self.children[i] = _spawn_node(self.config, self.opts, engine, api)
        del self.restart_at[i]
        _say(self.out, f"restarted node {engine} API server {api} (pid {self.children[i].pid})")

    def stop(self) -> None:
        """SIGTERM every live process (each flushes its last updates), then wait; kill a hung one."""
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {plural or word + 's'}"


def command_line() -> str:
    """How a new shell runs this ``redis-stats``: the bare name only when this installation is
    not a virtualenv's and PATH finds this very script; else the script's absolute path (a new
    terminal has not activated the virtualenv, e.g. ``make demo``'s ``.venv``, nor is it in this
    directory). Without a script beside the interpreter, ``python -m redis_stats``."""
    script = os.path.join(os.path.dirname(sys.executable), "redis-stats")
    if not os.path.isfile(script):
        return f"{sys.executable} -m redis_stats"
    found = shutil.which("redis-stats")
    in_venv = sys.prefix != sys.base_prefix
    if not in_venv and found is not None and os.path.realpath(found) == os.path.realpath(script):
        return "redis-stats"
    return os.path.abspath(script)


def _own(url: str) -> str:
    return "; put your password where *** is" if mask_url(url) != url else ""


def _printer(opts: DemoOptions) -> str:
    if opts.leader == "lease":
        return "from whichever process holds the log lease; kill it and another takes over"
    return f"from node {opts.first_engine}, API server 0" if opts.first_engine == 0 else "from node 0"


def _check_port(host: str, port: int) -> None:
    """Raise OSError now if *host* and *port* cannot be served, rather than after Redis and the
    nodes start (port 0 too: the address may be no name or no interface of this host)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        # As http.server binds (allow_reuse_address): a port in TIME_WAIT is not "taken".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


def _spawn_node(config: StatsConfig, opts: DemoOptions, node: int, api: int) -> subprocess.Popen[bytes]:
    # The URL goes by environment, never argv: a command line is readable by every user of the
    # machine (ps, /proc/<pid>/cmdline), a process' environment only by its owner.
    env = {**os.environ, URL_ENV: config.url}
    args = [
        sys.executable,
        "-m",
        "redis_stats.tools.demo",
        config.namespace,
        str(node),
        str(api),
        str(config.flush_interval),
        str(config.log_interval),
        str(config.stale_after),
        config.leader,
        str(opts.api_servers),
        str(opts.first_engine + opts.nodes),
        opts.endpoint_of(node) or "",
    ]
    # Own process group: a Ctrl-C in the terminal reaches the demo, which then stops its children
    # in order (flushing their last updates) instead of all of them dying at once; and tied to
    # the demo: none is left running when the demo is killed (SIGKILL).
    return subprocess.Popen(args, start_new_session=True, env=env, preexec_fn=tied_to_me())


def node_profile(node: int, api_servers: int, fleet_size: int) -> LoadProfile:
    """The load one of the *api_servers* API-server processes of *node* simulates: its share of
    the engine's load in a fleet of *fleet_size* engines (:class:`FleetLoad`, as
    ``redis-stats simulate``: one or two hot engines whose queue rises and drains, the others
    steady below capacity)."""
    return FleetLoad(max(fleet_size, node + 1)).profile(node).share(1 / api_servers)


def run_node(
    url: str,
    namespace: str,
    node: int,
    api: int,
    flush_interval: float,
    log_interval: float,
    stale_after: float,
    leader_mode: str = "rank0",
    api_servers: int = 1,
    fleet_size: int = 1,
    endpoint: str | None = None,
) -> None:
    """One simulated API server of node *node* (engine rank *node*, served behind *endpoint*),
    until SIGTERM."""
    from redis_stats.connection import make_client
    from redis_stats.integrations.vllm import VllmRecorder
    from redis_stats.integrations.vllm.logline import VllmLogLines
    from redis_stats.leader import make_leader
    from redis_stats.reporting import StatsReporter
    from redis_stats.tools.simulate import SimulatedApiServer
    from redis_stats.writer import StatsWriter

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s [node{node}/api{api} pid=%(process)d] %(message)s", "%H:%M:%S")
    )
    logger = logging.getLogger("redis_stats.demo.log")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    config = StatsConfig(
        url=url,
        namespace=namespace,
        flush_interval=flush_interval,
        log_interval=log_interval,
        stale_after=stale_after,
        leader=leader_mode,
        endpoint=endpoint or None,
    )
    catalog = simulated_catalog()
    writer = StatsWriter(config, catalog, engines=[node], role=f"node{node}-api{api}", load=VLLM_LOAD)
    load = FleetLoad(max(fleet_size, node + 1))
    recorder = VllmRecorder(writer, "demo-model", [node], features=load.features())
    recorder.record_cache_config(load.cache_config())  # the engine's whole KV cache, for /load
    share = 1 / api_servers
    sim = SimulatedApiServer(
        recorder,
        node,
        node_profile(node, api_servers, fleet_size),
        seed=node * 100 + api,
        kv_capacity_tokens=max(1, int(load.kv_capacity_tokens * share)),
    )
    leader = make_leader(config, make_client(config), [node], process_rank=api, holder=writer.writer_id)
    reporter = StatsReporter(
        StatsReader(config, catalog), leader, lines=VllmLogLines(), interval=log_interval, logger=logger
    )
    # The baseline read now, so the first line comes one interval after start (not two).
    reporter.tick()
    reporter.start()
    stop = threading.Event()
    try:
        with stop_on_signals(stop.set):
            sim.run(stop)
    finally:
        reporter.close()
        writer.close()


if __name__ == "__main__":
    run_node(
        os.environ[URL_ENV],
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        float(sys.argv[4]),
        float(sys.argv[5]),
        float(sys.argv[6]),
        sys.argv[7] if len(sys.argv) > 7 else "rank0",
        int(sys.argv[8]) if len(sys.argv) > 8 else 1,
        int(sys.argv[9]) if len(sys.argv) > 9 else 1,
        sys.argv[10] if len(sys.argv) > 10 else None,
    )
