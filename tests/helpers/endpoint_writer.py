"""A writer process behind one endpoint, for the end-to-end alert and HA tests: records a little on
each of its engines every 0.1 s and flushes every 0.25 s (``stale_after`` 2 s), until SIGTERM
(closes cleanly: a stop on purpose) or SIGKILL (a crash). Writes ``ready`` to stdout once its
first flush is confirmed.

Usage: python -m tests.helpers.endpoint_writer URL NAMESPACE ENGINES ENDPOINT
  (ENGINES: comma-separated; ENDPOINT: an endpoint id, or "-" for none)
"""

from __future__ import annotations

import signal
import sys
import threading

from redis_stats import StatsConfig, StatsWriter
from tests.conftest import sample_catalog


def main() -> None:
    url, namespace, engines_text, endpoint = sys.argv[1:5]
    engines = [int(e) for e in engines_text.split(",")]
    config = StatsConfig(
        url=url,
        namespace=namespace,
        flush_interval=0.25,
        stale_after=2.0,
        endpoint=None if endpoint == "-" else endpoint,
    )
    writer = StatsWriter(config, sample_catalog(), engines=engines)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    requests = [writer.counter("requests").labels(engine=e, reason="stop") for e in engines]
    running = [writer.gauge("running").labels(engine=e) for e in engines]
    ready = False
    while not stop.wait(0.1):
        for r in requests:
            r.inc()
        for g in running:
            g.set(3)
        if not ready and writer.flush():
            ready = True
            print("ready", flush=True)
    writer.close()


if __name__ == "__main__":
    main()
