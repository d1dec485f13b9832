"""A writer process driven line by line on stdin, for the time tests: its flusher thread runs.

Usage: python -m tests.helpers.scripted_writer URL NAMESPACE ENGINE FLUSH_INTERVAL STALE_AFTER
``REDIS_STATS_TEST_SKEW`` (seconds) puts this process' wall clock (time.time) that far off.

Commands (each answered by one line once done):
  inc N        tokens of ENGINE += N                                   -> "ok"
  set V        the mostrecent gauge running of ENGINE := V             -> "ok"
  sync         wait until Redis confirmed everything recorded          -> "ok"
  inc-stop N   tokens += N, then SIGSTOP itself at once (before its next flush; answered "ok"
               once continued)
  close        close the writer (final flush); answers "closed True|False", then exits
It prints its writer id first.
"""

import os
import signal
import sys
import time

skew = float(os.environ.get("REDIS_STATS_TEST_SKEW", "0"))
if skew:
    _real = time.time
    time.time = lambda: _real() + skew  # before anything reads the clock

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from tests.conftest import sample_catalog  # noqa: E402


def main() -> int:
    url, namespace, engine = sys.argv[1], sys.argv[2], int(sys.argv[3])
    interval, stale = float(sys.argv[4]), float(sys.argv[5])
    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=interval, stale_after=stale)
    writer = StatsWriter(cfg, sample_catalog(), engines=[engine], role="scripted")
    tokens = writer.counter("tokens").labels(engine=engine)
    running = writer.gauge("running").labels(engine=engine)
    print(writer.writer_id, flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "inc":
            tokens.inc(float(arg))
        elif cmd == "set":
            running.set(float(arg))
        elif cmd == "sync":
            while writer.pending():
                time.sleep(0.005)
        elif cmd == "inc-stop":
            tokens.inc(float(arg))
            os.kill(os.getpid(), signal.SIGSTOP)
        elif cmd == "close":
            print(f"closed {writer.close(timeout=10)}", flush=True)
            return 0
        print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
