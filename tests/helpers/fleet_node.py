"""One simulated vLLM node for the end-to-end Prometheus test: API servers that record a synthetic
load through the real vLLM recorder, and the Redis view served as the vLLM plugin serves it
(``maybe_serve``: ``REDIS_STATS_PORT``, ``REDIS_STATS_VIEW``).

Usage: python -m tests.helpers.fleet_node ENGINES API_SERVERS TRUTH_PATH SEED
  (REDIS_STATS_URL, REDIS_STATS_NAMESPACE, REDIS_STATS_PORT, REDIS_STATS_VIEW from the environment)

The node keeps its own truth — every generation and prompt token and every TTFT it recorded, per
engine — and writes it to TRUTH_PATH every 0.2 s as JSON, with a history of (time, cumulative
tokens) for rates, and ``totals``: (time, per engine [generation, prompt, finished]). SIGUSR1
freezes the load (the writers keep heartbeating and flush what they hold; the truth file then
says ``frozen``). SIGTERM closes the writers and exits.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.integrations.vllm.serve import maybe_serve
from redis_stats.tools.simulate import LoadProfile, SimulatedApiServer


class CountingRecorder(VllmRecorder):
    """A VllmRecorder that also keeps what it was given: the writers' own totals."""

    def __init__(self, *args: Any, truth: dict[int, dict[str, Any]], lock: threading.Lock, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.truth = truth
        self.lock = lock

    def record(self, sched: Any, it: Any, mm: Any = None, engine_idx: int = 0) -> None:
        super().record(sched, it, mm, engine_idx)
        with self.lock:
            t = self.truth[engine_idx]
            t["generation_tokens"] += it.num_generation_tokens
            t["prompt_tokens"] += it.num_prompt_tokens
            t["ttft"].extend(it.time_to_first_tokens_iter)
            t["finished"] += len(it.finished_requests)


def main() -> None:
    engines = [int(e) for e in sys.argv[1].split(",")]
    api_servers, truth_path, seed = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    config = StatsConfig.from_env()
    catalog = vllm_catalog()
    lock = threading.Lock()
    truth: dict[int, dict[str, Any]] = {
        e: {"generation_tokens": 0, "prompt_tokens": 0, "ttft": [], "finished": 0} for e in engines
    }
    writers, sims = [], []
    for api in range(api_servers):
        writer = StatsWriter(config, catalog, engines=engines, role=f"api{api}", owner=f"node{engines[0]}")
        recorder = CountingRecorder(writer, "tiny-llama", engines, truth=truth, lock=lock)
        writers.append(writer)
        for e in engines:
            profile = LoadProfile(arrivals_per_s=3.0, output_tokens=(16, 128))
            sims.append(SimulatedApiServer(recorder, e, profile, seed=seed * 100 + api * 10 + e))
    view = maybe_serve(config, catalog, engines)
    frozen = threading.Event()
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: frozen.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    history: list[tuple[float, dict[int, int]]] = []
    totals: list[tuple[float, dict[int, list[int]]]] = []

    def dump() -> None:
        with lock:
            doc = {
                "time": time.time(),
                "frozen": frozen.is_set(),
                "view": view.url if view else None,
                "engines": {str(e): dict(t) for e, t in truth.items()},
                "history": history[-400:],
                "totals": totals[-400:],
            }
            text = json.dumps(doc)
        tmp = truth_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, truth_path)

    last_dump = 0.0
    while not stop.is_set():
        if not frozen.is_set():
            for sim in sims:
                sim.step()
        now = time.time()
        if now - last_dump >= 0.2:
            with lock:
                history.append((now, {e: t["generation_tokens"] for e, t in truth.items()}))
                counts = {
                    e: [t["generation_tokens"], t["prompt_tokens"], t["finished"]] for e, t in truth.items()
                }
                totals.append((now, counts))
            if frozen.is_set():
                for writer in writers:  # everything recorded is in Redis before "frozen" is written
                    writer.flush()
            dump()
            last_dump = now
        time.sleep(0.05)
    for writer in writers:
        writer.close()
    if view is not None:
        view.close()


if __name__ == "__main__":
    main()
