"""A writer process for the integration tests: N increments per series on its engines, then close.

Usage: python -m tests.helpers.writer_proc URL NAMESPACE ENGINES(comma) N [SPREAD_SECONDS]
Other settings come from REDIS_STATS_* variables (e.g. REDIS_STATS_WAIT_REPLICAS).
Exits 0 only if every update was confirmed by Redis.
"""

import sys
import time

from redis_stats import StatsConfig, StatsWriter
from tests.conftest import sample_catalog


def main() -> int:
    url, namespace, engines, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    engine_ids = [int(e) for e in engines.split(",")]
    spread = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    cfg = StatsConfig.from_env(url=url, namespace=namespace, flush_interval=0.05)
    writer = StatsWriter(cfg, sample_catalog(), engines=engine_ids, role="test")
    children = []
    for e in engine_ids:
        children.append(writer.counter("requests").labels(engine=e, reason="stop").inc)
        children.append(writer.counter("tokens").labels(engine=e).inc)
        children.append(writer.histogram("latency_seconds").labels(engine=e).observe)
    gauges = [writer.gauge("inflight").labels(engine=e) for e in engine_ids]
    for i in range(n):
        for record in children:
            record(0.3 if record.__name__ == "observe" else 1)
        if i % 1000 == 0:
            for g in gauges:
                g.set(1)
        if spread and i % 100 == 0:
            time.sleep(spread / (n / 100))
    ok = writer.close(timeout=60)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
