"""A writer process for the SIGKILL test: observes 1.0 as fast as it can, flushing every 10 ms,
and sets a gauge; prints its writer id, then runs until killed.

Usage: python -m tests.helpers.killable_writer URL NAMESPACE ENGINE
"""

import subprocess
import sys

from redis_stats import StatsConfig, StatsWriter
from tests.conftest import PYTHON, ROOT, sample_catalog


def spawn(
    url: str, namespace: str, engines: list[int], env: dict[str, str]
) -> tuple[list[subprocess.Popen], list[str]]:
    """One writer process per engine of *engines* (started as the module is run below), and their
    writer ids (each prints its own once it is made)."""
    procs = [
        subprocess.Popen(
            [PYTHON, "-m", "tests.helpers.killable_writer", url, namespace, str(e)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for e in engines
    ]
    assert all(p.stdout is not None for p in procs)
    return procs, [p.stdout.readline().strip() for p in procs]  # type: ignore[union-attr]


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
