"""Loop-lag probe for the asyncio writer during an outage, in a process of its own (so no thread
of the test suite competes for the GIL). Starts its own redis-server, stops it for 3 s while a
coroutine records and another measures how late 5 ms sleeps wake up.

Prints one JSON line: {"sent", "total", "p50_ms", "p99_ms", "max_ms", "errors"}.
"""

import asyncio
import json
import time

from redis_stats import Catalog, StatsConfig
from redis_stats.aio import AsyncStatsReader, AsyncStatsWriter
from redis_stats.tools.embedded import EmbeddedRedis


def sample_catalog() -> Catalog:
    cat = Catalog()
    cat.counter("tokens", "Generated tokens.")
    return cat


async def main(server: EmbeddedRedis) -> dict:
    cfg = StatsConfig(
        url=server.url, namespace="lag", flush_interval=0.05, connect_timeout_ms=200, socket_timeout_ms=200
    )
    writer = AsyncStatsWriter(cfg, sample_catalog(), engines=[0])
    writer.start()
    tokens = writer.counter("tokens").labels(engine=0)
    lags: list[float] = []
    sent = 0

    async def probe(seconds: float) -> None:
        nonlocal sent
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            await asyncio.sleep(0.005)
            lags.append(time.monotonic() - t0 - 0.005)
            for _ in range(50):
                tokens.inc()
                sent += 1

    await probe(0.5)
    server.stop(keep_data=True)
    await probe(3.0)  # the flusher keeps failing meanwhile
    errors = sum(writer.stats.errors.values())
    server.start()
    await probe(0.5)
    deadline = time.monotonic() + 10
    while writer.pending() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await writer.close()
    reader = AsyncStatsReader(StatsConfig(url=server.url, namespace="lag"), sample_catalog())
    total = (await reader.snapshot()).engines[0].counter("tokens")
    await reader.close()
    lags.sort()
    return {
        "sent": sent,
        "total": total,
        "p50_ms": lags[len(lags) // 2] * 1e3,
        "p99_ms": lags[int(len(lags) * 0.99)] * 1e3,
        "max_ms": lags[-1] * 1e3,
        "errors": errors,
    }


if __name__ == "__main__":
    with EmbeddedRedis() as server:
        print(json.dumps(asyncio.run(main(server))))
