"""A router's view of the fleet from ``GET /load`` (docs/load.md): pick the engine to send to.

    python docs/examples/load_router.py http://127.0.0.1:9400 [--every 0.05] [--count 20]

Polls ``/load`` with ``If-None-Match`` (an unchanged fleet costs a ``304`` and no body), keeps the
last document, and picks, among the engines whose ``state`` is ``up`` and whose data is fresh,
the one with the fewest requests waiting, then the lowest KV-cache usage, then the fewest running.
It falls back on ``stale`` engines (up, but a flush or more behind) only when no engine is ``up``,
and never sends to a ``down`` one: with none left it answers None, and the caller routes by its
own rule (round robin). An engine whose data is older than ``--stale`` seconds counts as unknown,
as the llm-d endpoint picker treats data older than 2 s. Only the standard library: copy it into
a router.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
import urllib.error
import urllib.request
from typing import Any

SCHEMA_VERSION = 1  # the /load version this code reads (docs/load.md: what a version promises)


class LoadClient:
    """The last ``/load`` document of one exporter, refreshed with ``If-None-Match``."""

    def __init__(self, base_url: str, timeout: float = 1.0) -> None:
        self.url = base_url.rstrip("/") + "/load"
        self.timeout = timeout
        self.etag = ""
        self.doc: dict[str, Any] | None = None
        self.refreshed = 0.0  # the exporter's X-Load-Refreshed: its last read of Redis (server s)
        self.not_modified = 0

    def poll(self) -> dict[str, Any]:
        """The current document (the kept one when the exporter answers 304)."""
        headers = {"Accept-Encoding": "gzip"}
        if self.etag:
            headers["If-None-Match"] = self.etag
        request = urllib.request.Request(self.url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                body = resp.read()
                if resp.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                doc = json.loads(body)
                if doc.get("schema_version") != SCHEMA_VERSION:
                    raise ValueError(f"/load schema_version {doc.get('schema_version')!r}, this code reads 1")
                self.doc, self.etag = doc, resp.headers.get("ETag", "")
                self.refreshed = float(resp.headers.get("X-Load-Refreshed", doc["time"]))
        except urllib.error.HTTPError as exc:
            if exc.code != 304 or self.doc is None:
                raise
            self.not_modified += 1
            self.refreshed = float(exc.headers.get("X-Load-Refreshed", self.refreshed))
        assert self.doc is not None
        return self.doc


def candidates(doc: dict[str, Any], refreshed: float, stale: float = 2.0) -> list[tuple[int, dict[str, Any]]]:
    """The engines a request may go to: those ``up`` with data at most *stale* seconds old (the
    document's ages are as of its ``time``; the exporter confirmed them at *refreshed*); when
    there is none, the ``stale`` ones (up, a flush or more behind: better than no engine); never
    a ``down`` one. A document without ``state`` (an older exporter) is read by ``up``."""
    fresh, behind = [], []
    for name, engine in doc["engines"].items():
        state = engine.get("state", "up" if engine["up"] else "down")
        age = engine["age_seconds"] + max(0.0, refreshed - doc["time"])
        if state == "up" and age <= stale:
            fresh.append((int(name), engine))
        elif state == "stale":
            behind.append((int(name), engine))
    return fresh or behind


def pick(doc: dict[str, Any], refreshed: float, stale: float = 2.0) -> int | None:
    """The engine to send the next request to, or None when no engine qualifies."""

    def cost(item: tuple[int, dict[str, Any]]) -> tuple[float, float, float, int]:
        engine, load = item
        return (
            load["requests_waiting"] or 0.0,
            load["kv_cache_usage"] or 0.0,
            load["requests_running"] or 0.0,
            engine,
        )

    found = candidates(doc, refreshed, stale)
    return min(found, key=cost)[0] if found else None


def main() -> None:
    """Poll, pick, print: ``--count`` times, every ``--every`` seconds."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url", help="the exporter, e.g. http://127.0.0.1:9400")
    parser.add_argument("--every", type=float, default=0.05, help="seconds between two polls")
    parser.add_argument("--count", type=int, default=20, help="polls, then exit")
    parser.add_argument(
        "--stale", type=float, default=2.0, help="seconds after which an engine's data is unknown"
    )
    opts = parser.parse_args()
    client = LoadClient(opts.url)
    for _ in range(opts.count):
        doc = client.poll()
        fleet = doc["fleet"]
        print(
            f"send to engine {pick(doc, client.refreshed, opts.stale)}; "
            f"{fleet['engines_up']}/{fleet['engines']} up, waiting {fleet['requests_waiting']['sum']}, "
            f"KV max {fleet['kv_cache_usage']['max']}, 304s {client.not_modified}"
        )
        time.sleep(opts.every)


if __name__ == "__main__":
    main()
