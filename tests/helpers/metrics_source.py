"""A metrics endpoint for the bridge's tests: prometheus_client over HTTP on 127.0.0.1, serving a
synthetic catalogue that changes only when told to.

    python -m tests.helpers.metrics_source --port P --catalog sglang [--engines 2] [--seed 1] [--process]

``GET /metrics`` is prometheus_client's own WSGI app (it answers OpenMetrics or the 0.0.4 text by
the Accept header), unless a mode says otherwise. ``GET /step?n=K`` records K rounds of traffic
(counters, histogram observations with fractional values, gauges). ``GET /mode?m=M`` switches
what /metrics serves: ``normal``, ``garbage`` (not metrics), ``truncated`` (the body cut
mid-line), ``huge`` (a valid body padded to 4 MB), ``typechange`` (a gauge family served as a
counter), ``html`` (an HTML page), ``json`` (what trtllm-serve's /metrics answers: a JSON list
of iteration stats, ``application/json``), ``json_as_text`` (the same JSON as ``text/plain``).
``GET /churn`` replaces a labelled gauge's and counter's label values (old series go, new ones
come). ``--process`` adds what prometheus_client's default registry serves beside
(``process_*``, ``python_info``, ``python_gc_*``), as vLLM, SGLang and trtllm-serve do. A restart
is the test killing this process and starting another on the same port; a hang is SIGSTOP.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
from collections.abc import Iterator
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)

SGLANG_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SyntheticCatalogue:
    """A registry of *catalog*'s families (``sglang`` names, or ``vllm``: every family of
    redis_stats' vLLM catalogue with vLLM's ``engine`` label) for *engines* engines; with
    *process*, prometheus_client's process, platform and gc collectors too."""

    def __init__(
        self, catalog: str = "sglang", engines: int = 1, seed: int = 0, process: bool = False
    ) -> None:
        self.registry = CollectorRegistry()
        if process:
            for collector in (ProcessCollector, PlatformCollector, GCCollector):
                collector(registry=self.registry)
        self.rng = random.Random(seed)
        self.engines = engines
        self.kind = catalog
        self.churn_round = 0
        self._lock = threading.Lock()
        self.counters: list[tuple[Any, dict[str, list[str]]]] = []
        self.gauges: list[tuple[Any, dict[str, list[str]]]] = []
        self.histograms: list[tuple[Any, dict[str, list[str]]]] = []
        if catalog == "sglang":
            self._sglang()
        elif catalog == "vllm":
            self._vllm()
        else:
            raise ValueError(f"unknown catalogue {catalog!r}")
        self.step(1)

    def _add(self, cls: Any, name: str, doc: str, labels: dict[str, list[str]], **kw: Any) -> Any:
        metric = cls(name, doc, list(labels), registry=self.registry, **kw)
        {Counter: self.counters, Gauge: self.gauges, Histogram: self.histograms}[cls].append((metric, labels))
        return metric

    def _sglang(self) -> None:
        m = {"model_name": ["tiny"]}
        self._add(Counter, "sglang:prompt_tokens", "Number of prefill tokens processed.", m)
        self._add(Counter, "sglang:generation_tokens", "Number of generation tokens processed.", m)
        self._add(Counter, "sglang:num_requests", "Number of requests processed.", m)
        self._add(Counter, "sglang:cached_tokens", "Number of cached prompt tokens.", m)
        self._add(Gauge, "sglang:num_running_reqs", "The number of running requests.", m)
        self._add(Gauge, "sglang:num_queue_reqs", "The number of requests in the waiting queue.", m)
        self._add(Gauge, "sglang:token_usage", "The token usage.", m)
        self._add(Gauge, "sglang:gen_throughput", "The generation throughput (token/s).", m)
        self._add(Gauge, "sglang:cache_hit_rate", "The prefix cache hit rate.", m)
        for name, doc in (
            ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
            ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
            ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds"),
        ):
            self._add(Histogram, name, doc, m, buckets=SGLANG_BUCKETS)
        # Label churn: LoRA adapters come and go (see churn()).
        self.lora_gauge = self._add(
            Gauge, "sglang:lora_pool_slots_used", "LoRA slots used.", {"lora": ["a0"]}
        )
        self.lora_counter = self._add(Counter, "sglang:lora_requests", "Requests per LoRA.", {"lora": ["a0"]})

    def _vllm(self) -> None:
        from redis_stats.catalog import COUNTER, GAUGE
        from redis_stats.integrations.vllm.catalog import (
            ADMISSION_REASONS,
            CACHE_HIT_SOURCES,
            FINISH_REASONS,
            PROMPT_TOKEN_SOURCES,
            SLEEP_STATES,
            WAITING_REASONS,
            WATERMARK_STATUSES,
            vllm_catalog,
        )

        values = {
            "model_name": ["tiny"],
            "finished_reason": list(FINISH_REASONS),
            "source": list(PROMPT_TOKEN_SOURCES),
            "reason": list(WAITING_REASONS),
            "sleep_state": list(SLEEP_STATES),
            "stage": ["waiting_to_start", "in_progress", "completed_waiting"],
            "position": ["0", "1", "2"],
            "status": list(WATERMARK_STATUSES),
            "max_lora": ["1"],
            "waiting_lora_adapters": [""],
            "running_lora_adapters": [""],
        }
        engines = [str(e) for e in range(self.engines)]
        for spec in vllm_catalog(max_model_len=128):
            labels = {label: values.get(label, ["x"]) for label in spec.labels}
            if spec.name == "vllm:prompt_tokens_cached_by_source":
                labels["source"] = list(CACHE_HIT_SOURCES)
            if spec.name == "vllm:admission_rejections":
                labels["reason"] = list(ADMISSION_REASONS)
            labels["engine"] = engines
            cls = {COUNTER: Counter, GAUGE: Gauge}.get(spec.kind, Histogram)
            kw = {"buckets": spec.buckets} if cls is Histogram else {}
            self._add(cls, spec.name, spec.help, labels, **kw)

    @staticmethod
    def _label_sets(labels: dict[str, list[str]]) -> Iterator[list[str]]:
        sets: list[list[str]] = [[]]
        for options in labels.values():
            sets = [[*s, v] for s in sets for v in options]
        yield from sets

    def step(self, rounds: int = 1) -> None:
        """*rounds* rounds of traffic on every series."""
        rng = self.rng
        with self._lock:
            for _ in range(rounds):
                for metric, labels in self.counters:
                    for values in self._label_sets(labels):
                        metric.labels(*values).inc(rng.choice((0, 1, 7, 0.1, 0.25 + rng.random())))
                for metric, labels in self.gauges:
                    for values in self._label_sets(labels):
                        metric.labels(*values).set(rng.choice((0, 1, 3.5, rng.random())))
                for metric, labels in self.histograms:
                    for values in self._label_sets(labels):
                        for _ in range(rng.randint(0, 3)):
                            metric.labels(*values).observe(rng.random() * rng.choice((0.1, 1, 10, 100)))

    def churn(self) -> None:
        """The LoRA families' label values change: the old series go, new ones come."""
        with self._lock:
            old = f"a{self.churn_round}"
            self.churn_round += 1
            new = f"a{self.churn_round}"
            for metric in (self.lora_gauge, self.lora_counter):
                metric.remove(old)
                for entry in (*self.gauges, *self.counters):
                    if entry[0] is metric:
                        entry[1]["lora"] = [new]
                metric.labels(new)
        self.step(1)

    def body(self, accept: str = "") -> tuple[bytes, str]:
        """The body and Content-Type prometheus_client serves for *accept*."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        with self._lock:
            return encoder(self.registry), content_type


def app(catalogue: SyntheticCatalogue, auth: str | None = None) -> Any:
    """The WSGI app; with *auth* (``user:password``) /metrics wants that Basic auth."""
    import base64

    metrics = make_wsgi_app(catalogue.registry)
    state = {"mode": "normal"}
    wanted = "Basic " + base64.b64encode(auth.encode()).decode() if auth else None

    def serve(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if wanted and path == "/metrics" and environ.get("HTTP_AUTHORIZATION") != wanted:
            start_response("401 Unauthorized", [("Content-Type", "text/plain")])
            return [b"who are you?\n"]
        query = parse_qs(environ.get("QUERY_STRING", ""))
        if path == "/step":
            catalogue.step(int(query.get("n", ["1"])[0]))
            return _reply(start_response, b"ok\n")
        if path == "/churn":
            catalogue.churn()
            return _reply(start_response, b"ok\n")
        if path == "/mode":
            state["mode"] = query["m"][0]
            return _reply(start_response, b"ok\n")
        if path == "/health":
            return _reply(start_response, b"ok\n")
        mode = state["mode"]
        if mode == "normal":
            with catalogue._lock:
                return list(metrics(environ, start_response))
        body, content_type = catalogue.body(environ.get("HTTP_ACCEPT", ""))
        if mode == "garbage":
            return _reply(start_response, b"<<< this is not a metrics body >>>\n", content_type)
        if mode in ("json", "json_as_text"):
            stats = b'[{"iter": 7, "numActiveRequests": 2, "gpuMemUsage": 1024}]'
            return _reply(start_response, stats, "application/json" if mode == "json" else "text/plain")
        if mode == "html":
            return _reply(start_response, b"<html><body>login</body></html>\n", "text/html")
        if mode == "truncated":
            cut = len(body) // 2
            while body[cut - 1 : cut] == b"\n":
                cut += 1
            return _reply(start_response, body[:cut], content_type)
        if mode == "huge":
            pad = b"# padding to make the body huge\n" * (4 * 1024 * 1024 // 32)
            return _reply(start_response, pad + body, content_type)
        if mode == "typechange":
            changed = body.replace(
                b"# TYPE sglang:num_running_reqs gauge", b"# TYPE sglang:num_running_reqs counter"
            )
            return _reply(start_response, changed, content_type)
        raise ValueError(f"unknown mode {mode!r}")

    return serve


def _reply(start_response: Any, data: bytes, content_type: str = "text/plain") -> list[bytes]:
    start_response("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(data)))])
    return [data]


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class _Threaded(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def serve(catalogue: SyntheticCatalogue, port: int = 0, auth: str | None = None) -> WSGIServer:
    """Serve *catalogue* on 127.0.0.1:*port* from a thread; returns the server (``server_port``)."""
    server = make_server(
        "127.0.0.1", port, app(catalogue, auth), server_class=_Threaded, handler_class=_Quiet
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--catalog", default="sglang")
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--process", action="store_true")
    args = parser.parse_args()
    catalogue = SyntheticCatalogue(args.catalog, args.engines, args.seed, args.process)
    server = make_server("127.0.0.1", args.port, app(catalogue), server_class=_Threaded, handler_class=_Quiet)
    print("ready", flush=True)
    sys.stdout.close()
    server.serve_forever()


if __name__ == "__main__":
    main()
