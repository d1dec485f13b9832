"""One "node" for the reporter tests: engine RANK with a synthetic load at known token rates,
and a reporter that prints only while it holds the lease.

Usage: python -m tests.helpers.node_proc URL NAMESPACE RANK PROMPT_RATE GEN_RATE INTERVAL LEASE_TTL
Lines go to stdout as "<unix time> <pid> <message>".
"""

import logging
import sys
import time

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.connection import make_client
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.logline import VllmLogLines
from redis_stats.keys import Keys
from redis_stats.leader import LeaseLeader
from redis_stats.reporting import StatsReporter
from redis_stats.writer import new_writer_id
from tests.vllm_shapes import iteration, scheduler


def main() -> None:
    url, namespace, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prompt_rate, gen_rate = float(sys.argv[4]), float(sys.argv[5])
    interval, ttl = float(sys.argv[6]), float(sys.argv[7])
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(created).3f %(process)d %(message)s"))
    logger = logging.getLogger("node")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    cfg = StatsConfig(url=url, namespace=namespace, flush_interval=0.02, stale_after=5)
    cat = vllm_catalog()
    writer = StatsWriter(cfg, cat, engines=[rank], role=f"node{rank}")
    recorder = VllmRecorder(writer, "m", [rank])
    leader = LeaseLeader(make_client(cfg), Keys(namespace), new_writer_id("reporter"), ttl=ttl)
    lines = VllmLogLines()
    reporter = StatsReporter(StatsReader(cfg, cat), leader, lines=lines, interval=interval, logger=logger)
    reporter.start()
    print(f"{time.time():.3f} ready", flush=True)
    start = time.monotonic()
    sent_p = sent_g = 0
    while True:  # until killed
        elapsed = time.monotonic() - start
        due_p, due_g = int(prompt_rate * elapsed) - sent_p, int(gen_rate * elapsed) - sent_g
        sent_p += due_p
        sent_g += due_g
        recorder.record(
            scheduler(running=rank + 1, waiting=rank, kv=0.1 * (rank + 1)),
            iteration(prompt=due_p, generation=due_g),
            engine_idx=rank,
        )
        time.sleep(0.01)


if __name__ == "__main__":
    main()
