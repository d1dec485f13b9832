"""The live page at 64 and 1,024 engines (issue 25, item 4): what one poll costs the browser and
the exporter.

For each fleet size (simulated vLLM engines, ``tests/page_fleet.py``, in a process of its own):

- ``/snapshot`` as the page asks for it (``?buckets=0&name[]=`` its seven metrics) against the whole
  document, in the same run: build time in the exporter (median of 5) and body size, and the ratio;
- the page in a real headless Chromium (Debian's ``chromium``/``chromedriver``): browser time of
  each poll, ``performance.now()`` around ``JSON.parse``, the render and the layout it causes
  (``window.__renders``), median and fastest of the polls with a window.

Usage: python bench/live_page.py [--engines 64,1024] [--polls 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig, StatsReader  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY, VLLM_PAGE_HISTORY  # noqa: E402
from redis_stats.server import Exporter  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402
from tests import browser, page_fleet  # noqa: E402
from tests.server import states  # noqa: E402

PAGE_METRICS = [
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
]


def document(exporter: Exporter, names: list[str] | None, buckets: bool = True) -> tuple[float, int]:
    """Median build time (s) of 5 documents, and the size of the last."""
    times, size = [], 0
    for _ in range(5):
        started = time.perf_counter()
        _, doc = states.snapshot_json(exporter, names, buckets)
        body = json.dumps(doc, allow_nan=False).encode()
        times.append(time.perf_counter() - started)
        size = len(body)
    return statistics.median(times), size


def one(engines: int, polls: int) -> None:
    server = EmbeddedRedis().start()
    proc = page_fleet.spawn(
        server.url, "bench", engines, interval=2.0, stale_after=30.0, load=0.3, queued=(3,), full=(5,)
    )
    config = StatsConfig(url=server.url, namespace="bench", stale_after=30.0)
    exporter = Exporter(
        StatsReader(config, vllm_catalog()),
        port=0,
        window=10,
        summary=VLLM_FLEET_SUMMARY,
        history=VLLM_PAGE_HISTORY,
    ).start()
    try:
        states.snapshot_json(exporter)
        time.sleep(2)
        whole_s, whole_b = document(exporter, None)
        page_s, page_b = document(exporter, PAGE_METRICS, buckets=False)
        print(
            f"{engines:5} engines  /snapshot whole: {whole_s * 1000:7.0f} ms {whole_b / 1e6:6.2f} MB   "
            f"the page's ?buckets=0&name[]=: {page_s * 1000:6.0f} ms {page_b / 1e6:5.2f} MB   "
            f"(x{whole_s / page_s:.1f} faster, x{whole_b / page_b:.1f} smaller)"
        )
        b = browser.Browser()
        try:
            b.resize(1280, 1500)
            b.get(exporter.url + "/")
            deadline = time.monotonic() + 60 + polls * 10
            renders: list[dict[str, float]] = []
            while time.monotonic() < deadline:
                renders = [r for r in (b.js("return window.__renders") or []) if r["window"] is not None]
                if len(renders) >= polls:
                    break
                time.sleep(1)
        finally:
            b.close()
        totals = sorted(r["total_ms"] for r in renders)
        parse = statistics.median(r["parse_ms"] for r in renders) if renders else float("nan")
        print(
            f"{'':5}          browser per poll ({len(totals)} polls): "
            f"median {statistics.median(totals):.0f} ms, "
            f"fastest {totals[0]:.0f} ms, slowest {totals[-1]:.0f} ms (JSON.parse median {parse:.0f} ms)"
        )
    finally:
        exporter.close()
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(60)
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="64,1024")
    parser.add_argument("--polls", type=int, default=5)
    opts = parser.parse_args()
    if why := browser.missing():
        sys.exit(why)
    for n in (int(x) for x in opts.engines.split(",")):
        one(n, opts.polls)


if __name__ == "__main__":
    main()
