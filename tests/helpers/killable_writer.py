"""A writer process for the SIGKILL test: observes 1.0 as fast as it can, flushing every 10 ms,
and sets a gauge; prints its writer id, then runs until killed.

Usage: python -m tests.helpers.killable_writer URL NAMESPACE ENGINE
"""

import sys

from redis_stats import StatsConfig, StatsWriter
from tests.conftest import sample_catalog


def main() -> None:
    url, namespace, engine = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=0.01, stale_after=1.0)
    writer = StatsWriter(cfg, sample_catalog(), engines=[engine], role="victim")
    print(writer.writer_id, flush=True)
    observe = writer.histogram("latency_seconds").labels(engine=engine).observe
    writer.gauge("running").labels(engine=engine).set(42)
    while True:
        for _ in range(100):
            observe(1.0)


if __name__ == "__main__":
    main()
