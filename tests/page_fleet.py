"""A simulated vLLM fleet of N engines for the live page's browser tests (2, 10 and 1,024 engines).

Two API-server writers share the engines (as a data-parallel deployment's front ends do), each
engine driven by its own :class:`SimulatedApiServer` through the real vLLM recorder. So that the
page has something to point at, a few engines are made to misbehave: ``queued`` engines get more
requests than they can run (a growing waiting queue, hence a growing TTFT), ``full`` engines keep
long prompts (KV cache near full), and ``down`` engines are written by a third writer that stops
flushing after its first flush (stale after ``stale_after``).

Steps are coarse (one per flush, ``interval`` seconds of simulated time): at 1,024 engines a
finer step would take this 2-core machine's time from the browser under test.

Each writer stands for a pod: its id's host part is the pod's name (``vllm-0``, ``vllm-1``; the
stopped one ``vllm-gone``) and it stores the pod's endpoint (``vllm-0.vllm:8000``), as the vLLM
plugin does on Kubernetes (the host name is the pod's, the endpoint its address).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.tools.simulate import LoadProfile, SimulatedApiServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def pod(name: str) -> tuple[str, str]:
    """(writer id, endpoint) of a writer in pod *name*: ``name:pid:role:random``, ``name.vllm:8000``."""
    return f"{name}:{os.getpid()}:{name.rsplit('-', 1)[-1]}:{secrets.token_hex(3)}", f"{name}.vllm:8000"


ROOT = Path(__file__).resolve().parent.parent


class PageFleet:
    """*engines* engines writing to *url*/*namespace* from a thread until :meth:`close`."""

    def __init__(
        self,
        url: str,
        namespace: str,
        engines: int,
        *,
        queued: tuple[int, ...] = (),
        full: tuple[int, ...] = (),
        down: tuple[int, ...] = (),
        interval: float = 0.5,
        stale_after: float = 3.0,
        load: float = 1.0,
    ) -> None:
        self.config = StatsConfig(
            url=url, namespace=namespace, flush_interval=interval, stale_after=stale_after
        )
        self.interval = interval
        self.load = load  # scales the healthy engines' arrivals (a thousand engines: less to simulate)
        self.dead: StatsWriter | None = None
        if down:  # first: their staleness runs while the rest starts
            wid, where = pod("vllm-gone")
            self.dead = StatsWriter(
                self.config.replace(endpoint=where),
                vllm_catalog(),
                engines=list(down),
                start=False,
                writer_id=wid,
            )
            recorder = VllmRecorder(self.dead, MODEL, list(down))
            for e in down:
                SimulatedApiServer(recorder, e, seed=e).step()
            assert self.dead.flush()
        live = [e for e in range(engines) if e not in down]
        halves = [live[0::2], live[1::2]]
        self.writers = []
        for i, part in enumerate(halves):
            if part:
                wid, where = pod(f"vllm-{i}")
                config = self.config.replace(endpoint=where)
                self.writers.append(
                    StatsWriter(config, vllm_catalog(), engines=part, start=False, writer_id=wid)
                )
        self.sims: list[SimulatedApiServer] = []
        for writer in self.writers:
            recorder = VllmRecorder(writer, MODEL, list(writer.engines))
            for e in writer.engines:
                self.sims.append(
                    SimulatedApiServer(recorder, e, self._profile(e, queued, full, load), seed=e)
                )
        self._stop = threading.Event()
        self.step()  # the first flush before the page's first poll
        self._thread = threading.Thread(target=self._run, name="page-fleet", daemon=True)
        self._thread.start()

    @staticmethod
    def _profile(engine: int, queued: tuple[int, ...], full: tuple[int, ...], load: float) -> LoadProfile:
        if engine in queued:  # far more arrivals than it may run at once
            return LoadProfile(arrivals_per_s=3.0 + queued.index(engine), max_running=6)
        if engine in full:
            return LoadProfile(arrivals_per_s=2.0, prompt_tokens=(6000, 8000), output_tokens=(200, 400))
        # Within what 32 running slots serve.
        return LoadProfile(arrivals_per_s=load * (1.0 + 0.4 * (engine % 5)))

    def step(self) -> None:
        """One simulated interval of every engine, then one flush per writer."""
        now = time.monotonic()
        for sim in self.sims:
            sim.step(now)
        for writer in self.writers:
            writer.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.step()

    def close(self) -> None:
        """Stop the thread and close every writer."""
        self._stop.set()
        self._thread.join(30)
        for writer in self.writers:
            writer.close()
        if self.dead is not None:
            self.dead._closed = True  # it stopped flushing: it must stay stale, not close cleanly


def spawn(url: str, namespace: str, engines: int, **options: object) -> subprocess.Popen[str]:
    """The same fleet in a process of its own (returns once its first flush is done).

    At 1,024 engines the simulation takes most of a core: in the test's own process it would
    compete for the GIL with the exporter under test (and starve, its engines turning stale).
    Ends when its stdin closes (``proc.stdin.close(); proc.wait()``), or with the test process.
    """
    args = [sys.executable, "-m", "tests.page_fleet", url, namespace, str(engines), json.dumps(options)]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the simulated fleet did not start: {line!r}")
    return proc


def _main() -> None:
    url, namespace, engines, options = sys.argv[1:5]
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(options).items()}
    fleet = PageFleet(url, namespace, int(engines), **kw)
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes it (or ends)
    fleet.close()


if __name__ == "__main__":
    _main()
