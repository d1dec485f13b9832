"""deploy/kubernetes/ without a cluster: every manifest valid against the Kubernetes 1.30 schemas
(kubernetes-validate ships them; checked with the network blocked), the Prometheus Operator
resources structurally, and the properties an operator relies on: the Redis URL only from a
Secret, monitors that select what exists, and one copy of each engine in every layout."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import socket
import subprocess
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
    "bridge (SGLang)": KUBE / "bridge",
    "redis": KUBE / "redis",
    "every namespace, one exporter": KUBE / "all-namespaces",
    "data parallelism in a pod": KUBE / "data-parallel",
    "exporter highly available": KUBE / "ha",
    "vLLM's Rust front end behind nginx": KUBE / "vllm-rs",
}
MONITOR_LABELS = KUBE / "monitor-labels"

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


_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
# The fields of monitoring.coreos.com/v1 PrometheusRule the alerts use (the operator's CRD: groups
# of rules, each an alert or a record with an expr), no others.
RULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["alert", "expr"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string", "minLength": 1},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                        "labels": _STRINGS,
                                        "annotations": _STRINGS,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}

_RELABELINGS = _ENDPOINT["properties"]["relabelings"]
_ENDPOINT["properties"]["metricRelabelings"] = _RELABELINGS  # the CRD's field, the same items
# The fields of monitoring.coreos.com/v1alpha1 ScrapeConfig the HA layout uses (static targets,
# their labels, the scrape's path, interval, timeout and metric relabelings), no others.
SCRAPE_CONFIG_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1alpha1"},
        "kind": {"const": "ScrapeConfig"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["staticConfigs"],
            "additionalProperties": False,
            "properties": {
                "staticConfigs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["targets"],
                        "additionalProperties": False,
                        "properties": {
                            "targets": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                            "labels": _STRINGS,
                        },
                    },
                },
                "metricsPath": {"type": "string", "pattern": "^/"},
                "scrapeInterval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                "metricRelabelings": _RELABELINGS,
                "relabelings": _RELABELINGS,
            },
        },
    },
}

_INT = {"type": "integer", "minimum": 0}
# The fields of keda.sh/v1alpha1 ScaledObject these manifests use (KEDA 2.x's CRD: required
# scaleTargetRef.name and triggers[].type/metadata, metadata a map of strings), no others.
KEDA_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"minLength": 1},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": _INT,
                "initialCooldownPeriod": _INT,
                "minReplicaCount": _INT,
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "additionalProperties": False,
                    "properties": {
                        "failureThreshold": _INT,
                        "replicas": _INT,
                        "behavior": {
                            "enum": [
                                "static",
                                "currentReplicas",
                                "currentReplicasIfHigher",
                                "currentReplicasIfLower",
                            ]
                        },
                    },
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"behavior": {"type": "object"}},
                        }
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"enum": ["metrics-api", "prometheus"]},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "name": {"type": "string"},
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "additionalProperties": False,
                                "properties": {"name": {"minLength": 1}, "kind": {"type": "string"}},
                            },
                        },
                    },
                },
            },
        },
    },
}
# keda.sh/v1alpha1 TriggerAuthentication, the fields used: parameters from Secrets' keys.
TRIGGER_AUTH_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["secretTargetRef"],
            "additionalProperties": False,
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["parameter", "name", "key"],
                        "additionalProperties": False,
                        "properties": {
                            "parameter": {"minLength": 1},
                            "name": {"minLength": 1},
                            "key": {"minLength": 1},
                        },
                    },
                }
            },
        },
    },
}
KEDA = KUBE / "keda"


def kustomization(directory: Path) -> dict:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def every_layout() -> list[Path]:
    """Every directory `kubectl apply -k` can take: a kustomization.yaml that is not a Component
    (a layout added later is checked without touching this file)."""
    return sorted(
        path.parent
        for path in KUBE.rglob("kustomization.yaml")
        if yaml.safe_load(path.read_text()).get("kind", "Kustomization") == "Kustomization"
    )


def build(directory: Path) -> list[dict]:
    """What `kubectl kustomize` makes of a layout: the objects `kubectl apply -k` would send."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to build the kustomize layouts (apt-get install kubectl)"
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {directory.relative_to(ROOT)}: {done.stderr.strip()}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def resources(directory: Path) -> list[dict]:
    return build(directory)


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


def _block_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("schema validation tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def no_network(monkeypatch):
    _block_network(monkeypatch)


def validate(doc: dict, where: str) -> None:
    """One object against the Kubernetes 1.30 schemas (strict), or a monitor against MONITOR_SCHEMA."""
    name = f"{where} {doc['kind']}/{doc['metadata']['name']}"
    for group, schema in (("monitoring.coreos.com/", MONITOR_SCHEMA), ("keda.sh/", KEDA_SCHEMA)):
        if doc["apiVersion"].startswith(group):
            if doc["kind"] == "PrometheusRule":
                schema = RULE_SCHEMA
            elif doc["kind"] == "TriggerAuthentication":
                schema = TRIGGER_AUTH_SCHEMA
            elif doc["kind"] == "ScrapeConfig":
                schema = SCRAPE_CONFIG_SCHEMA
            try:
                jsonschema.Draft202012Validator(schema).validate(doc)
            except jsonschema.ValidationError as exc:
                pytest.fail(f"{name}: {exc.message}")
            return
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{name}: {exc}")


def test_every_manifest_is_valid_kubernetes_offline(no_network):
    manifests = every_manifest()
    kinds = {d["kind"] for _, d in manifests}
    assert {"StatefulSet", "Deployment", "Service", "ServiceMonitor", "PodMonitor"} <= kinds
    for path, doc in manifests:
        validate(doc, str(path.relative_to(ROOT)))


def test_the_layouts_are_found():
    found = set(every_layout())
    assert set(LAYOUTS.values()) <= found and MONITOR_LABELS not in found


@pytest.mark.parametrize("layout", every_layout(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_layout_builds_and_what_it_builds_is_valid_kubernetes(layout):
    """`kubectl apply -k LAYOUT` as written: kustomize builds it (no file outside the layout's own
    directory, kustomize v5's rule), and every object it sends is valid against the schemas."""
    docs = build(layout)
    assert docs, f"{layout.relative_to(ROOT)} builds nothing"
    with pytest.MonkeyPatch.context() as mp:
        _block_network(mp)
        for doc in docs:
            validate(doc, f"kubectl kustomize {layout.relative_to(ROOT)}:")


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


@pytest.mark.parametrize(
    "layout",
    [
        "fleet view (exporter)",
        "per-pod views",
        "sliced fleet view",
        "bridge (SGLang)",
        "every namespace, one exporter",
        "data parallelism in a pod",
        "vLLM's Rust front end behind nginx",
    ],
)
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
    """The manifests name images by a placeholder (`image: redis-stats`); each layout's build must
    have replaced every one with the registry set in a kustomization's `images:`."""
    placeholders = {c["image"] for _, d in every_manifest() for c in containers(d) if ":" not in c["image"]}
    for layout in every_layout():
        used = {c["image"] for d in build(layout) for c in containers(d)}
        assert not used & placeholders, (layout, used & placeholders)
    assert DOCKERFILE.is_file() and "redis_stats" in DOCKERFILE.read_text()


def test_docs_state_the_version_and_every_file():
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    assert KUBERNETES_VERSION.rsplit(".", 1)[0] in doc
    for path in KUBE.rglob("*"):
        if path.is_file():
            assert str(path.relative_to(ROOT)) in doc, (
                f"docs/kubernetes.md does not mention {path.relative_to(ROOT)}"
            )


def _monitor_labels() -> dict[str, str]:
    """The labels monitor-labels/ (a kustomize Component) adds to every monitor."""
    component = kustomization(MONITOR_LABELS)
    assert component["kind"] == "Component"
    labels = {}
    for patch in component["patches"]:
        assert patch["target"] == {"group": "monitoring.coreos.com"}
        for op in yaml.safe_load(patch["patch"]):
            assert op["op"] == "add" and op["path"].startswith("/metadata/labels/")
            labels[op["path"].rsplit("/", 1)[1]] = op["value"]
    return labels


def test_every_monitor_carries_the_labels_set_in_one_place():
    """A Prometheus Operator ignores, silently, a monitor its selector does not match
    (kube-prometheus-stack selects `release: <Helm release>`): every monitor of every layout gets
    the labels of monitor-labels/, and no monitor sets them itself (one place to change them)."""
    wanted = _monitor_labels()
    assert "release" in wanted
    monitors = 0
    for layout in every_layout():
        for doc in build(layout):
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                monitors += 1
                labels = doc["metadata"].get("labels", {})
                assert wanted.items() <= labels.items(), (layout, doc["metadata"]["name"], labels)
    assert monitors >= 2
    for path, doc in every_manifest():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            assert not wanted.keys() & doc["metadata"].get("labels", {}).keys(), path


EVERY_NAMESPACE = "*"


def _namespaces(docs: list[dict]) -> tuple[set[str], set[str]]:
    """The Redis namespaces a layout's containers write (a vLLM pod's plugin, a bridge) and read
    (an exporter, a pod's own view; :data:`EVERY_NAMESPACE` for an exporter --all-namespaces)."""
    written, read = set(), set()
    for doc in docs:
        for c in containers(doc):
            env = env_of(c)
            args = c.get("args") or []
            if args[:1] == ["exporter"] and "--all-namespaces" in args:
                assert "REDIS_STATS_NAMESPACE" not in env and "--namespace" not in args, c["name"]
                read.add(EVERY_NAMESPACE)
                continue
            namespace = env.get("REDIS_STATS_NAMESPACE", {}).get("value")
            if namespace is None:
                continue
            if args[:1] == ["exporter"]:
                read.add(namespace)
            elif args[:1] == ["bridge"]:
                written.add(namespace)
            else:  # a vLLM pod with the plugin: it writes, and serves a view when given a port
                written.add(namespace)
                if "REDIS_STATS_PORT" in env:
                    read.add(namespace)
    return written, read


@pytest.mark.parametrize("layout", every_layout(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_namespace_a_layout_writes_is_read_by_its_view(layout):
    """A layout whose writers and view name different Redis namespaces shows none of its engines
    (the bridge layout wrote llama-3.1-8b-sglang while the exporter read llama-3.1-8b)."""
    written, read = _namespaces(build(layout))
    if not written:
        return  # the exporter alone (exporter/), Redis alone (redis/)
    assert read, f"{layout.relative_to(ROOT)} writes {sorted(written)} and has no view reading it"
    if EVERY_NAMESPACE in read:
        return  # one exporter reads every namespace written
    assert written == read, f"{layout.relative_to(ROOT)}: written {sorted(written)}, read {sorted(read)}"


def _server_pods() -> list[tuple[str, dict, dict]]:
    """(layout, StatefulSet, model server container) of every layout's model servers."""
    out = []
    for name in (
        "fleet view (exporter)",
        "per-pod views",
        "bridge (SGLang)",
        "data parallelism in a pod",
        "vLLM's Rust front end behind nginx",
    ):
        (sts,) = [d for d in build(LAYOUTS[name]) if d["kind"] == "StatefulSet"]
        (c,) = [c for c in containers(sts) if (c.get("args") or [""])[0] != "bridge" and c["name"] != "proxy"]
        out.append((name, sts, c))
    return out


def test_the_model_server_pods_serve_a_gated_model_from_a_cache_and_survive_a_slow_start():
    """vLLM's pods and the bridge layout's SGLang pods alike."""
    for _name, sts, c in _server_pods():
        env = env_of(c)
        # The Hugging Face token of a gated model: from a Secret, like the Redis URL.
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
        # The download lands on a per-pod volume claim (kept across restarts), not the container.
        claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        assert claims & mounts.keys(), (claims, mounts)
        assert any(env["HF_HOME"]["value"].startswith(mounts[n]) for n in claims & mounts.keys())
        # Minutes of download and load before /health answers: a startup probe, so the liveness
        # probe does not restart a pod that is still loading.
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        resources = c["resources"]
        assert {"cpu", "memory", "nvidia.com/gpu"} <= resources["requests"].keys()
        assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]
        assert resources["limits"]["memory"] == resources["requests"]["memory"]
        # The workers share tensors through /dev/shm: a memory volume there, not the 64 MiB default.
        volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"].get("volumes", [])}
        (shm,) = [n for n, path in mounts.items() if path == "/dev/shm"]
        assert volumes[shm]["emptyDir"]["medium"] == "Memory"
        # A pinned image: a tag that moves (or none) changes the server under a running fleet.
        image = c["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith((":latest", ":main")), image


DOCKERFILE = KUBE / "Dockerfile.vllm"


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        word, _, args = (pending + stripped).strip().partition(" ")
        out.append((word.upper(), args.strip()))
        pending = ""
    return out


def installs_by_name(text: str) -> list[str]:
    """Every requirement a `pip install` of the Dockerfile takes by name (from an index), not as a
    path copied from the build context."""
    copied = []
    for word, args in dockerfile_instructions(text):
        if word in ("COPY", "ADD") and "--from" not in args:
            copied.append(shlex.split(args)[-1])
    by_name = []
    for word, args in dockerfile_instructions(text):
        if word != "RUN":
            continue
        for command in re.split(r"&&|;|\|\|", args):
            argv = shlex.split(command)
            if "install" not in argv or not any(a.endswith("pip") or a == "pip" for a in argv):
                continue
            for arg in argv[argv.index("install") + 1 :]:
                if arg.startswith("-"):
                    continue
                path = arg.split("[", 1)[0]
                if not any(path == d.rstrip("/") or path.startswith(d.rstrip("/") + "/") for d in copied):
                    by_name.append(arg)
    return by_name


def test_the_vllm_image_installs_this_checkout_not_a_name_from_an_index():
    text = DOCKERFILE.read_text()
    assert installs_by_name(text) == []
    # ... and the check sees what the Dockerfile used to do.
    assert installs_by_name("FROM x\nRUN pip install --no-cache-dir 'redis_stats[hiredis]'\n") == [
        "redis_stats[hiredis]"
    ]
    # What it copies exists in the build context (the repository's root) and is not dockerignored.
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip()]
    for word, args in dockerfile_instructions(text):
        if word == "COPY":
            for source in shlex.split(args)[:-1]:
                assert (ROOT / source).exists(), source
                assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source
    assert "pyproject.toml" in text


def test_the_vllm_image_is_on_the_vllm_release_the_docs_test():
    tested = (ROOT / "docs" / "vllm-metrics.md").read_text().split("## Versions tested", 1)[1]
    version = re.search(r"- vLLM (\d+\.\d+\.\d+) ", tested)
    assert version, "docs/vllm-metrics.md names no tested vLLM version"
    (base,) = [args for word, args in dockerfile_instructions(DOCKERFILE.read_text()) if word == "FROM"]
    assert base == f"vllm/vllm-openai:v{version.group(1)}"


def test_every_variable_the_manifests_set_is_one_redis_stats_reads():
    """A mistyped name in a manifest would be ignored (the setting keeps its default): every
    REDIS_STATS_* variable of every layout's containers is a name redis_stats or its vLLM plugin
    reads (the check the plugin and the command warn with at start)."""
    from redis_stats.config import unknown_variables
    from redis_stats.integrations.vllm.options import VARIABLES

    names = {
        e["name"]
        for layout in every_layout()
        for d in build(layout)
        for c in containers(d)
        for e in c.get("env", [])
    }
    assert {"REDIS_STATS_URL", "REDIS_STATS_VIEW", "REDIS_STATS_ENGINE_OFFSET"} <= names
    known = [v.name for v in VARIABLES]
    assert unknown_variables(known, dict.fromkeys(names, "x")) == {}
    # ... and the check sees a typo.
    assert unknown_variables(known, {"REDIS_STATS_VEIW": "local"}) == {"REDIS_STATS_VEIW": "REDIS_STATS_VIEW"}


def scaled_objects() -> dict[str, dict]:
    """The ScaledObject of each KEDA layout (deploy/kubernetes/keda/<recipe>), by its recipe."""
    out = {}
    for layout in sorted(p for p in KEDA.iterdir() if p.is_dir()):
        (so,) = [d for d in build(layout) if d["kind"] == "ScaledObject"]
        out[layout.name] = so
    return out


def test_the_keda_recipes_scale_the_vllm_pods_on_what_the_fleet_layout_serves():
    """Both ScaledObjects build and validate (every layout's test), and point at what exists: the
    vLLM StatefulSet of base/, the exporter's Service and port (metrics-api: its /load, from KEDA's
    pod by the Service's full name), the fleet ServiceMonitor's job (prometheus); numbers as KEDA
    takes them (strings), a fallback KEDA accepts (AverageValue only)."""
    found = scaled_objects()
    assert {r: so["spec"]["triggers"][0]["type"] for r, so in found.items()} == {
        "load": "metrics-api",
        "load-secured": "metrics-api",
        "prometheus": "prometheus",
    }
    fleet = build(KUBE)
    (sts,) = [d for d in fleet if d["kind"] == "StatefulSet"]
    (service,) = [
        d for d in fleet if d["kind"] == "Service" and d["metadata"]["name"] == "redis-stats-exporter"
    ]
    (monitor,) = [d for d in fleet if d["kind"] == "ServiceMonitor"]
    port = {p["name"]: p["port"] for p in service["spec"]["ports"]}[monitor["spec"]["endpoints"][0]["port"]]
    for so in found.values():
        spec = so["spec"]
        assert spec["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": sts["metadata"]["name"],
        }
        assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
        (trigger,) = spec["triggers"]
        assert trigger["metricType"] == "AverageValue"  # KEDA refuses a fallback for any other
        float(trigger["metadata"].get("targetValue") or trigger["metadata"]["threshold"])
    for recipe, scheme in (("load", "http"), ("load-secured", "https")):
        url = found[recipe]["spec"]["triggers"][0]["metadata"]["url"]
        m = re.fullmatch(scheme + r"://([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)(/load)", url)
        assert m and m.group(1) == service["metadata"]["name"] and int(m.group(3)) == port, url
    query = found["prometheus"]["spec"]["triggers"][0]["metadata"]["query"]
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert query.startswith("sum(") and f'job="{job}"' in query, query


def test_the_keda_validator_is_not_vacuous():
    (so, *_) = scaled_objects().values()
    bad = json.loads(json.dumps(so))
    bad["spec"]["triggers"][0]["metadata"]["targetValue"] = 4  # KEDA's metadata holds strings only
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(KEDA_SCHEMA).validate(bad)
    typo = json.loads(json.dumps(so))
    typo["spec"]["pollingIntervall"] = 15
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(KEDA_SCHEMA).validate(typo)


def _pod_environ(container: dict, index: int) -> dict[str, str]:
    """The environment a rendered container gets in pod *index* of its StatefulSet: values as
    written, the downward API's pod-index label resolved, Secrets as a placeholder."""
    environ = {}
    for e in container.get("env", []):
        if "value" in e:
            environ[e["name"]] = e["value"]
        elif "fieldRef" in e.get("valueFrom", {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            environ[e["name"]] = (
                str(index) if path == "metadata.labels['apps.kubernetes.io/pod-index']" else "x"
            )
        else:
            environ[e["name"]] = "redis://secret.invalid:6379/0"
    return environ


def _engines_of_pods(layout: Path) -> tuple[list[list[int]], dict[str, str]]:
    """The engine numbers each pod of the layout's vLLM StatefulSet records, derived by the
    plugin's own config (``plugin_config``) from the rendered pod: its environment in pod i and
    its ``--data-parallel-size``."""
    from redis_stats.integrations.vllm.options import plugin_config

    (sts,) = [d for d in build(layout) if d["kind"] == "StatefulSet"]
    (c,) = containers(sts)
    args = c["args"]
    dp = int(args[args.index("--data-parallel-size") + 1]) if "--data-parallel-size" in args else 1
    pods = []
    for i in range(sts["spec"]["replicas"]):
        config = plugin_config("m", _pod_environ(c, i), argv=args, data_parallel_size=dp)
        pods.append([config.engine_offset + e for e in range(dp)])
    flags = {a: args[args.index(a) + 1] for a in ("--data-parallel-size", "--api-server-count") if a in args}
    return pods, flags


def test_the_data_parallel_layout_derives_each_pods_engines_from_its_index():
    """The README's layout: several data-parallel engines and API servers in every pod. No pod
    sets an offset by hand; each pod's engines come after the previous pods' (pod i: engines
    i x N .. i x N + N - 1), every engine of the fleet once, whatever the replica count."""
    pods, flags = _engines_of_pods(LAYOUTS["data parallelism in a pod"])
    assert int(flags["--data-parallel-size"]) >= 2 and int(flags["--api-server-count"]) >= 2, flags
    n = int(flags["--data-parallel-size"])
    assert len(pods) >= 2
    assert pods == [list(range(i * n, i * n + n)) for i in range(len(pods))], pods
    (sts,) = [d for d in build(LAYOUTS["data parallelism in a pod"]) if d["kind"] == "StatefulSet"]
    env = env_of(containers(sts)[0])
    assert "REDIS_STATS_ENGINE_OFFSET" not in env  # derived, never hand-set beside it
    assert containers(sts)[0]["resources"]["requests"]["nvidia.com/gpu"] == n  # a GPU per engine
    # ... and the one-engine-per-pod layout numbers its pods 0, 1, ... as before.
    single, _ = _engines_of_pods(KUBE)
    assert single == [[i] for i in range(len(single))]


def test_the_docs_state_the_startup_probe_the_manifest_sets():
    """One number, stated the same way everywhere (it read 10 minutes in docs/autoscaling.md, 20 in
    docs/kubernetes.md and the manifest)."""
    (sts,) = [d for d in build(KUBE) if d["kind"] == "StatefulSet"]
    probe = containers(sts)[0]["startupProbe"]
    minutes = probe["periodSeconds"] * probe["failureThreshold"] / 60
    kube = (ROOT / "docs" / "kubernetes.md").read_text()
    scaling = (ROOT / "docs" / "autoscaling.md").read_text()
    stated = re.findall(r"startup probe on `/health` allows (\d+) minutes \((\d+) \u00d7 (\d+) s\)", kube)
    assert stated == [(f"{minutes:g}", str(probe["failureThreshold"]), str(probe["periodSeconds"]))], stated
    assert re.findall(r"startup probe allows (\d+)\)", scaling) == [f"{minutes:g}"]


def test_the_secured_keda_recipe_sends_a_bearer_token_from_a_secret_over_https():
    """keda/load-secured: ../load's trigger with KEDA's bearer mode, its TriggerAuthentication in the
    same layout, reading a parameter KEDA's metrics-api takes (bearerToken) from a Secret key, and
    nothing else changed (the trigger is ../load's but for the scheme and the authentication)."""
    docs = build(KEDA / "load-secured")
    (so,) = [d for d in docs if d["kind"] == "ScaledObject"]
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    (trigger,) = so["spec"]["triggers"]
    assert trigger["metadata"]["authModes"] == "bearer"
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    assert auth["metadata"]["namespace"] == so["metadata"]["namespace"]  # KEDA looks it up there
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "bearerToken", "name": "redis-stats-web", "key": "token"}
    ]
    plain = scaled_objects()["load"]
    (plain_trigger,) = plain["spec"]["triggers"]
    same = json.loads(json.dumps(trigger))
    del same["authenticationRef"], same["metadata"]["authModes"]
    same["metadata"]["url"] = same["metadata"]["url"].replace("https://", "http://")
    assert same == plain_trigger
    assert {k: v for k, v in so["spec"].items() if k != "triggers"} == {
        k: v for k, v in plain["spec"].items() if k != "triggers"
    }


@pytest.mark.parametrize("recipe", ["load", "load-secured", "prometheus"])
def test_the_keda_recipes_work_in_any_namespace_set_in_one_place(recipe, tmp_path):
    """The ScaledObject sits beside the StatefulSet it scales, and the metrics-api trigger reaches
    the exporter's Service by its full name: one line, `namespace:` of the recipe's kustomization,
    sets both (they hard-coded `default` before)."""
    copy = tmp_path / recipe
    shutil.copytree(KEDA / recipe, copy)
    text = (copy / "kustomization.yaml").read_text()
    assert text.count("namespace: default\n") == 1
    (copy / "kustomization.yaml").write_text(text.replace("namespace: default\n", "namespace: inference\n"))
    (so,) = [d for d in build(copy) if d["kind"] == "ScaledObject"]
    assert so["metadata"]["namespace"] == "inference"
    flat = json.dumps(so)
    assert "default" not in flat, flat
    if recipe.startswith("load"):
        url = so["spec"]["triggers"][0]["metadata"]["url"]
        scheme = "https" if recipe == "load-secured" else "http"
        assert url == f"{scheme}://redis-stats-exporter.inference.svc.cluster.local:9400/load", url


PER_PROCESS = (
    "process_.*|python_.*|redis_stats_exporter_.*|"
    "redis_stats_background_errors_total|redis_stats_read_errors_total"
)
"""The exporter's own process's series (docs/kubernetes.md, "Running it highly available")."""


def ha_scrapes(layout: Path = KUBE / "ha") -> tuple[dict, dict, list[dict]]:
    """The HA layout's ScrapeConfig (the Service address), ServiceMonitor (each replica) and
    everything it builds."""
    docs = build(layout)
    (sc,) = [d for d in docs if d["kind"] == "ScrapeConfig"]
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    return sc, sm, docs


def test_the_ha_layout_runs_replicas_and_stores_every_engine_once_whatever_their_count():
    """Two exporter replicas (a PodDisruptionBudget keeps one through a drain, a spread puts them
    on two nodes); Prometheus scrapes the Service address once for the store's series and each
    replica for its own process's series only: the two relabelings are complementary (what one
    keeps, the other drops), so no series is stored twice and none is lost."""
    sc, sm, docs = ha_scrapes()
    (exporter,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "redis-stats-exporter"
    ]
    (service,) = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "redis-stats-exporter"
    ]
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    replicas = exporter["spec"]["replicas"]
    assert replicas >= 2
    pod_labels = exporter["spec"]["template"]["metadata"]["labels"]
    assert _selects(pdb["spec"]["selector"], pod_labels) and 1 <= pdb["spec"]["minAvailable"] < replicas
    spread = exporter["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert any(
        c["topologyKey"] == "kubernetes.io/hostname" and _selects(c["labelSelector"], pod_labels)
        for c in spread
    )
    # The store's series: ONE target, the Service's full name and port.
    (static,) = sc["spec"]["staticConfigs"]
    port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["metrics"]
    namespace = service["metadata"]["namespace"]
    assert static["targets"] == [f"redis-stats-exporter.{namespace}.svc.cluster.local:{port}"]
    assert static["labels"]["job"] == "redis-stats-exporter"  # the job the alerts and KEDA name
    (drop,) = sc["spec"]["metricRelabelings"]
    # Each replica: its own process's series only, under a job of their own.
    (endpoint,) = sm["spec"]["endpoints"]
    assert _selects(sm["spec"]["selector"], service["metadata"]["labels"])
    (keep,) = endpoint["metricRelabelings"]
    assert (drop["action"], keep["action"]) == ("drop", "keep")
    assert drop["regex"] == keep["regex"] == PER_PROCESS
    assert drop["sourceLabels"] == keep["sourceLabels"] == ["__name__"]
    (job,) = endpoint["relabelings"]
    assert job == {"targetLabel": "job", "replacement": "redis-stats-exporter-replicas"}
    # The per-process series are exactly the ones the standalone exporter adds to the store's.
    for name in (
        "process_cpu_seconds_total",
        "python_info",
        "redis_stats_exporter_scrape_bytes_total",
        "redis_stats_background_errors_total",
        "redis_stats_read_errors_total",
    ):
        assert re.fullmatch(PER_PROCESS, name), name
    for name in (
        "redis_stats_up",
        "redis_stats_engine_up",
        "vllm:generation_tokens_total",
        "redis_stats_writer_flush_errors_total",
        "redis_stats_store_used_memory_bytes",
    ):
        assert not re.fullmatch(PER_PROCESS, name), name


def test_the_ha_layouts_service_address_follows_its_namespace(tmp_path):
    copy = tmp_path / "ha"
    shutil.copytree(KUBE / "ha", copy)
    for name in ("base", "exporter", "monitor-labels"):
        shutil.copytree(KUBE / name, tmp_path / name)
    text = (copy / "kustomization.yaml").read_text()
    (copy / "kustomization.yaml").write_text(text.replace("namespace: default\n", "namespace: inference\n"))
    sc, _, _ = ha_scrapes(copy)
    assert sc["spec"]["staticConfigs"][0]["targets"] == [
        "redis-stats-exporter.inference.svc.cluster.local:9400"
    ]


NGINX_CONF = ROOT / "deploy" / "nginx" / "vllm-rs.conf"


def test_the_vllm_rs_layout_runs_the_shipped_nginx_in_front_of_vllm_and_feeds_it():
    """deploy/kubernetes/vllm-rs: the ConfigMap nginx reads is deploy/nginx/vllm-rs.conf with only
    its second value set (the exporter: this layout's Service, on its port); nginx listens on the
    port the pod's Service sends routers to, and its first value is vLLM's port in the pod; the
    bridge scrapes that vLLM and stores the engines under the endpoint nginx answers for (the pod
    IP and nginx's port: $server_addr:$server_port), vLLM runs its Rust front end."""
    docs = build(LAYOUTS["vLLM's Rust front end behind nginx"])
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (conf_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    pod = sts["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    vllm, proxy, bridge = by_name["vllm"], by_name["proxy"], by_name["bridge"]
    # The ConfigMap is the shipped file, the exporter's address apart.
    conf = conf_map["data"]["vllm-rs.conf"]
    shipped = NGINX_CONF.read_text()
    views = re.search(r"upstream redis_stats_views \{\s*server ([^;]+);", conf)
    assert views, conf
    (exporter_service,) = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].startswith("redis-stats-exporter")
    ]
    exporter_port = {p["name"]: p["port"] for p in exporter_service["spec"]["ports"]}["metrics"]
    assert views.group(1) == f"{exporter_service['metadata']['name']}:{exporter_port}"
    differing = [(a, b) for a, b in zip(shipped.splitlines(), conf.splitlines()) if a != b]
    assert len(shipped.splitlines()) == len(conf.splitlines()) and len(differing) == 1, differing
    assert "server 127.0.0.1:9400;" in differing[0][0]
    # nginx reads it where the image's nginx.conf includes it, and listens where routers are sent.
    (mount,) = [m for m in proxy["volumeMounts"] if m["mountPath"] == "/etc/nginx/conf.d"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == conf_map["metadata"]["name"]
    listen = int(re.search(r"^\s*listen (\d+);", conf, re.M).group(1))
    proxy_ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    (service,) = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == sts["spec"]["serviceName"]
    ]
    (http,) = service["spec"]["ports"]
    assert proxy_ports[http["targetPort"]] == listen == http["port"]
    # Its first value is vLLM in the pod, which runs the Rust front end on that port.
    upstream = re.search(r"upstream redis_stats_vllm_rs \{\s*server 127\.0\.0\.1:(\d+);", conf)
    assert upstream and vllm["args"][vllm["args"].index("--port") + 1] == upstream.group(1)
    assert {p["containerPort"] for p in vllm["ports"]} == {int(upstream.group(1))}
    assert vllm["command"] == ["vllm", "serve"] and env_of(vllm)["VLLM_USE_RUST_FRONTEND"]["value"] == "1"
    assert not any(e["name"].startswith("REDIS_STATS_") for e in vllm.get("env", []))  # nothing Python loads
    # The bridge: that vLLM's /metrics, stored under the endpoint nginx answers for.
    args = bridge["args"]
    assert (
        args[0] == "bridge"
        and args[args.index("--source") + 1] == f"http://127.0.0.1:{upstream.group(1)}/metrics"
    )
    assert args[args.index("--engine-label") + 1] == "engine"
    env = [e["name"] for e in bridge["env"]]
    # $(POD_IP) expands only from a variable defined before it (Kubernetes' dependent variables).
    assert env.index("POD_IP") < env.index("REDIS_STATS_ENDPOINT")
    assert env_of(bridge)["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env_of(bridge)["REDIS_STATS_ENDPOINT"]["value"] == f"$(POD_IP):{listen}"
    assert "set $redis_stats_endpoint $server_addr:$server_port;" in conf
    # The probes that restart vLLM never go through nginx (a restart of nginx is not one of vLLM).
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert vllm[probe]["httpGet"]["port"] in {p["name"] for p in vllm["ports"]}
    assert proxy["readinessProbe"]["httpGet"]["path"] != "/get_load"
