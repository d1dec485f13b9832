"""A real Prometheus (Debian's package) scraping `redis-stats exporter` through its access control:
TLS with basic auth, TLS with a bearer token, TLS with a client certificate; and the same
exporter refusing the scrapes that do not authenticate (a wrong password, plain HTTP to the TLS
port), each seen as ``up 0``. ``promtool check web-config`` accepts the web configuration file the
exporter was started with: one file for node_exporter, promtool and redis_stats."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from redis_stats import StatsConfig, StatsWriter
from tests.certs import Certificates, bcrypt_hash, client_context, https_get
from tests.conftest import sample_catalog

from .test_prometheus import Fleet, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis_server, pytest.mark.slow]

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
PASSWORD = "e2e-pw-41c2"
TOKEN = "e2e-token-0123456789abcdef"


def _https_ready(port: int, ca: Path, proc: subprocess.Popen, headers: dict[str, str], cert=None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the exporter exited"
        try:
            if https_get(port, "/healthz", client_context(ca, cert), headers, timeout=2)[0] in (200, 503):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("the exporter did not answer over TLS")


def _query(prom: int, expr: str) -> dict[str, float]:
    url = f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    doc = json.loads(urllib.request.urlopen(url, timeout=10).read())
    return {r["metric"].get("job", ""): float(r["value"][1]) for r in doc["data"]["result"]}


@pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None, reason="no prometheus (make test-e2e installs it)"
)
def test_prometheus_scrapes_through_tls_basic_auth_bearer_tokens_and_client_certificates(
    redis_server, python_env, tmp_path
):
    certs = Certificates(tmp_path / "certs")
    certs.ca("ca")
    certs.ca("clients")
    certs.leaf("server")
    certs.leaf("prometheus", ca="clients", san="DNS:prometheus")
    namespace = f"e2e-web{os.getpid()}"
    writer = StatsWriter(
        StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog(), engines=[0], start=False
    )
    writer.metric("tokens").labels(0).inc(1234)
    assert writer.flush()

    # Exporter A: TLS, basic auth and bearer tokens; exporter B: TLS with client certificates.
    (tmp_path / "password").write_text(PASSWORD)
    (tmp_path / "token").write_text(TOKEN)
    tls = "tls_server_config:\n  cert_file: certs/server.pem\n  key_file: certs/server.key\n"
    web_a = tmp_path / "web-a.yml"
    web_a.write_text(
        tls + "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
        f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD, cost=10)}\n"
    )
    web_b = tmp_path / "web-b.yml"
    web_b.write_text(
        tls + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: certs/clients.pem\n"
    )
    for web in (web_a, web_b):  # the same file promtool accepts
        check = subprocess.run(
            [PROMTOOL, "check", "web-config", str(web)], capture_output=True, text=True, timeout=30
        )
        assert check.returncode == 0, check.stdout + check.stderr

    fleet = Fleet(tmp_path)
    env = {**python_env, "REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    try:
        ports = {"a": free_port(), "b": free_port()}
        exporter = [
            sys.executable,
            "-m",
            "redis_stats",
            "exporter",
            "--gc-interval",
            "0",
            "--web-open",
            "/healthz",
        ]
        a = fleet.start(
            [
                *exporter,
                "--port",
                str(ports["a"]),
                "--web-config-file",
                str(web_a),
                "--web-token-file",
                str(tmp_path / "token"),
            ],
            env,
            "exporter-a",
        )
        b = fleet.start(
            [*exporter, "--port", str(ports["b"]), "--web-config-file", str(web_b)], env, "exporter-b"
        )
        _https_ready(ports["a"], certs.dir / "ca.pem", a, {})
        _https_ready(
            ports["b"],
            certs.dir / "ca.pem",
            b,
            {},
            (certs.dir / "prometheus.pem", certs.dir / "prometheus.key"),
        )

        tls_config = {"ca_file": str(certs.dir / "ca.pem")}
        target_a = {"static_configs": [{"targets": [f"127.0.0.1:{ports['a']}"]}]}
        (tmp_path / "wrong").write_text("not-the-password")
        jobs = [
            {"job_name": "basic", "scheme": "https", "tls_config": tls_config,
             "basic_auth": {"username": "prometheus", "password_file": str(tmp_path / "password")},
             **target_a},
            {"job_name": "bearer", "scheme": "https", "tls_config": tls_config,
             "authorization": {"type": "Bearer", "credentials_file": str(tmp_path / "token")}, **target_a},
            {"job_name": "client_cert", "scheme": "https",
             "tls_config": {**tls_config, "cert_file": str(certs.dir / "prometheus.pem"),
                            "key_file": str(certs.dir / "prometheus.key")},
             "static_configs": [{"targets": [f"127.0.0.1:{ports['b']}"]}]},
            {"job_name": "wrong_password", "scheme": "https", "tls_config": tls_config,
             "basic_auth": {"username": "prometheus", "password_file": str(tmp_path / "wrong")}, **target_a},
            {"job_name": "no_credentials", "scheme": "https", "tls_config": tls_config, **target_a},
            {"job_name": "plain_http", **target_a},
            {"job_name": "no_client_cert", "scheme": "https", "tls_config": tls_config,
             "static_configs": [{"targets": [f"127.0.0.1:{ports['b']}"]}]},
        ]  # fmt: skip
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": jobs}
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))
        prom_port = free_port()
        prom = fleet.start(
            [
                PROMETHEUS,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            dict(os.environ),
            "prometheus",
        )
        wait_for(f"http://127.0.0.1:{prom_port}/-/ready", "prometheus", prom)
        deadline = time.monotonic() + 30
        up: dict[str, float] = {}
        while time.monotonic() < deadline:
            up = _query(prom_port, "up")
            if len(up) == len(jobs) and up.get("basic") == up.get("bearer") == up.get("client_cert") == 1:
                break
            time.sleep(0.5)
        assert up == {
            "basic": 1, "bearer": 1, "client_cert": 1,
            "wrong_password": 0, "no_credentials": 0, "plain_http": 0, "no_client_cert": 0,
        }  # fmt: skip
        # the store's data came through each authenticated scrape
        assert _query(prom_port, "tokens_total") == {"basic": 1234, "bearer": 1234, "client_cert": 1234}
        # the exporter counted the refusals it answered
        refused = _query(prom_port, 'redis_stats_exporter_unauthorized_requests_total{job="basic"}')
        assert refused["basic"] > 0
        handshakes = _query(
            prom_port, 'sum by (job) (redis_stats_exporter_tls_handshake_failures_total{job="client_cert"})'
        )
        assert handshakes["client_cert"] > 0
    finally:
        fleet.stop()
        writer.close()
    for name in ("exporter-a", "exporter-b"):  # no secret in what they printed
        log = (tmp_path / f"{name}.log").read_text()
        assert PASSWORD not in log and TOKEN not in log, log
