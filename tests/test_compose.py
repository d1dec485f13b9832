"""compose/ without Docker: files well-formed, every mount exists, every queried metric exists."""

import json
import re

import yaml

from redis_stats.integrations.vllm import vllm_catalog

from .conftest import ROOT

COMPOSE = ROOT / "compose"
SELF_METRICS = {
    "redis_stats_up",
    "redis_stats_engine_up",
    "redis_stats_engine_data_age_seconds",
    "redis_stats_read_errors_total",
    "redis_stats_read_duration_seconds",
    "redis_stats_skipped_fields",
}


def compose_file() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def test_compose_services_and_mounts_exist():
    doc = compose_file()
    services = doc["services"]
    assert {"redis", "node0", "node1", "lb", "exporter", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE / source).is_file(), f"{name} mounts {source}, which does not exist"
        build = svc.get("build")
        if build:
            assert (COMPOSE / build["context"] / build["dockerfile"]).is_file(), name
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown service {dep}"
    ranks = [
        svc["command"][svc["command"].index("--first-engine") + 1]
        for svc in (services["node0"], services["node1"])
    ]
    assert ranks == ["0", "1"]


def test_prometheus_scrapes_services_that_exist():
    doc = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    services = compose_file()["services"]
    targets = [t for job in doc["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets
    for target in targets:
        assert target.split(":")[0] in services, target


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus():
    ds = yaml.safe_load((COMPOSE / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((COMPOSE / "grafana/provisioning/dashboards/redis_stats.yml").read_text())
    mounted = {v.split(":")[1] for v in compose_file()["services"]["grafana"]["volumes"]}
    dash_dir = provider["providers"][0]["options"]["path"]
    assert any(m.startswith(dash_dir + "/") for m in mounted)


def test_every_metric_the_dashboard_queries_is_defined():
    dash = json.loads((COMPOSE / "grafana/dashboards/redis_stats_fleet.json").read_text())
    known = set(SELF_METRICS)
    for spec in vllm_catalog():
        base = spec.name
        known |= {base + "_total"} if spec.kind == "counter" else {base}
        if spec.kind == "histogram":
            known |= {base + "_bucket", base + "_sum", base + "_count"}
    titles = {p["title"] for p in dash["panels"]}
    for needed in (
        "Generation throughput",
        "running / waiting",
        "KV cache",
        "first token",
        "Inter-token",
        "Engine up",
    ):
        assert any(needed in t for t in titles), needed
    queried = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            queried |= {m for m in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", target["expr"])}
    assert queried and queried <= known, queried - known
