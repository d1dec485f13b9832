"""Instructions (callgrind) of the reads of one unchanged reply: 5 renders (``/metrics``) and 5
decodes (``/snapshot``) of 64 engines x 2 writers, the full vLLM catalogue, counted inside the
reads only (the fill runs with instrumentation off). Exact, where times on a shared machine move
by a fifth between runs. Run by ``bench/read_instructions.sh PACKAGE_PATH TAG``, which prints the
total; give it two checkouts to compare them."""

from __future__ import annotations

import gc
import sys

sys.path.insert(0, sys.argv[1])

from bench.scrape_full import _imports, fill


def main() -> None:
    rs = _imports()
    with rs.EmbeddedRedis() as server:
        fill(rs, server.url, "p", 64, 2)
        reader = rs.StatsReader(rs.StatsConfig(url=server.url, namespace="p"), rs.vllm_catalog())
        renderer = rs.RedisCollector(reader)._renderer
        reply = reader.read()
        renderer.render(reply)
        reader.decode(reply)
        gc.disable()
        print("ready", flush=True)
        sys.stdin.readline()  # the harness turns instrumentation on
        for _ in range(5):
            renderer.render(reply)
            reader.decode(reply)
        print("done", flush=True)
        sys.stdin.readline()  # and off


if __name__ == "__main__":
    main()
