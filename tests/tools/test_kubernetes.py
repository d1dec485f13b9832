"""deploy/kubernetes/ without a cluster: every manifest valid against the Kubernetes 1.30 schemas
(kubernetes-validate ships them; checked with the network blocked), the Prometheus Operator
resources structurally, and the properties an operator relies on: the Redis URL only from a
Secret, monitors that select what exists, and one copy of each engine in every layout."""

from __future__ import annotations

import socket
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the version docs/kubernetes.md states
LAYOUTS = {
    "fleet view (exporter)": KUBE,
    "per-pod views": KUBE / "per-pod-views",
    "sliced fleet view": KUBE / "sliced",
    "redis": KUBE / "redis",
}

_ENDPOINT = {
    "type": "object",
    "required": ["port"],
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "path": {"type": "string", "pattern": "^/"},
        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "params": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
        "relabelings": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "sourceLabels": {"type": "array", "items": {"type": "string"}},
                    "targetLabel": {"type": "string"},
                    "replacement": {"type": "string"},
                    "action": {"type": "string"},
                    "regex": {"type": "string"},
                },
            },
        },
    },
}
_SELECTOR = {
    "type": "object",
    "required": ["matchLabels"],
    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
}
# The fields of monitoring.coreos.com/v1 these manifests use (Prometheus Operator CRDs), no others.
MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"enum": ["ServiceMonitor", "PodMonitor"]},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": _SELECTOR,
                "namespaceSelector": {"type": "object"},
                "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
        },
    },
}


def kustomization(directory: Path) -> dict:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def resources(directory: Path) -> list[dict]:
    docs = []
    for name in kustomization(directory)["resources"]:
        path = (directory / name).resolve()
        assert path.is_file(), f"{directory}/kustomization.yaml lists {name}, which does not exist"
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def every_manifest() -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(KUBE.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def containers(doc: dict) -> list[dict]:
    return doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("schema validation tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_every_manifest_is_valid_kubernetes_offline(no_network):
    manifests = every_manifest()
    kinds = {d["kind"] for _, d in manifests}
    assert {"StatefulSet", "Deployment", "Service", "ServiceMonitor", "PodMonitor"} <= kinds
    for path, doc in manifests:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            jsonschema.Draft202012Validator(MONITOR_SCHEMA).validate(doc)
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.relative_to(ROOT)} {doc['kind']}/{doc['metadata']['name']}: {exc}")


def test_the_validator_is_not_vacuous(no_network):
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "imagee": "typo"}]}}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    bad_monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {"matchLabels": {}}, "endpoint": [{"port": "metrics"}]},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(MONITOR_SCHEMA).validate(bad_monitor)


def test_the_redis_url_comes_only_from_a_secret():
    for path, doc in every_manifest():
        for c in containers(doc):
            text = yaml.safe_dump({"args": c.get("args", []), "command": c.get("command", [])})
            assert "redis://" not in text and "rediss://" not in text and "--redis-url " not in text, path
            url = env_of(c).get("REDIS_STATS_URL")
            if url is not None:
                assert "value" not in url and url["valueFrom"]["secretKeyRef"]["key"] == "url", (
                    path,
                    c["name"],
                )
            for e in c.get("env", []):
                if "PASSWORD" in e["name"]:
                    assert "secretKeyRef" in e.get("valueFrom", {}), (path, e["name"])


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("layout", ["fleet view (exporter)", "per-pod views", "sliced fleet view"])
def test_each_layout_scrapes_every_engine_exactly_once(layout):
    docs = resources(LAYOUTS[layout])
    monitors = [d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert len(monitors) == 1, f"{layout}: {len(monitors)} monitors would store each engine that many times"
    (monitor,) = monitors
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    if monitor["kind"] == "ServiceMonitor":
        services = [
            d
            for d in docs
            if d["kind"] == "Service" and _selects(monitor["spec"]["selector"], d["metadata"]["labels"])
        ]
        assert len(services) == 1
        (service,) = services
        port_names = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
        scraped = [
            w
            for w in workloads
            if _selects(
                {"matchLabels": service["spec"]["selector"]}, w["spec"]["template"]["metadata"]["labels"]
            )
        ]
        endpoints = monitor["spec"]["endpoints"]
        target_ports = [port_names[e["port"]] for e in endpoints]
        slices = [e.get("params", {}).get("slice") for e in endpoints]
        if any(slices):
            # One exporter scraped as N targets: slices 0/N .. N-1/N, each once, each target
            # told apart by its own slice label (else their per-scrape series would collide).
            assert all(s and len(s) == 1 for s in slices), slices
            n = len(endpoints)
            assert sorted(s[0] for s in slices) == sorted(f"{i}/{n}" for i in range(n)), slices
            labels = [
                {r["targetLabel"]: r["replacement"] for r in e.get("relabelings", []) if "replacement" in r}
                for e in endpoints
            ]
            assert [lab.get("slice") for lab in labels] == [s[0] for s in slices]
        else:
            assert len(endpoints) == 1, "two endpoints of one exporter store every engine twice"
    else:
        scraped = [
            w
            for w in workloads
            if _selects(monitor["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
        ]
        target_ports = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
    assert len(scraped) == 1, layout
    (workload,) = scraped
    (container,) = [
        c for c in containers(workload) if {p["name"] for p in c.get("ports", [])} >= set(target_ports)
    ]
    env = env_of(container)
    if "REDIS_STATS_VIEW" in env or workload["kind"] == "StatefulSet":
        # vLLM pods: every pod is scraped, so each must serve only its own engines, at that port.
        assert env["REDIS_STATS_VIEW"]["value"] == "local"
        # The view listens on loopback by default: a scraper from outside the pod needs this.
        assert env["REDIS_STATS_ADDR"]["value"] not in ("127.0.0.1", "localhost", "::1")
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert [str(ports[t]) for t in target_ports] == [env["REDIS_STATS_PORT"]["value"]]
        offset = env["REDIS_STATS_ENGINE_OFFSET"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert offset == "metadata.labels['apps.kubernetes.io/pod-index']"  # distinct engine per pod
    else:
        # The exporter: every engine in one view; a second replica would be a second copy.
        assert workload["spec"]["replicas"] == 1
        assert container["args"][0] == "exporter" and "--engines" not in container["args"]


def test_images_are_set_by_the_kustomizations():
    for name in ("fleet view (exporter)", "per-pod views", "sliced fleet view"):
        images = {i["name"] for i in kustomization(LAYOUTS[name]).get("images", [])}
        used = {c["image"] for d in resources(LAYOUTS[name]) for c in containers(d)}
        assert used <= images, (name, used - images)
    assert (KUBE / "Dockerfile.vllm").is_file() and "redis_stats" in (KUBE / "Dockerfile.vllm").read_text()


def test_docs_state_the_version_and_every_file():
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    assert KUBERNETES_VERSION.rsplit(".", 1)[0] in doc
    for path in KUBE.rglob("*"):
        if path.is_file():
            assert str(path.relative_to(ROOT)) in doc, (
                f"docs/kubernetes.md does not mention {path.relative_to(ROOT)}"
            )
