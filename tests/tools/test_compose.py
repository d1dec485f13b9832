"""compose/ without Docker: files well-formed, every mount exists, every queried metric exists."""

import json
import re

import yaml

from redis_stats.integrations.vllm import vllm_catalog
from tests.conftest import ROOT

COMPOSE = ROOT / "compose"
SELF_METRICS = {
    "redis_stats_up",
    "redis_stats_engine_up",
    "redis_stats_engine_data_age_seconds",
    "redis_stats_read_errors_total",
    "redis_stats_read_duration_seconds",
    "redis_stats_skipped_fields",
    "redis_stats_namespace_info",
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


# Services whose /metrics shows every engine of the namespace: one of them is the fleet's view.
ALL_ENGINE_VIEWS = {"exporter", "node0", "node1", "lb"}
# What each image has to run a healthcheck with (static: no Docker engine on the test machines).
HEALTH_TOOLS = {
    "redis:": "redis-cli",
    "nginx:": "wget",
    "prom/prometheus:": "wget",
    "grafana/grafana:": "wget",
    None: "python",  # built from compose/Dockerfile (python:3.11-slim)
}


def _published(svc: dict) -> list[tuple[str, str]]:
    """(host address, host port) of every published port (short and long syntax)."""
    out = []
    for port in svc.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip", "0.0.0.0"), str(port.get("published", ""))))
            continue
        parts = str(port).split(":")
        out.append(("0.0.0.0", parts[0]) if len(parts) <= 2 else (parts[0], parts[1]))
    return out


def test_only_loopback_ports_and_redis_unpublished():
    services = compose_file()["services"]
    assert "ports" not in services["redis"], "Redis has no password here: never publish it"
    published = {name: _published(svc) for name, svc in services.items()}
    for name, ports in published.items():
        for host, port in ports:
            assert host == "127.0.0.1", f"{name} publishes {port} on {host}: loopback only by default"
    opened = {name for name, ports in published.items() if ports}
    assert opened == {"grafana", "prometheus", "exporter", "lb"}


def test_every_service_has_a_healthcheck_its_image_can_run():
    services = compose_file()["services"]
    for name, svc in services.items():
        check = svc.get("healthcheck")
        assert check and check["test"][0] == "CMD", f"{name} has no exec-form healthcheck"
        image = svc.get("image")
        prefix = next((p for p in HEALTH_TOOLS if p and image and image.startswith(p)), None)
        tool = HEALTH_TOOLS[prefix]
        assert check["test"][1] == tool, f"{name}: {check['test'][1]} is not in its image ({tool} is)"
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert cond == {"condition": "service_healthy"}, f"{name} starts before {dep} is healthy"


def test_prometheus_scrapes_one_view_of_the_fleet_once():
    doc = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    scraped = [
        (job["job_name"], t.split(":")[0])
        for job in doc["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    ]
    views = [s for s in scraped if s[1] in ALL_ENGINE_VIEWS]
    # Two all-engine views in Prometheus store every engine twice: sum(rate(...)) comes out doubled.
    assert len(views) == 1, f"several all-engine views scraped: {views}"
    assert len({t for _, t in scraped}) == len(scraped)


def test_grafana_dashboard_is_importable_with_variables_and_one_unit_per_panel():
    dash = json.loads((COMPOSE / "grafana/dashboards/redis_stats_fleet.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert {"job", "namespace", "model", "engine"} <= set(variables)
    assert not variables["job"]["multi"] and not variables["job"]["includeAll"]  # one view, never summed
    text = json.dumps(dash)
    assert '"uid": "prometheus"' not in text  # no hard-coded datasource: importable anywhere
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        exprs = [t["expr"] for t in panel["targets"]]
        for expr in exprs:
            assert 'job="$job"' in expr and 'redis_stats_namespace=~"$namespace"' in expr, (
                panel["title"],
                expr,
            )
            if "engine" in expr:
                assert 'engine=~"$engine"' in expr, (panel["title"], expr)
        # One unit per panel: 0/1 metrics never share a panel (an axis) with a duration.
        kinds = {"up" if re.search(r"_up\{", e) else "other" for e in exprs}
        assert len(kinds) == 1, panel["title"]
        unit = panel["fieldConfig"]["defaults"]["unit"]
        if kinds == {"up"}:
            assert unit == "none" and panel["fieldConfig"]["defaults"]["max"] == 1
        if any(("_seconds" in e and "histogram_quantile" in e) or "age_seconds" in e for e in exprs):
            assert unit == "s", panel["title"]


# --- every variable and panel query of the dashboard against a live exporter's series ---

# Labels Prometheus adds to every scraped series (target labels), whatever the exporter serves.
TARGET_LABELS = {"job": "redis_stats", "instance": "exporter:9400"}
# ... and the label the sliced layout's scrape config adds to each slice's target (docs/kubernetes.md).
SLICED_TARGET_LABELS = {"slice"}
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


def live_series(config, fake_client) -> list[tuple[str, dict[str, str]]]:
    """(sample name, labels) of every sample a live `redis-stats exporter` serves for a busy fleet,
    with the target labels Prometheus adds."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from redis_stats import StatsReader, StatsWriter
    from redis_stats.integrations.vllm import VllmRecorder
    from redis_stats.integrations.vllm.summary import VLLM_FLEET_SUMMARY
    from redis_stats.server import Exporter
    from tests.vllm_shapes import finished, iteration, scheduler

    cat = vllm_catalog()
    writer = StatsWriter(config, cat, engines=[0, 1], client=fake_client(), start=False)
    recorder = VllmRecorder(writer, "tiny-llama", [0, 1])
    for engine in (0, 1):
        recorder.record(
            scheduler(running=2, waiting=1, kv=0.5),
            iteration(prompt=50, generation=20, ttft=[0.05], itl=[0.01] * 5, done=[finished("stop")]),
            engine_idx=engine,
        )
    assert writer.flush()
    exporter = Exporter(
        StatsReader(config, cat, client=fake_client()), port=0, summary=VLLM_FLEET_SUMMARY, self_metrics=True
    ).start()
    try:
        with urllib.request.urlopen(f"{exporter.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        exporter.close()
        writer._closed = True
    return [
        (s.name, {**s.labels, **TARGET_LABELS})
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _matches(labels: dict[str, str], matchers: str) -> bool:
    for m in MATCHER.finditer(matchers):
        name, op, value = m.groups()
        have = labels.get(name, "")  # PromQL: an absent label is the empty string
        ok = {
            "=": have == value,
            "!=": have != value,
            "=~": re.fullmatch(value, have) is not None,
            "!~": re.fullmatch(value, have) is None,
        }[op]
        if not ok:
            return False
    return True


def selected(series, expr: str) -> list[tuple[str, list[dict[str, str]]]]:
    """Each selector of *expr*, with the live series it selects."""
    return [
        (
            f"{name}{{{matchers}}}",
            [labels for n, labels in series if n == name and _matches(labels, matchers)],
        )
        for name, matchers in SELECTOR.findall(expr)
    ]


def test_every_variable_and_panel_query_selects_series_a_live_exporter_serves(config, fake_client):
    """The name check above, with the labels too: every selector of every panel and variable
    selects series of a live exporter (Grafana's variables substituted with what a user picks),
    every label a query groups by is on them, and each variable lists the values served. Before,
    `namespace` was a label the exporter never served: empty under compose, and the Kubernetes
    namespace under the Prometheus Operator."""
    series = live_series(config, fake_client)
    dash = json.loads((COMPOSE / "grafana/dashboards/redis_stats_fleet.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"] if v["type"] == "query"}
    picked = {"job": "redis_stats", "namespace": config.namespace, "model": "tiny-llama", "engine": "1"}
    assert set(variables) == set(picked)

    def substitute(expr: str) -> str:
        used = set(re.findall(r"\$(\w+)", expr)) - {"__rate_interval"}
        assert used <= set(picked), (expr, used - set(picked))
        for name, value in picked.items():
            expr = expr.replace(f"${name}", value)
        return expr.replace("$__rate_interval", "1m")

    for name, variable in variables.items():
        query = variable["query"]["query"]
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert m, query
        selector, label = m.groups()
        if "{" in selector:
            found = [labels for _, sel in selected(series, substitute(selector)) for labels in sel]
        else:  # a bare metric name
            found = [labels for n, labels in series if n == selector]
        values = {labels[label] for labels in found if label in labels}
        assert picked[name] in values, f"variable {name}: {query} lists {sorted(values)} from a live exporter"
    assert {labels["redis_stats_namespace"] for n, labels in series if n == "redis_stats_namespace_info"} == {
        config.namespace
    }

    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = substitute(target["expr"])
            chosen = selected(series, expr)
            assert chosen, (panel["title"], expr)
            for selector, labels in chosen:
                # The selectors of series that carry their namespace (an exporter of several
                # namespaces: tests/e2e/test_dashboard_layouts.py) select none of a one-namespace
                # view's, which the other branch takes: no series is counted twice.
                several = 'redis_stats_namespace!=""' in selector
                assert bool(labels) != several, (
                    f"panel {panel['title']!r}: {selector} selects {len(labels)} series of a live exporter"
                )
            for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
                for label in filter(None, (x.strip() for x in clause.split(","))):
                    if label in SLICED_TARGET_LABELS:
                        continue
                    assert any(label in lab for _, sel in chosen for lab in sel), (panel["title"], label)
