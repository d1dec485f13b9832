"""Two exporter replicas over one store in a real Prometheus, scraped as deploy/kubernetes/ha says
(docs/kubernetes.md, "Running it highly available"): totals never doubled, no counter seen to
reset, and a replica killed loses nothing Prometheus stores.

The Kubernetes Service is played by a round-robin TCP proxy in front of both exporters (each new
connection to the next replica that accepts it, as kube-proxy sends to ready endpoints). Prometheus
gets the two jobs of the HA layout, with the metric relabelings read from its rendered manifests:
``redis-stats-exporter`` scrapes the Service address and drops the per-process series;
``redis-stats-exporter-replicas`` scrapes each replica and keeps only those.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from redis_stats import StatsConfig, StatsReader
from redis_stats.tools.embedded import EmbeddedRedis
from tests.conftest import sample_catalog

from ..conftest import ROOT
from ..tools.test_kubernetes import ha_scrapes
from .prometheus import Fleet, free_port, needs_prometheus, wait_for
from .test_alerts import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis_server, pytest.mark.slow]

STORE_SERIES = "requests_total"  # the test catalogue's counter, summed over engines


class Service:
    """A round-robin TCP proxy: each connection to the next backend that accepts it."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = free_port()
        self._next = 0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        for _ in range(len(self.backends)):
            port = self.backends[self._next % len(self.backends)]
            self._next += 1
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
                break
            except OSError:
                continue
        else:
            client.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()
        self._pump(client, upstream)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()


@needs_prometheus
def test_two_replicas_over_one_store_never_double_a_total(python_env, tmp_path):
    sc, sm, _ = ha_scrapes()
    service_relabel = [
        {"source_labels": r["sourceLabels"], "regex": r["regex"], "action": r["action"]}
        for r in sc["spec"]["metricRelabelings"]
    ]
    replica_relabel = [
        {"source_labels": r["sourceLabels"], "regex": r["regex"], "action": r["action"]}
        for r in sm["spec"]["endpoints"][0]["metricRelabelings"]
    ]
    service_job = sc["spec"]["staticConfigs"][0]["labels"]["job"]
    replicas_job = sm["spec"]["endpoints"][0]["relabelings"][0]["replacement"]

    redis_server = EmbeddedRedis().start()
    namespace = f"ha{os.getpid()}"
    fleet = Fleet(tmp_path)
    service = None
    try:
        env = {**python_env, "REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
        writers = []
        for engine in (0, 1):
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.helpers.endpoint_writer",
                    redis_server.url,
                    namespace,
                    str(engine),
                    "-",
                ],
                env=python_env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            fleet.procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            writers.append(proc)
        ports, exporters = [], []
        for name in ("a", "b"):
            port = free_port()
            proc = fleet.start(
                [sys.executable, "-m", "redis_stats", "exporter", "--port", str(port), "--gc-interval", "0"],
                env,
                f"exporter-{name}",
            )
            wait_for(f"http://127.0.0.1:{port}/healthz", f"exporter {name}", proc)
            ports.append(port)
            exporters.append(proc)
        service = Service(ports)

        # Either replica gives the same answer for the same store state (/load: the same ETag).
        def etags() -> set[str] | None:
            found = set()
            for p in ports:
                with urllib.request.urlopen(f"http://127.0.0.1:{p}/load", timeout=5) as resp:
                    found.add(resp.headers["ETag"])
            return found if len(found) == 1 else None

        wait_until("both replicas' /load the same", etags, 10)

        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": service_job,
                    "static_configs": [{"targets": [f"127.0.0.1:{service.port}"]}],
                    "metric_relabel_configs": service_relabel,
                },
                {
                    "job_name": replicas_job,
                    "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
                    "metric_relabel_configs": replica_relabel,
                },
            ],
        }
        api = fleet.prometheus(config)
        time.sleep(20)  # twenty scrapes of each job, each Service scrape by one replica or the other

        # Each replica answered some of the Service's scrapes: its own count, in its own job.
        served = api.by(
            f'redis_stats_exporter_scrape_duration_seconds_count{{job="{replicas_job}"}}', "instance"
        )
        assert len(served) == 2 and all(n >= 20 for n in served.values()), served
        # Every engine once; the store's series never in the replicas' job; the processes'
        # series only there, one per replica, and none of their counters seen to reset although
        # the Service alternates between two processes.
        assert api.by(f'count by (engine) (redis_stats_engine_up{{job="{service_job}"}})', "engine") == {
            "0": 1.0,
            "1": 1.0,
        }
        assert not api.query(f'{{job="{replicas_job}",__name__=~"{STORE_SERIES}|redis_stats_engine_up"}}')
        assert not api.query(f'{{job="{service_job}",__name__=~"process_.*|redis_stats_exporter_.*"}}')
        assert api.scalar(f'count(process_start_time_seconds{{job="{replicas_job}"}})') == 2
        assert api.scalar(f'sum(resets({STORE_SERIES}{{job="{service_job}"}}[1m]))') == 0
        assert (
            api.scalar(f'sum(resets(redis_stats_exporter_scrape_bytes_total{{job="{replicas_job}"}}[1m]))')
            == 0
        )

        # Totals: the writers close (their last flush lands), and Prometheus' sum is the store's.
        for proc in writers:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        snap = StatsReader(
            StatsConfig(url=redis_server.url, namespace=namespace), sample_catalog()
        ).snapshot()
        truth = sum(e.counter("requests", "stop") for e in snap.engines.values())
        assert truth > 100

        def prometheus_total() -> float | None:
            got = api.query(f'sum({STORE_SERIES}{{job="{service_job}"}})')
            return float(got[0]["value"][1]) if got and float(got[0]["value"][1]) == truth else None

        wait_until("Prometheus' total equal to the store's", prometheus_total, 15, seen=lambda: truth)

        # A replica killed: the Service's job stays up and its total stays the store's.
        exporters[0].kill()
        exporters[0].wait(10)
        killed_at = time.time()
        time.sleep(8)
        ups = api.query(f'min_over_time(up{{job="{service_job}"}}[7s])')
        assert float(ups[0]["value"][1]) == 1.0, ups
        assert api.scalar(f'sum({STORE_SERIES}{{job="{service_job}"}})') == truth
        assert api.scalar(f'min(count_over_time({STORE_SERIES}{{job="{service_job}"}}[7s]))') >= 5  # no gap
        down = api.by(f'up{{job="{replicas_job}"}}', "instance")
        assert sorted(down.values()) == [0.0, 1.0], down
        assert time.time() - killed_at < 30
    finally:
        if service is not None:
            service.close()
        fleet.stop()
        redis_server.close()
