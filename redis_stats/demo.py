"""``redis-stats demo``: a simulated multi-node fleet writing to one Redis, one log, one /metrics.

The demo starts (unless given ``--redis-url``) a private Redis on a free loopback port with its
data in a temp dir, then N "nodes" in external-LB style — node R serves engine rank R — each with
several API-server processes that record vLLM-shaped load through the real vLLM recorder. Every
API server runs a reporter; only API server 0 of the node with engine 0 prints. The demo itself
serves the Redis view (``/metrics``, ``/snapshot``, ``/healthz``). Ctrl-C stops every process it
started and removes its temp dir.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from .config import ENV_PREFIX, StatsConfig, mask_url
from .embedded import EmbeddedRedis
from .exporter import Exporter
from .integrations.vllm import vllm_catalog
from .reader import StatsReader

__all__ = ["DemoOptions", "run_demo", "run_node"]

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


def run_demo(
    opts: DemoOptions, out: TextIO = sys.stdout, ready: Callable[[Exporter], None] | None = None
) -> int:
    """Run the demo until Ctrl-C (or ``opts.duration``); returns a process exit code."""
    server: EmbeddedRedis | None = None
    children: list[subprocess.Popen[bytes]] = []
    exporter: Exporter | None = None
    stop = threading.Event()
    # Ctrl-C and SIGTERM both mean "stop cleanly" (SIGINT is handled explicitly: a shell may have
    # started the demo with SIGINT ignored).
    previous_handlers = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        url = opts.redis_url
        if url is None:
            server = EmbeddedRedis().start()
            url = server.url
            print(
                f"started a private {os.path.basename(server.binary)} at {mask_url(url)} "
                f"(data in {server.dir})",
                file=out,
                flush=True,
            )
        config = StatsConfig(
            url=url,
            namespace=opts.namespace,
            flush_interval=opts.flush_interval,
            log_interval=opts.log_interval,
            stale_after=max(10.0, 4 * opts.flush_interval),
        )
        for node in range(opts.nodes):
            for api in range(opts.api_servers):
                children.append(_spawn_node(config, node, api, opts.api_servers))
        print(
            f"simulating {opts.nodes} nodes x {opts.api_servers} API servers "
            f"({len(children)} processes, engines 0..{opts.nodes - 1})",
            file=out,
            flush=True,
        )
        exporter = Exporter(StatsReader(config, vllm_catalog()), host=opts.host, port=opts.port).start()
        print(
            f"Redis view of every engine: {exporter.url}/metrics\n"
            f"  try: curl -s {exporter.url}/metrics"
            " | grep -E '^vllm:(generation_tokens_total|num_requests_running)'\n"
            f"       curl -s {exporter.url}/snapshot | python3 -m json.tool | head -40\n"
            f"periodic log lines (from node 0, API server 0) every {opts.log_interval:g} s; Ctrl-C stops",
            file=out,
            flush=True,
        )
        if ready is not None:
            ready(exporter)
        deadline = None if opts.duration is None else time.monotonic() + opts.duration
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            if any(c.poll() is not None for c in children):
                print("a node process exited unexpectedly; stopping", file=out, flush=True)
                return 1
            stop.wait(0.2)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if exporter is not None:
            exporter.close()
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if server is not None:
            server.close()
        print(
            "demo stopped: every process it started has exited and its temp dir is removed",
            file=out,
            flush=True,
        )


def _spawn_node(config: StatsConfig, node: int, api: int, api_servers: int) -> subprocess.Popen[bytes]:
    # The URL goes by environment, never argv: a command line is readable by every user of the
    # machine (ps, /proc/<pid>/cmdline), a process' environment only by its owner.
    env = {**os.environ, URL_ENV: config.url}
    args = [
        sys.executable,
        "-m",
        "redis_stats.demo",
        config.namespace,
        str(node),
        str(api),
        str(config.flush_interval),
        str(config.log_interval),
        str(config.stale_after),
    ]
    # Own process group: a Ctrl-C in the terminal reaches the demo, which then stops its children
    # in order (flushing their last updates) instead of all of them dying at once.
    return subprocess.Popen(args, start_new_session=True, env=env)


def run_node(
    url: str,
    namespace: str,
    node: int,
    api: int,
    flush_interval: float,
    log_interval: float,
    stale_after: float,
) -> None:
    """One simulated API server of node *node* (engine rank *node*), until SIGTERM."""
    from .connection import make_client
    from .integrations.vllm import VllmRecorder
    from .leader import make_leader
    from .reporter import StatsReporter
    from .simulate import LoadProfile, SimulatedApiServer
    from .writer import StatsWriter

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
    )
    catalog = vllm_catalog()
    writer = StatsWriter(config, catalog, engines=[node], role=f"node{node}-api{api}")
    recorder = VllmRecorder(writer, "demo-model", [node])
    profile = LoadProfile(arrivals_per_s=2.0 + node, output_tokens=(16, 128 + 64 * node))
    sim = SimulatedApiServer(recorder, node, profile, seed=node * 100 + api)
    leader = make_leader(config, make_client(config), [node], process_rank=api, holder=writer.writer_id)
    reporter = StatsReporter(StatsReader(config, catalog), leader, interval=log_interval, logger=logger)
    reporter.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
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
    )
