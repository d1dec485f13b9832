"""How many distinct functions of the package one busy scrape runs (issue 33: a newcomer follows
a scrape through fewer places, not smaller ones).

8 engines x 2 simulated vLLM API servers (the full catalogue, ``bench/scrape_full.py``'s
``fill``/``churn``), every chunk changed before the scrape, as a live fleet's are; the scrape is
``RedisCollector.render_text()`` (what ``/metrics`` serves), counted with ``sys.setprofile``:
every Python function whose code lives under the package directory, called at least once.
At K = 1 and K = 3 (``shards``) on one private server.

    python bench/read_functions.py [PATH ...]     # checkouts to compare (default: this tree)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def count(shards: int) -> dict[str, object]:
    import importlib.util

    # bench/scrape_full.py of this tree, the package of PYTHONPATH (the checkout measured)
    spec = importlib.util.spec_from_file_location("scrape_full", HERE / "scrape_full.py")
    assert spec is not None and spec.loader is not None
    scrape_full = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scrape_full)
    _imports, churn = scrape_full._imports, scrape_full.churn

    rs = _imports()
    package = str(rs.package)
    with rs.EmbeddedRedis() as server:
        cfg = rs.StatsConfig(url=server.url, namespace=f"fn{shards}", shards=shards)
        cat = rs.vllm_catalog()
        import time

        made = []
        for w in range(2):
            writer = rs.StatsWriter(cfg, cat, engines=list(range(8)), start=False, role=f"api{w}")
            sims = [
                rs.SimulatedApiServer(rs.VllmRecorder(writer, "model", [e]), e, seed=w * 1000 + e)
                for e in range(8)
            ]
            now = time.monotonic()
            for step in range(20):
                for sim in sims:
                    sim.step(now + step * 0.05)
            assert writer.flush()
            made.append((writer, sims))
        collector = rs.RedisCollector(rs.StatsReader(cfg, cat))
        collector.render_text()
        churn(made)
        collector.render_text()
        churn(made)
        seen: dict[str, int] = {}

        def profile(frame, event, arg):
            if event == "call":
                code = frame.f_code
                if code.co_filename.startswith(package):
                    qualname = getattr(code, "co_qualname", code.co_name)
                    name = f"{code.co_filename[len(package) + 1 :]}:{qualname}"
                    seen[name] = seen.get(name, 0) + 1

        sys.setprofile(profile)
        collector.render_text()
        sys.setprofile(None)
        return {"shards": shards, "functions": len(seen), "calls": sum(seen.values()), "names": sorted(seen)}


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        print(json.dumps(count(int(sys.argv[2]))))
        return
    paths = sys.argv[1:] or [str(HERE.parent)]
    verbose = os.environ.get("VERBOSE")
    for path in paths:
        for shards in (1, 3):
            env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()))
            out = subprocess.run(
                [sys.executable, __file__, "--worker", str(shards)], env=env, capture_output=True, text=True
            )
            if out.returncode:
                print(out.stderr[-2000:])
                continue
            got = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{path}: K = {shards}: {got['functions']} distinct functions, {got['calls']} calls")
            if verbose:
                print("   ", "\n    ".join(got["names"]))


if __name__ == "__main__":
    main()
