"""What ``GET /get_load`` costs Redis (issue 34): one answer of the vLLM middleware
(``redis_stats.integrations.vllm.get_load``), and the map read behind it.

A fleet of *engines* engines in pods of 4 (two API-server writers of 2 engines each, the load feed
on, as the plugin writes it), in a private redis-server. Measured: one answer's read (a load-feed
read of one endpoint's engines: best and median of *rounds*, bytes Redis sent by ``INFO stats``)
and the map read (the namespace's load feed, at most every ``MAP_TTL`` s per process).

    python bench/get_load.py [--engines 1024] [--rounds 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.get_load import EndpointLoad  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402


def endpoint_of(pod: int) -> str:
    return f"10.0.{pod // 250}.{pod % 250}:8000"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    server = EmbeddedRedis().start()
    writers = []
    try:
        cfg = StatsConfig(url=server.url, namespace="get-load")
        for pod in range(args.engines // 4):
            config = cfg.replace(endpoint=endpoint_of(pod))
            for half in range(2):
                engines = [4 * pod + 2 * half, 4 * pod + 2 * half + 1]
                w = StatsWriter(
                    config, vllm_catalog(), engines=engines, start=False, role=f"api{half}", load=VLLM_LOAD
                )
                for e in engines:
                    w.metric("vllm:num_requests_running").labels(e, model_name="m").set(3)
                    w.metric("vllm:num_requests_waiting").labels(e, model_name="m").set(1)
                assert w.flush()
                writers.append(w)
        client = redis.Redis.from_url(server.url)

        def sent() -> int:
            return int(client.info("stats")["total_net_output_bytes"])

        source = EndpointLoad(cfg.replace(endpoint=endpoint_of(args.engines // 8)))
        status, doc = source.answer()  # the map read and the first answer: warmed
        assert status == 200 and doc["load"] == 16, (status, doc)
        times = []
        before = sent()
        for _ in range(args.rounds):
            t = time.perf_counter()
            source.answer()
            times.append(time.perf_counter() - t)
        per = (sent() - before) / args.rounds
        maps = []
        before = sent()
        for _ in range(5):
            source.views.forget()
            t = time.perf_counter()
            source.views.load_view()
            maps.append(time.perf_counter() - t)
        per_map = (sent() - before) / 5
        print(f"{args.engines} engines in {args.engines // 4} endpoints of 4")
        print(
            f"  one answer: {min(times) * 1e3:.2f} ms best, {statistics.median(times) * 1e3:.2f} median, "
            f"{per / 1024:.1f} KB from Redis"
        )
        print(
            f"  map read:   {min(maps) * 1e3:.1f} ms best, {statistics.median(maps) * 1e3:.1f} median, "
            f"{per_map / 1024:.1f} KB from Redis"
        )
    finally:
        for w in writers:
            w.close()
        server.close()


if __name__ == "__main__":
    main()
