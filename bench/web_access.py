"""What access control costs a scrape and a `/load` poll: plain HTTP against TLS, basic auth and
bearer tokens, in the same run, on the same exporter's store.

One private redis-server, N vLLM engines filled by the simulated API servers; four exporters over
it, each on its own port: plain HTTP (the baseline), TLS, TLS + basic auth (bcrypt cost 10, as
htpasswd -B makes it), TLS + a bearer token. Every request is a new connection, as Prometheus'
scrapes and a router's polls are against this server (HTTP/1.0: one request per connection), so
each TLS request pays a full handshake (ECDHE with an RSA-2048 certificate). Each variant is
timed in turns, round-robin, so that the machine's noise falls on all alike; the first basic-auth
request pays the bcrypt check once (its cost printed apart), the others hit the cache.

    python bench/web_access.py [--engines 64] [--requests 200]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import ssl
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import bcrypt
from http_exporter import fill

from redis_stats import StatsConfig, StatsReader
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.server import Exporter
from redis_stats.tools.embedded import EmbeddedRedis

PASSWORD = "bench-password"
TOKEN = "bench-token-0123456789abcdef"


def certificates(directory: Path) -> Path:
    """A CA and a server certificate for 127.0.0.1 (openssl); the CA's path."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ca",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server", "-keyout", "server.key",
        "-out", "server.csr")  # fmt: skip
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-extfile", "san.ext", "-out", "server.pem")  # fmt: skip
    return directory / "ca.pem"


def get(port: int, path: str, ctx: ssl.SSLContext | None, headers: dict[str, str]) -> float:
    """Seconds for one GET on a new connection (its handshake included), the body read."""
    started = time.perf_counter()
    conn = (
        http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
        if ctx is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    )
    conn.request("GET", path, headers={"Accept-Encoding": "gzip", **headers})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.status == 200, (path, resp.status)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=64)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    with EmbeddedRedis() as server, tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        ca = certificates(directory)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
        tls = f"tls_server_config:\n  cert_file: {directory}/server.pem\n  key_file: {directory}/server.key\n"
        (directory / "tls.yml").write_text(tls)
        (directory / "basic.yml").write_text(tls + f"basic_auth_users:\n  prometheus: {hashed}\n")
        (directory / "tokens").write_text(TOKEN + "\n")
        fill(server.url, "bench", args.engines)
        config = StatsConfig(url=server.url, namespace="bench")
        basic = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}
        ctx = ssl.create_default_context(cafile=str(ca))
        variants = {
            "plain HTTP": ({}, None, {}),
            "TLS": ({"web_config_file": str(directory / "tls.yml")}, ctx, {}),
            "TLS + basic auth": ({"web_config_file": str(directory / "basic.yml")}, ctx, basic),
            "TLS + bearer": (
                {"web_config_file": str(directory / "tls.yml"), "web_token_file": str(directory / "tokens")},
                ctx,
                {"Authorization": f"Bearer {TOKEN}"},
            ),
        }
        exporters = {
            name: Exporter(StatsReader(config, vllm_catalog()), port=0, **options).start()
            for name, (options, _, _) in variants.items()
        }
        try:
            first = get(exporters["TLS + basic auth"].port, "/healthz", ctx, basic)
            print(
                f"engines {args.engines}; first basic-auth request (one bcrypt check, cost 10): "
                f"{first * 1e3:.1f} ms"
            )
            for path in ("/metrics", "/load"):
                times: dict[str, list[float]] = {name: [] for name in variants}
                for name, (_, c, headers) in variants.items():  # warm: the /load refresher, the window
                    get(exporters[name].port, path, c, headers)
                for _ in range(args.requests if path == "/load" else max(10, args.requests // 10)):
                    for name, (_, c, headers) in variants.items():
                        times[name].append(get(exporters[name].port, path, c, headers))
                base = statistics.median(times["plain HTTP"])
                print(f"\n{path} ({len(times['plain HTTP'])} requests each, a new connection each)")
                print(f"{'variant':<20}{'median ms':>11}{'p90 ms':>9}{'x plain':>9}{'+ ms':>8}")
                for name, found in times.items():
                    med = statistics.median(found)
                    p90 = statistics.quantiles(found, n=10)[-1]
                    print(
                        f"{name:<20}{med * 1e3:>11.2f}{p90 * 1e3:>9.2f}{med / base:>9.2f}"
                        f"{(med - base) * 1e3:>8.2f}"
                    )
        finally:
            for exporter in exporters.values():
                exporter.close()


if __name__ == "__main__":
    main()
