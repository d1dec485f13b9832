"""Exporter: an HTTP server over the Redis view, for Prometheus, routers and health checks.

    GET /metrics        every engine's series (Prometheus text format), one Redis read
    GET /snapshot       the same snapshot as JSON: per engine up, age, counters, gauges, and
                        histograms with p50/p90/p99 (for routers and autoscalers)
    GET /healthz        200 when Redis answers, 503 otherwise

Run it standalone (``redis-stats exporter``) or inside any process (:class:`Exporter`).
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from .collector import RedisCollector
from .errors import error_kind
from .reader import StatsReader

__all__ = ["Exporter"]

log = logging.getLogger("redis_stats.exporter")


class Exporter:
    """Serves ``/metrics``, ``/snapshot`` and ``/healthz`` from a thread.

    *port* 0 picks a free port (see :attr:`port` after :meth:`start`). With *gc_interval* > 0 it
    also runs retention (``redis_stats.gc``) that often.
    """

    def __init__(
        self,
        reader: StatsReader,
        *,
        engines: list[int] | None = None,
        host: str = "127.0.0.1",
        port: int = 9400,
        gc_interval: float = 0.0,
    ) -> None:
        self.reader = reader
        self.engines = engines
        self.collector = RedisCollector(reader, engines=engines)
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None
        self.gc_interval = gc_interval
        self._stop = threading.Event()

    @property
    def port(self) -> int:
        """The TCP port served."""
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """Base URL of the server."""
        host = self._server.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self) -> Exporter:
        """Serve from a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="redis_stats-exporter", daemon=True
        )
        self._thread.start()
        self._start_gc()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread (until :meth:`close` from another thread, or Ctrl-C)."""
        self._start_gc()
        self._server.serve_forever()

    def _start_gc(self) -> None:
        # Retention on a timer: every exporter may run it; the gc lease lets one collect at a time.
        if self.gc_interval > 0:
            threading.Thread(target=self._gc_loop, name="redis_stats-gc", daemon=True).start()

    def _gc_loop(self) -> None:
        from .gc import collect_garbage

        while not self._stop.wait(self.gc_interval):
            try:
                result = collect_garbage(self.reader.config)
            except Exception as exc:
                log.debug("gc failed: %s", exc)
                continue
            if result.engines or result.writers:
                log.info(
                    "gc removed engines %s and %d writers past retention", result.engines, len(result.writers)
                )

    def close(self) -> None:
        """Stop serving (and the retention timer)."""
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def snapshot_json(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) of ``/snapshot``."""
        try:
            snap = self.reader.snapshot(self.engines)
        except Exception as exc:
            return 503, {"error": error_kind(exc), "detail": str(exc)}
        return 200, snap.to_dict()

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) of ``/healthz``."""
        try:
            snap = self.reader.snapshot(self.engines)
        except Exception as exc:
            return 503, {
                "status": "redis unavailable",
                "error": error_kind(exc),
                "redis": self.reader.config.safe_url,
            }
        up = sum(e.up for e in snap.engines.values())
        return 200, {"status": "ok", "engines": len(snap.engines), "engines_up": up}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, exporter.collector.render_text().encode())
                elif path == "/snapshot":
                    self._json(*exporter.snapshot_json())
                elif path == "/healthz":
                    self._json(*exporter.health())
                else:
                    self._json(404, {"error": "not found", "paths": ["/metrics", "/snapshot", "/healthz"]})

            def _json(self, status: int, doc: dict[str, Any]) -> None:
                self._send(status, "application/json", json.dumps(doc).encode())

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("%s " + fmt, self.address_string(), *args)

        return Handler
