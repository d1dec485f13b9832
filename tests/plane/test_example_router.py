"""The example router (docs/examples/load_router.py) as N replicas, separate processes, booking
through the exporter's ``POST /bookings``: each sees the others' bookings and spreads its picks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.server import Exporter
from tests.conftest import ROOT
from tests.probes import until
from tests.server.test_load_feed import LOAD, catalog, record

pytestmark = pytest.mark.redis_server

EXAMPLE = ROOT / "docs" / "examples" / "load_router.py"


def test_three_replicas_of_the_example_router_book_as_one(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.2, stale_after=5.0)
    writer = StatsWriter(cfg, catalog(), engines=list(range(6)), role="fe", load=LOAD)
    for e in range(6):
        record(writer, e, 0, 0, 0.1)
    exporter = Exporter(
        StatsReader(cfg), port=0, load_refresh=0.02, bookings=True, insecure_private_views=True
    )
    exporter.start()
    reader = StatsReader(cfg)
    try:
        assert until(lambda: len(reader.load().engines) == 6)
        args = [
            sys.executable,
            str(EXAMPLE),
            exporter.url,
            "--poll",
            "--book",
            "--count",
            "4",
            "--every",
            "0.15",
        ]
        procs = [subprocess.Popen([*args], stdout=subprocess.PIPE, text=True) for _ in range(3)]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        picks = [int(line.split()[3].rstrip(";")) for out in outs for line in out.splitlines()]
        assert len(picks) == 12
        # each replica sees the others' bookings, not only its own (at most 4): its last look
        # counts more than it booked itself
        seen = [
            float(line.split("expected in flight ")[1].split(",")[0])
            for out in outs
            for line in out.splitlines()
        ]
        assert max(seen) > 4, outs
        assert max(picks.count(e) for e in range(6)) <= 4, picks  # spread, not piled on one engine
        assert reader.load().to_dict()["fleet"]["booked"]["sum"] == 0  # each released its lease on exit
    finally:
        exporter.close()
        writer.close()
