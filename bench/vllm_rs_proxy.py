"""What a proxy in front of vLLM's Rust front end costs in the data path (issue 46): direct, against
the shipped nginx and HAProxy configurations and ``redis-stats load-proxy`` as it was (before it
was retired), in the same run.

Every path ends at the same upstream: for plain completions a fast stand-in of vllm-rs (an nginx
answering every request with a fixed completion: the Rust front end answers far faster than a
Python stand-in could, and a slow upstream would hide the proxy's cost), for streamed ones the
Python stand-in (tests/helpers/vllm_rs.py: one Server-Sent Event per token). Measured, per path:

- latency of one completion request on a kept connection, one at a time: p50 and p99 over
  ``--requests`` (interleaved in rounds, so each path sees the same moments of a shared machine);
  the proxy's added latency is its p50 minus direct's;
- time to the first streamed token (the first ``data:`` event of a streamed completion): p50, p99;
- requests per second at saturation (``wrk``, one thread, ``--connections`` kept connections,
  ``--seconds`` each) and the proxy's own CPU per request over that run (its processes' user +
  system time from /proc);
- a router's poll (``GET /get_load``) through each proxy: p50, p99 (the proxies to the exporter's
  view; load-proxy answered from Redis itself, one read kept 1 s).

Each proxy runs one worker (nginx ``worker_processes 1``, HAProxy ``nbthread 1``, load-proxy one
event loop), as the upstream does. load-proxy is run from ``git show REF:...load_proxy.py``
(``--before``, the commit it was retired after) in a process of its own.

Needs nginx, haproxy and wrk (Debian packages: ``apt-get install nginx haproxy wrk``).

Usage: python bench/vllm_rs_proxy.py [--requests 2000] [--seconds 4] [--connections 32]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_stats import StatsConfig  # noqa: E402
from redis_stats.integrations.bridge import BridgedSource  # noqa: E402
from redis_stats.integrations.vllm import vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.reader import StatsReader  # noqa: E402
from redis_stats.server.exporter import Exporter  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis, free_port, tied_to_me  # noqa: E402
from tests.helpers.front_proxy import FrontProxy, HAProxy, Nginx, wait_listening  # noqa: E402
from tests.helpers.vllm_rs import Engine, VllmRs  # noqa: E402

COMPLETION = json.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "text": "fast", "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
REQUEST = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 1}).encode()
STREAMED = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 4, "stream": True}).encode()


def post(target: str, body: bytes) -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: pod\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Fast(FrontProxy):
    """The fast stand-in of vllm-rs: nginx answering every request with :data:`COMPLETION`,
    keeping connections open (as hyper does)."""

    def __init__(self, workdir: Path, port: int) -> None:
        super().__init__(workdir, port, "", "")
        escaped = COMPLETION.replace("'", "\\'")
        user = "user root;\n" if os.geteuid() == 0 else ""
        temp = "".join(
            f"    {k}_temp_path {workdir}/{k};\n"
            for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        (workdir / "nginx.conf").write_text(
            f"{user}worker_processes 1;\npid {workdir}/nginx.pid;\nerror_log {self.log} warn;\n"
            "events { worker_connections 4096; }\n"
            f"http {{\n    access_log off;\n{temp}    keepalive_requests 1000000;\n"
            f"    server {{\n        listen 127.0.0.1:{port};\n"
            f"        location / {{ default_type application/json; return 200 '{escaped}'; }}\n"
            "    }\n}\n"
        )

    def command(self) -> list[str]:
        return [
            nginx_binary(),
            "-p",
            str(self.workdir),
            "-c",
            str(self.workdir / "nginx.conf"),
            "-g",
            "daemon off;",
        ]


def nginx_binary() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


class BeforeLoadProxy:
    """``redis-stats load-proxy`` of commit *ref* (its module from git), answering for *config*'s
    namespace at 127.0.0.1:*port* in front of *upstream*, in a process of its own."""

    def __init__(self, ref: str, workdir: Path, port: int, upstream: str, config: StatsConfig) -> None:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:redis_stats/integrations/vllm/load_proxy.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (workdir / "before_load_proxy.py").write_text(source)
        runner = workdir / "run.py"
        runner.write_text(
            "import asyncio, sys\n"
            f"sys.path[:0] = [{str(workdir)!r}, {str(ROOT)!r}]\n"
            "from before_load_proxy import LoadProxy\n"
            "from redis_stats import StatsConfig\n"
            "async def main():\n"
            f"    cfg = StatsConfig(url={config.url!r}, namespace={config.namespace!r},\n"
            f"                      endpoint='127.0.0.1:{port}')\n"
            f"    await LoadProxy(cfg, {upstream!r}, host='127.0.0.1', port={port}).start()\n"
            "    await asyncio.Event().wait()\n"
            "asyncio.run(main())\n"
        )
        self.port, self.workdir = port, workdir
        with open(workdir / "stdout.log", "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(runner)], stdout=out, stderr=subprocess.STDOUT, preexec_fn=tied_to_me()
            )
        wait_listening(port, self.process, workdir / "stdout.log")

    def pids(self) -> list[int]:
        return [self.process.pid]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of *pids* so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


class Client:
    """One kept connection, one request at a time, responses framed by Content-Length or chunks;
    a response that says ``Connection: close`` costs the next request a new connection (what any
    client of that server pays)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.buffer = b""

    def _more(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        self.buffer += chunk

    def exchange(self, data: bytes, first: bytes | None = None) -> float:
        """Seconds from sending *data* to the whole response (to the first *first* in the body)."""
        start = time.perf_counter()
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(data)
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert head.split(b" ", 2)[1] == b"200", head
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        if length:
            n = int(length.group(1))
            while len(self.buffer) < n:
                self._more()
            self.buffer = self.buffer[n:]
            seen = time.perf_counter() - start
        else:
            seen = None
            while not self.buffer.endswith(b"\r\n0\r\n\r\n"):
                if seen is None and first is not None and first in self.buffer:
                    seen = time.perf_counter() - start
                self._more()
            if seen is None:
                seen = time.perf_counter() - start
            self.buffer = b""
        if re.search(rb"(?i)\r\nconnection: *close", head):
            self.close()
        return seen

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buffer = None, b""


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def interleaved(
    ports: dict[str, int], data: bytes, total: int, rounds: int, first: bytes | None = None
) -> dict[str, list[float]]:
    """*total* exchanges of *data* per path, in *rounds* interleaved rounds, on one kept connection each."""
    out: dict[str, list[float]] = {name: [] for name in ports}
    clients = {name: Client(port) for name, port in ports.items()}
    try:
        for client in clients.values():  # warm: connections up, upstream connections pooled
            for _ in range(20):
                client.exchange(data, first)
        for _ in range(rounds):
            for name, client in clients.items():
                out[name] += [client.exchange(data, first) for _ in range(total // rounds)]
    finally:
        for client in clients.values():
            client.close()
    return out


def saturate(port: int, seconds: int, connections: int, workdir: Path) -> float:
    """Requests per second wrk reaches on completion requests."""
    script = workdir / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(REQUEST.decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    done = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}/v1/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", done.stdout)
    assert errors is None, done.stdout
    return float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1))


def h11_floor(requests: int = 20000, tokens: int = 50000) -> tuple[float, float]:
    """CPU microseconds h11 (the HTTP/1.1 parser under uvicorn and httpcore) spends framing one
    completion through a proxy (the request parsed from the client and written to the upstream,
    the response parsed and written back), and one streamed token (a chunk parsed and written):
    no socket, no event loop, what any correct Python proxy spends at least."""
    import h11

    body = REQUEST
    request = post("/v1/completions", body)
    answer = COMPLETION.encode()
    response = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(answer),
        answer,
    )
    client_side, upstream = h11.Connection(h11.SERVER), h11.Connection(h11.CLIENT)

    def one() -> None:
        client_side.receive_data(request)
        head, data, _end = client_side.next_event(), client_side.next_event(), client_side.next_event()
        upstream.send(h11.Request(method=head.method, target=head.target, headers=head.headers))
        upstream.send(h11.Data(data=data.data))
        upstream.send(h11.EndOfMessage())
        upstream.receive_data(response)
        status, data, _end = upstream.next_event(), upstream.next_event(), upstream.next_event()
        client_side.send(h11.Response(status_code=status.status_code, headers=status.headers))
        client_side.send(h11.Data(data=data.data))
        client_side.send(h11.EndOfMessage())
        client_side.start_next_cycle()
        upstream.start_next_cycle()

    for _ in range(1000):
        one()
    start = time.process_time()
    for _ in range(requests):
        one()
    per_request = (time.process_time() - start) / requests
    # A stream: its head through, then each token's chunk parsed from the upstream and written.
    upstream.send(
        h11.Request(
            method="POST", target="/v1/completions", headers=[("Host", "pod"), ("Content-Length", "0")]
        )
    )
    upstream.send(h11.EndOfMessage())
    client_side.receive_data(b"POST /v1/completions HTTP/1.1\r\nHost: pod\r\nContent-Length: 0\r\n\r\n")
    client_side.next_event(), client_side.next_event()
    upstream.receive_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    upstream.next_event()
    client_side.send(h11.Response(status_code=200, headers=[("Transfer-Encoding", "chunked")]))
    choice = {"index": 0, "text": "t0", "logprobs": None, "finish_reason": None}
    doc = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice]}
    event = b"data: " + json.dumps(doc).encode() + b"\n\n"  # as the stand-in streams them
    chunk = b"%x\r\n%s\r\n" % (len(event), event)
    start = time.process_time()
    for _ in range(tokens):
        upstream.receive_data(chunk)
        data = upstream.next_event()
        upstream.next_event()  # NEED_DATA
        client_side.send(h11.Data(data=data.data))
    return per_request * 1e6, (time.process_time() - start) / tokens * 1e6


def relay_cost(port: int, pids: list[int], tokens: int) -> float:
    """CPU microseconds of *pids* per token of one stream of *tokens* tokens written back to back."""
    client = Client(port)
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": tokens, "stream": True}).encode()
    before = cpu_seconds(pids)
    client.exchange(post("/v1/completions", body))
    client.close()
    return (cpu_seconds(pids) - before) / tokens * 1e6


class Setup:
    """Every path of the run: the upstreams, the exporter, each proxy in front of each upstream,
    and a bridged engine under each proxy's endpoint (for its polls)."""

    NAMES = ("nginx", "haproxy", "load-proxy")

    def __init__(self, root: Path, url: str, before: str) -> None:
        self.root, self.started, self.bridges = root, [], []
        self.cfg = StatsConfig(url=url, namespace="proxy-bench")
        self.slow = VllmRs("stand-in", {0: Engine(running=3, waiting=1)}, token_interval=0.005).start()
        (root / "fast").mkdir()
        self.fast = Fast(root / "fast", free_port()).start()
        self.exporter = Exporter(StatsReader(self.cfg, vllm_catalog()), port=0, host="127.0.0.1").start()
        self.started += [self.slow, self.fast, self.exporter]
        # ports by upstream ("fast", "slow") then path ("direct" and each proxy)
        self.ports: dict[str, dict[str, int]] = {
            "fast": {"direct": self.fast.port},
            "slow": {"direct": self.slow.port},
        }
        self.procs: dict[str, dict[str, Any]] = {"fast": {}, "slow": {}}
        for upstream, address in (("fast", self.fast.port), ("slow", self.slow.port)):
            for name in self.NAMES:
                port = free_port()
                workdir = root / f"{name}-{upstream}"
                workdir.mkdir()
                views = f"127.0.0.1:{self.exporter.port}"
                if name == "nginx":
                    proxy: Any = Nginx(workdir, port, f"127.0.0.1:{address}", views).start()
                elif name == "haproxy":
                    proxy = HAProxy(workdir, port, f"127.0.0.1:{address}", views, threads=1).start()
                else:
                    proxy = BeforeLoadProxy(before, workdir, port, f"127.0.0.1:{address}", self.cfg)
                self.started.append(proxy)
                self.ports[upstream][name], self.procs[upstream][name] = port, proxy
                if upstream == "fast":
                    self.bridges.append(
                        BridgedSource(  # one source each (a query tells them apart)
                            f"http://{self.slow.address}/metrics?pod={name}",
                            self.cfg.replace(endpoint=f"127.0.0.1:{port}", engine_offset=len(self.bridges)),
                            engine_label="engine",
                            known=vllm_catalog(),
                            load=VLLM_LOAD,
                        )
                    )

    def bridge(self) -> None:
        """Fresh numbers under each proxy's endpoint, served once the views have read them."""
        for bridge in self.bridges:
            assert bridge.scrape()
        time.sleep(1.5)  # the exporter's feed, and load-proxy's answer kept 1 s

    def close(self) -> None:
        for item in [*self.started, *self.bridges]:
            item.close()


def measure(setup: Setup, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per path (direct first)."""
    fast, slow = setup.ports["fast"], setup.ports["slow"]
    lat = interleaved(fast, post("/v1/completions", REQUEST), args.requests, args.rounds)
    ttft = interleaved(slow, post("/v1/completions", STREAMED), args.streams, args.rounds, first=b"data: ")
    setup.bridge()
    proxies = {n: p for n, p in fast.items() if n != "direct"}
    polls = interleaved(proxies, b"GET /get_load HTTP/1.1\r\nHost: pod\r\n\r\n", args.polls, args.rounds)
    setup.slow.token_interval = 0.0
    relay = {name: relay_cost(slow[name], setup.procs["slow"][name].pids(), args.tokens) for name in proxies}
    rps: dict[str, list[float]] = {name: [] for name in fast}
    cpu: dict[str, list[float]] = {name: [] for name in proxies}
    for _ in range(args.saturation_rounds):
        for name, port in fast.items():
            pids = setup.procs["fast"][name].pids() if name in proxies else []
            before = cpu_seconds(pids)
            rate = saturate(port, args.seconds, args.connections, setup.root)
            rps[name].append(rate)
            if pids:
                cpu[name].append((cpu_seconds(pids) - before) / (rate * args.seconds))
    base, base_ttft = percentiles(lat["direct"])[0], percentiles(ttft["direct"])[0]
    base_rps = statistics.median(rps["direct"])
    rows = []
    for name in fast:
        (p50, p99), (t50, t99) = percentiles(lat[name]), percentiles(ttft[name])
        row: dict[str, Any] = {
            "path": name,
            "latency_p50_ms": p50 * 1e3,
            "latency_p99_ms": p99 * 1e3,
            "added_p50_ms": (p50 - base) * 1e3,
            "ttft_p50_ms": t50 * 1e3,
            "ttft_p99_ms": t99 * 1e3,
            "added_ttft_p50_ms": (t50 - base_ttft) * 1e3,
            "rps": statistics.median(rps[name]),
            "rps_ratio": statistics.median(rps[name]) / base_rps,
        }
        if name in proxies:
            g50, g99 = percentiles(polls[name])
            row.update(
                cpu_us_per_request=statistics.median(cpu[name]) * 1e6,
                cpu_us_per_token=relay[name],
                poll_p50_ms=g50 * 1e3,
                poll_p99_ms=g99 * 1e3,
            )
        rows.append(row)
    return rows


def show(rows: list[dict[str, Any]], floor: tuple[float, float]) -> None:
    print(
        f"{'path':<11} {'p50 ms':>7} {'p99 ms':>7} {'+p50':>6} {'TTFT p50':>9} {'p99':>6} {'+p50':>6} "
        f"{'req/s':>7} {'ratio':>6} {'CPU us/req':>10} {'us/token':>8} {'poll p50':>8} {'p99':>6}"
    )
    for r in rows:
        extra = f"{'-':>10} {'-':>8} {'-':>8} {'-':>6}"
        if "poll_p50_ms" in r:
            extra = (
                f"{r['cpu_us_per_request']:>10.0f} {r['cpu_us_per_token']:>8.1f} "
                f"{r['poll_p50_ms']:>8.2f} {r['poll_p99_ms']:>6.2f}"
            )
        print(
            f"{r['path']:<11} {r['latency_p50_ms']:>7.3f} {r['latency_p99_ms']:>7.3f} "
            f"{r['added_p50_ms']:>6.3f} {r['ttft_p50_ms']:>9.2f} {r['ttft_p99_ms']:>6.2f} "
            f"{r['added_ttft_p50_ms']:>6.2f} {r['rps']:>7.0f} {r['rps_ratio']:>6.2f} {extra}"
        )
    print(
        f"h11's framing alone (no socket, no event loop): {floor[0]:.0f} us of CPU per request, "
        f"{floor[1]:.1f} per token"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="completions per path (latency)")
    parser.add_argument("--streams", type=int, default=300, help="streamed completions per path")
    parser.add_argument("--polls", type=int, default=300, help="GET /get_load per proxy")
    parser.add_argument("--tokens", type=int, default=20000, help="tokens of the stream relayed back to back")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4, help="each wrk run")
    parser.add_argument("--connections", type=int, default=32, help="wrk's kept connections")
    parser.add_argument("--saturation-rounds", type=int, default=3)
    parser.add_argument("--before", default="eecaad7", help="the commit whose load-proxy is measured")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "vllm_rs_proxy.json")
    args = parser.parse_args()
    for tool in ("nginx", "haproxy", "wrk"):
        if not (shutil.which(tool) or os.access(f"/usr/sbin/{tool}", os.X_OK)):
            sys.exit(f"{tool} is needed (apt-get install nginx haproxy wrk)")
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="vllm-rs-proxy-"))
    server = EmbeddedRedis().start()
    setup = None
    try:
        setup = Setup(root, server.url, args.before)
        setup.bridge()
        rows = measure(setup, args)
        floor = h11_floor()
        show(rows, floor)
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "cpus": os.cpu_count(),
            "load_average": {"before": load_before, "after": os.getloadavg()},  # 1, 5, 15 min
            "before": args.before,
            "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows,
            "h11_us_per_request": floor[0],
            "h11_us_per_token": floor[1],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        if setup is not None:
            setup.close()
        server.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
