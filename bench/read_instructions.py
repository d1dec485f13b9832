"""Instructions (callgrind) of the reads of one unchanged reply: 5 renders (``/metrics``) and 5
decodes (``/snapshot``) of 64 engines x 2 writers, the full vLLM catalogue, counted inside the
reads only (the fill runs with instrumentation off). Exact, where times on a shared machine move
by a fifth between runs. Run by ``bench/read_instructions.sh PACKAGE_PATH TAG``, which prints the
total; give it two checkouts to compare them.

``READ_PROFILE=busy`` counts a busy fleet's reads instead: 4 renders, or (``READ_PATH=decode``)
4 decodes, each of a reply read after every writer flushed again (every chunk changed);
``READ_WRITERS`` writers per engine (default 2)."""

from __future__ import annotations

import gc
import sys

sys.path.insert(0, sys.argv[1])

import os

from bench.scrape_full import _imports, churn, fill


def main() -> None:
    rs = _imports()
    with rs.EmbeddedRedis() as server:
        made = fill(rs, server.url, "p", 64, int(os.environ.get("READ_WRITERS", "2")))
        reader = rs.StatsReader(rs.StatsConfig(url=server.url, namespace="p"), rs.vllm_catalog())
        renderer = rs.RedisCollector(reader)._renderer
        reply = reader.read()

        def render() -> None:
            if hasattr(reader, "decoded"):  # the one decoded form (issue 29)
                renderer.render(reader.decoded(reply))
            else:  # before it: the renderer decoded the reply itself
                renderer.render(reply)

        render()
        reader.decode(reply)
        busy = []
        if os.environ.get("READ_PROFILE") == "busy":
            for _ in range(4):
                churn(made)
                busy.append(reader.read())
        gc.disable()
        print("ready", flush=True)
        sys.stdin.readline()  # the harness turns instrumentation on
        for read in busy:
            if os.environ.get("READ_PATH") == "decode":
                reader.decode(read)
            else:
                reply = read
                render()
        for _ in range(0 if busy else 5):
            render()
            reader.decode(reply)
        print("done", flush=True)
        sys.stdin.readline()  # and off


if __name__ == "__main__":
    main()
