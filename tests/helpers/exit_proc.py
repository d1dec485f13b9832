"""Records into a writer, then exits without calling close(): the interpreter's exit does.

Usage: python -m tests.helpers.exit_proc URL NAMESPACE
Prints ``exiting <time.time()>`` just before the interpreter starts to exit.
"""

import sys
import time

from redis_stats import StatsConfig, StatsWriter
from tests.conftest import sample_catalog


def main() -> int:
    cfg = StatsConfig.from_env(url=sys.argv[1], namespace=sys.argv[2], flush_interval=0.05)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0])
    tokens = writer.counter("tokens").labels(engine=0)
    for _ in range(1000):
        tokens.inc()
    time.sleep(0.2)  # the flusher is now waiting on the (stopped) server
    print(f"exiting {time.time()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
