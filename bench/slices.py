"""Bounded scrapes: ``/metrics?slice=i/N`` at N engines x 2 writers with the full vLLM catalogue.

Fills one private redis-server as ``bench/scrape_full.py`` does (simulated vLLM traffic through
``VllmRecorder``, 2 API-server writers per engine, one flush each), then, for the whole view and
for each of 4 slices, through the exporter's own views in process (``exporter.app(request)``:
the body Prometheus gets, 0.0.4 text): the body's size (uncompressed: what a scrape limit such as
VictoriaMetrics' 16 MiB counts), the bytes Redis returned for it and the time to build it (best
of ``--rounds``). The slices' bodies together must hold every sample of the whole body once
(checked here too).

Usage: python bench/slices.py [--engines 64,1024] [--slices 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scrape_full import _imports, fill, reply_bytes  # noqa: E402

from redis_stats.prometheus.filters import PER_SCRAPE  # noqa: E402
from redis_stats.reader import EngineSlice  # noqa: E402
from redis_stats.server import Exporter  # noqa: E402
from redis_stats.server.http import Request  # noqa: E402

MIB = 1 << 20


def samples(text: str) -> Counter[str]:
    return Counter(
        line.rsplit(" ", 1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#") and not line.startswith(PER_SCRAPE)
    )


def measure(rs: Any, url: str, engines: int, slices: int, rounds: int) -> dict[str, Any]:
    namespace = f"slices{engines}-{int(time.time())}"
    made = fill(rs, url, namespace, engines, 2)
    cfg = rs.StatsConfig(url=url, namespace=namespace, socket_timeout_ms=30_000)
    reader = rs.StatsReader(cfg, rs.vllm_catalog())
    exporter = Exporter(reader, port=0)
    try:
        rows = []
        for part in [None, *(EngineSlice(i, slices) for i in range(slices))]:
            request = Request("GET", "/metrics", "" if part is None else f"slice={part}")
            best, body = float("inf"), b""
            for _ in range(rounds):
                t0 = time.perf_counter()
                body = exporter.app(request).body
                best = min(best, time.perf_counter() - t0)
            sliced_reader = reader if part is None else rs.StatsReader(cfg, rs.vllm_catalog())
            rows.append(
                {
                    "slice": "whole" if part is None else str(part),
                    "body_mib": len(body) / MIB,
                    "redis_reply_mib": reply_bytes(sliced_reader.read(part)) / MIB,
                    "build_ms": best * 1e3,
                    "samples": samples(body.decode()),
                }
            )
        whole, parts = rows[0]["samples"], sum((r["samples"] for r in rows[1:]), Counter())
        assert parts == whole and max(parts.values()) == 1, "the slices are not the whole view"
        for r in rows:
            r["samples"] = sum(r["samples"].values())
        return {"engines": engines, "rows": rows}
    finally:
        exporter.close()
        for writer, _ in made:
            writer._closed = True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="64,1024")
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "slices.json"))
    opts = parser.parse_args()
    rs = _imports()
    results = []
    with rs.EmbeddedRedis() as server:
        for n in (int(x) for x in opts.engines.split(",")):
            results.append(measure(rs, server.url, n, opts.slices, opts.rounds))
    for res in results:
        print(f"\n{res['engines']} engines x 2 writers, full vLLM catalogue")
        head = f"    {'slice':>7}{'body MiB':>10}{'x whole':>9}{'Redis reply MiB':>17}"
        print(head + f"{'build ms':>10}{'samples':>9}")
        whole = res["rows"][0]
        for r in res["rows"]:
            print(
                f"    {r['slice']:>7}{r['body_mib']:>10.2f}{r['body_mib'] / whole['body_mib']:>9.3f}"
                f"{r['redis_reply_mib']:>17.2f}{r['build_ms']:>10.0f}{r['samples']:>9}"
            )
        largest = max(r["body_mib"] for r in res["rows"][1:])
        print(f"    largest slice {largest:.2f} MiB ({'under' if largest < 16 else 'OVER'} 16 MiB)")
    Path(opts.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
