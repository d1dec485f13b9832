"""A real Prometheus (Debian's package) scraping `redis-stats exporter` through its access control:
TLS with basic auth, TLS with a bearer token, TLS with a client certificate; and the same
exporter refusing the scrapes that do not authenticate (a wrong password, plain HTTP to the TLS
port), each seen as ``up 0``. ``promtool check web-config`` accepts the web configuration file the
exporter was started with: one file for node_exporter, promtool and redis_stats."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redis_stats import StatsConfig, StatsWriter
from tests.certs import Certificates, bcrypt_hash, client_context, https_get
from tests.conftest import sample_catalog

from .prometheus import PROMETHEUS, PROMTOOL, Fleet, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.redis_server, pytest.mark.slow]

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
        api = fleet.prometheus(config)
        deadline = time.monotonic() + 30
        up: dict[str, float] = {}
        while time.monotonic() < deadline:
            up = api.by("up", "job")
            if len(up) == len(jobs) and up.get("basic") == up.get("bearer") == up.get("client_cert") == 1:
                break
            time.sleep(0.5)
        assert up == {
            "basic": 1, "bearer": 1, "client_cert": 1,
            "wrong_password": 0, "no_credentials": 0, "plain_http": 0, "no_client_cert": 0,
        }  # fmt: skip
        # the store's data came through each authenticated scrape
        assert api.by("tokens_total", "job") == {"basic": 1234, "bearer": 1234, "client_cert": 1234}
        # the exporter counted the refusals it answered: read through the authenticated jobs'
        # scrapes, whose last one may come before the first refused scrape did (a second apart)
        counted = {
            "basic": 'redis_stats_exporter_unauthorized_requests_total{job="basic"}',
            "client_cert": "sum by (job) "
            '(redis_stats_exporter_tls_handshake_failures_total{job="client_cert"})',
        }
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not all(seen.get(job, 0) > 0 for job in counted):
            seen = {job: api.by(query, "job").get(job, 0.0) for job, query in counted.items()}
            time.sleep(0.5)
        assert seen["basic"] > 0 and seen["client_cert"] > 0, seen
    finally:
        fleet.stop()
        writer.close()
    for name in ("exporter-a", "exporter-b"):  # no secret in what they printed
        log = (tmp_path / f"{name}.log").read_text()
        assert PASSWORD not in log and TOKEN not in log, log


def test_prometheus_scrapes_the_top_tenants_with_a_bearer_token_and_the_total_stays_exact(
    redis_server, python_env, tmp_path
):
    """With --usage, /metrics carries the usage ledger's top tenants and one (other) series: a real
    Prometheus with the token gets them and their sum is the ledger's exact total; without the
    token it gets nothing (up 0): the tenants are business data."""
    from redis_stats.usage import Usage, UsageRecorder

    namespace = f"e2e-usage{os.getpid()}"
    writer = StatsWriter(StatsConfig(url=redis_server.url, namespace=namespace), start=False)
    usage = UsageRecorder(writer)
    for i in range(40):
        usage.record(
            Usage(tenant=f"team-{i % 8}", adapter=None, model="m", prompt_tokens=i, generation_tokens=i + 1)
        )
    assert writer.flush()
    (tmp_path / "token").write_text(TOKEN)
    fleet = Fleet(tmp_path)
    env = {**python_env, "REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    try:
        port = free_port()
        args = [sys.executable, "-m", "redis_stats", "exporter", "--gc-interval", "0", "--port", str(port)]
        args += ["--usage", "--usage-top", "3", "--web-token-file", str(tmp_path / "token")]
        fleet.start(args, env, "exporter")
        target = {"static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        bearer = {"type": "Bearer", "credentials_file": str(tmp_path / "token")}
        jobs = [
            {"job_name": "bearer", "authorization": bearer, **target},
            {"job_name": "no_credentials", **target},
        ]
        api = fleet.prometheus(
            {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": jobs}
        )
        deadline = time.monotonic() + 40
        up: dict[str, float] = {}
        while time.monotonic() < deadline:
            up = api.by("up", "job")
            if up.get("bearer") == 1 and api.by("redis_stats_usage_generation_tokens_total", "tenant"):
                break
            time.sleep(0.5)
        assert up == {"bearer": 1, "no_credentials": 0}, up
        tenants = api.by("redis_stats_usage_generation_tokens_total", "tenant")
        assert len(tenants) == 4 and "(other)" in tenants, tenants  # the top 3 and the rest
        assert sum(tenants.values()) == sum(i + 1 for i in range(40))
        assert api.scalar("redis_stats_usage_tenants") == 8
    finally:
        fleet.stop()
        writer.close()
