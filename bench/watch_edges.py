"""The watch feed at its edges (issue 46), before and after in the same run: a store outage in the
middle of a stream, and the memory of 1,000 subscribers that come and leave.

``python bench/watch_feed.py --edges [--before /tmp/feed_main]`` (or this file directly). Two
``redis-stats exporter`` processes run side by side on one private Redis and one fleet: *before*
from another checkout (``--before``, e.g. ``git archive bbd4dee | tar -x -C /tmp/feed_main``),
*after* from this one. Writers of ``--engines`` engines with the load lane (this checkout's: the
writer is the same on both sides) change ``vllm:num_requests_waiting`` every ``--every`` s.

1. **Outage**: one Server-Sent Events subscriber per exporter records every event. For
   ``--phase`` s the changes flow (set() -> seen, p50/p99); then Redis stops (its data kept) for
   ``--outage`` s: time to an ``unknown`` event on the stream, and what ``GET /watch`` answers
   meanwhile; then Redis starts again: time to the whole state (``event: state``) or to the first
   new value seen, and set() -> seen p50/p99 after.
2. **Memory**: each exporter's resident size at rest; ``--subscribers`` streams opened (raw
   sockets, as many routers), the fleet changing for ``--flood`` s (the history fills); the
   peak; the streams closed; the size 75 s after (the feeds' idle time is 60 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis, free_port  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Exporter:
    """A ``redis-stats exporter`` process of one checkout."""

    def __init__(self, name: str, tree: Path, redis_url: str, namespace: str, streams: int) -> None:
        self.name, self.port = name, free_port()
        limits = ["--max-connections", "64", "--max-streams", str(streams)]
        if name == "before":  # no stream slots there: the streams take request slots
            limits = ["--max-connections", str(streams + 64)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        command = [sys.executable, "-m", "redis_stats", "exporter", "--redis-url", redis_url]
        command += ["--namespace", namespace, "--port", str(self.port), "--load-refresh", "0.1", *limits]
        self.proc = subprocess.Popen(
            command,
            cwd=tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Follower(threading.Thread):
    """One SSE subscriber: every event with the time it arrived."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.stopped = False
        self.stream: Any = None

    def stop(self) -> None:
        """Leave the feed (the memory phase measures an exporter nobody follows any more)."""
        self.stopped = True
        with contextlib.suppress(AttributeError, OSError):  # the response's socket (CPython's)
            self.stream.fp.raw._sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        while not self.stopped:
            try:
                request = urllib.request.Request(self.url + "/watch", headers={"Accept": "text/event-stream"})
                with urllib.request.urlopen(request, timeout=60) as stream:
                    self.stream = stream
                    kind, data = "message", ""
                    for raw in stream:
                        line = raw.decode().rstrip("\n")
                        if line.startswith("event: "):
                            kind = line[7:]
                        elif line.startswith("data: "):
                            data = line[6:]
                        elif not line and data:
                            self.events.append((time.monotonic(), kind, json.loads(data)))
                            kind, data = "message", ""
            except OSError:
                time.sleep(0.1)  # reconnect, as a router does

    def seen(self, engine: int, value: float, after: float) -> float | None:
        for at, kind, doc in list(self.events):
            if at < after:
                continue
            docs = doc["engines"].values() if kind == "state" else [doc]
            if any(d.get("engine") == engine and d.get("requests_waiting") == value for d in docs):
                return at
        return None


def outage(
    opts: Any, server: EmbeddedRedis, exporters: list[Exporter], writers: list[StatsWriter]
) -> dict[str, Any]:
    followers = {x.name: Follower(x.url) for x in exporters}
    for f in followers.values():
        f.start()
    time.sleep(2.0)
    value = [1000]

    def changes(seconds: float) -> list[tuple[int, float, float]]:
        out = []
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            w = writers[i % len(writers)]
            value[0] += 1
            w.metric("vllm:num_requests_waiting").labels(w.engines[0], model_name="m").set(value[0])
            out.append((w.engines[0], float(value[0]), time.monotonic()))
            i += 1
            time.sleep(opts.every)
        return out

    def latencies(sets: list[tuple[int, float, float]], f: Follower) -> list[float]:
        time.sleep(1.0)
        return [s - at for e, v, at in sets if (s := f.seen(e, v, at)) is not None]

    result: dict[str, Any] = {name: {} for name in followers}
    sets = changes(opts.phase)
    for name, f in followers.items():
        lat = latencies(sets, f)
        result[name]["before_outage_ms"] = (1000 * pct(lat, 0.5), 1000 * pct(lat, 0.99), len(lat), len(sets))
    stopped = time.monotonic()  # (before: the exporter may see it go while stop() saves the data)
    server.stop(keep_data=True)
    answers: dict[str, set[int]] = {x.name: set() for x in exporters}
    while time.monotonic() - stopped < opts.outage:
        for x in exporters:
            answers[x.name].add(x.status("/watch"))
        time.sleep(0.25)
    for name, f in followers.items():
        first = next((at for at, kind, _ in f.events if at >= stopped and kind == "unknown"), None)
        result[name]["to_unknown_s"] = None if first is None else first - stopped
        result[name]["watch_whole_state_during_outage"] = sorted(answers[name])
    server.start()
    started = time.monotonic()
    sets = changes(opts.phase)
    for name, f in followers.items():
        state = next((at for at, kind, _ in f.events if at >= started and kind == "state"), None)
        first_new = min((s for e, v, at in sets[:5] if (s := f.seen(e, v, at)) is not None), default=None)
        result[name]["to_whole_state_s"] = None if state is None else state - started
        result[name]["to_first_new_value_s"] = None if first_new is None else first_new - started
        lat = latencies(sets, f)
        result[name]["after_outage_ms"] = (1000 * pct(lat, 0.5), 1000 * pct(lat, 0.99), len(lat), len(sets))
    for f in followers.values():
        f.stop()
    return result


def memory(opts: Any, exporters: list[Exporter], writers: list[StatsWriter]) -> dict[str, Any]:
    result: dict[str, Any] = {x.name: {"rest_mib": rss_mib(x.proc.pid)} for x in exporters}
    socks: list[socket.socket] = []
    for x in exporters:
        for _ in range(opts.subscribers):
            s = socket.create_connection(("127.0.0.1", x.port), timeout=10)
            s.sendall(b"GET /watch HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            socks.append(s)
    peak = {x.name: 0.0 for x in exporters}
    end = time.monotonic() + opts.flood
    value = 0
    while time.monotonic() < end:  # the fleet changes: the history fills
        for w in writers:
            value += 1
            w.metric("vllm:num_requests_waiting").labels(w.engines[0], model_name="m").set(value)
        for x in exporters:
            peak[x.name] = max(peak[x.name], rss_mib(x.proc.pid))
        for s in socks:  # read what came (the subscribers keep up)
            s.setblocking(False)
            try:
                while s.recv(1 << 16):
                    pass
            except OSError:
                pass
        time.sleep(0.05)
    for x in exporters:
        result[x.name]["open_streams_200"] = x.status("/metrics") == 200
    for s in socks:
        s.close()
    left = time.monotonic()
    for x in exporters:
        result[x.name]["peak_mib"] = peak[x.name]
    while time.monotonic() - left < 75:
        time.sleep(1)
    for x in exporters:
        result[x.name]["after_75s_mib"] = rss_mib(x.proc.pid)
    return result


def run(opts: Any) -> dict[str, Any]:
    with EmbeddedRedis() as server:
        namespace = "edges"
        cfg = StatsConfig(url=server.url, namespace=namespace, flush_interval=0.5, stale_after=10.0)
        writers = [
            StatsWriter(cfg.replace(endpoint=f"10.0.0.{e}:8000"), vllm_catalog(), engines=[e], load=VLLM_LOAD)
            for e in range(opts.engines)
        ]
        for w in writers:
            w.metric("vllm:num_requests_waiting").labels(w.engines[0], model_name="m").set(0)
            w.metric("vllm:num_requests_running").labels(w.engines[0], model_name="m").set(1)
            assert w.flush()
        exporters = [
            Exporter("before", Path(opts.before), server.url, namespace, opts.subscribers + 8),
            Exporter("after", ROOT, server.url, namespace, opts.subscribers + 8),
        ]
        try:
            out = {"outage": outage(opts, server, exporters, writers)}
            out["memory"] = memory(opts, exporters, writers)
        finally:
            for x in exporters:
                x.close()
            for w in writers:
                w.close()
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default="/tmp/feed_main", help="a checkout of the code to compare with")
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--every", type=float, default=0.1, help="seconds between two changes")
    p.add_argument("--phase", type=float, default=6.0, help="seconds of changes before and after")
    p.add_argument("--outage", type=float, default=6.0, help="seconds Redis is stopped")
    p.add_argument("--subscribers", type=int, default=1000)
    p.add_argument("--flood", type=float, default=20.0, help="seconds of changes with the subscribers on")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "watch_edges.json"))
    return p


def main(argv: list[str] | None = None) -> None:
    opts = parser().parse_args(argv)
    out = run(opts)
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps(out, indent=1))
    for name in ("before", "after"):
        o, m = out["outage"][name], out["memory"][name]
        print(
            f"{name}: changes p50/p99 ms (seen/set) before the outage {o['before_outage_ms']}, "
            f"after {o['after_outage_ms']}"
        )
        print(
            f"  outage: 'unknown' on the stream after {o['to_unknown_s']} s; GET /watch answered "
            f"{o['watch_whole_state_during_outage']}; back: whole state after {o['to_whole_state_s']} s, "
            f"first new value after {o['to_first_new_value_s']} s"
        )
        print(
            f"  memory: rest {m['rest_mib']:.1f} MiB, peak with {opts.subscribers} streams "
            f"{m['peak_mib']:.1f} MiB "
            f"(/metrics answered: {m['open_streams_200']}), 75 s after they left {m['after_75s_mib']:.1f} MiB"
        )


if __name__ == "__main__":
    main()
