"""Instructions (callgrind) of the reads of one unchanged reply: 5 renders (``/metrics``) and 5
decodes (``/snapshot``) of 64 engines x 2 writers, the full vLLM catalogue, counted inside the
reads only (the fill runs with instrumentation off). Exact, where times on a shared machine move
by a fifth between runs. Run by ``bench/read_instructions.sh PACKAGE_PATH TAG``, which prints the
total; give it two checkouts to compare them.

``READ_PROFILE=busy`` counts a busy fleet's reads instead: 4 renders, or (``READ_PATH=decode``)
4 decodes, each of a reply read after every writer flushed again (every chunk changed);
``READ_WRITERS`` writers per engine (default 2), ``READ_ENGINES`` engines (default 64),
``READ_SHARDS`` the namespace's K (default 1), ``READ_CATALOGUE=synthetic`` the 40-series set
of bench/peers.py instead of vLLM's. bench/scrape_full.py (fill, churn) is this tree's, whatever
checkout is measured."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
os.environ["PYTHONPATH"] = sys.argv[1]  # scrape_full then leaves sys.path as it is: argv[1] first

_spec = importlib.util.spec_from_file_location("scrape_full", Path(__file__).parent / "scrape_full.py")
assert _spec is not None and _spec.loader is not None
scrape_full = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scrape_full)
scrape_full.CATALOGUE = os.environ.get("READ_CATALOGUE", "vllm")
_imports, churn, fill = scrape_full._imports, scrape_full.churn, scrape_full.fill


def main() -> None:
    rs = _imports()
    with rs.EmbeddedRedis() as server:
        engines, shards = int(os.environ.get("READ_ENGINES", "64")), int(os.environ.get("READ_SHARDS", "1"))
        made = fill(rs, server.url, "p", engines, int(os.environ.get("READ_WRITERS", "2")), shards)
        config = rs.StatsConfig(url=server.url, namespace="p", shards=shards)
        reader = rs.StatsReader(config, scrape_full.catalog_of(rs))
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
