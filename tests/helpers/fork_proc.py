"""A writer process that forks while it records (or while its flusher waits on Redis).

Usage: python -m tests.helpers.fork_proc URL NAMESPACE MODE N CHILDREN

MODE ``recording``: two threads of the parent record without pause while the children are
forked. MODE ``flushing``: the children are forked while the parent's flusher holds its flush
lock, waiting for a reply (point URL at a slow proxy). Each child records N updates, through a
child bound before the fork and through a new binding, then returns: the interpreter's exit
closes its writer. Prints one JSON line: what the parent recorded, and each child's exit code
and lifetime. Exits 0 if the parent's close confirmed everything.
"""

import json
import os
import sys
import threading
import time

from redis_stats import StatsConfig, StatsWriter
from tests.conftest import sample_catalog


def main() -> int:
    url, namespace, mode = sys.argv[1:4]
    n, n_children = int(sys.argv[4]), int(sys.argv[5])
    cfg = StatsConfig.from_env(url=url, namespace=namespace, flush_interval=0.05)
    writer = StatsWriter(cfg, sample_catalog(), engines=[0], role="fork")
    tokens = writer.counter("tokens").labels(engine=0)  # bound before the fork
    latency = writer.histogram("latency_seconds").labels(engine=0)
    running = writer.gauge("inflight").labels(engine=0)
    running.set(5)  # the parent's value: a child must not send it as its own
    sent = [0, 0]
    stop = threading.Event()

    def record(i: int) -> None:
        while not stop.is_set():
            tokens.inc()
            latency.observe(0.3)
            sent[i] += 1

    threads = [threading.Thread(target=record, args=(i,)) for i in range(2)] if mode == "recording" else []
    for t in threads:
        t.start()
    time.sleep(0.2)
    children = {}
    for _ in range(n_children):
        if mode == "flushing":
            deadline = time.monotonic() + 10
            while not writer._flush_lock.locked() and time.monotonic() < deadline:
                time.sleep(0.001)
            assert writer._flush_lock.locked(), "the flusher never held its lock"
            tokens.inc(0)  # keep something pending so that the next flush waits too
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: record, then let the interpreter's exit close the writer
            for _ in range(n):
                tokens.inc()  # bound before the fork: counts for the child
                latency.observe(0.3)
                writer.counter("requests").labels(engine=0, reason="child").inc()  # bound after
            running.set(1)
            sys.stdout.flush()
            return 0
        children[pid] = started
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    exits = []
    for pid, started in children.items():
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                exits.append({"code": code, "seconds": time.monotonic() - started})
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                exits.append({"code": "hung", "seconds": time.monotonic() - started})
                break
            time.sleep(0.01)
    ok = writer.close(timeout=30)
    print(json.dumps({"parent_sent": sum(sent), "children": exits, "parent_closed": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
