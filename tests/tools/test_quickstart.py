"""docs/quickstart.md, from nothing to a vLLM fleet on Kubernetes with a router, alerts and a
dashboard (issue 50, item 4), stays true: short enough to read at once; every command of its
one-machine part a checked sample (tests/tools/test_doc_samples.py runs each); every command of its
cluster part about files that exist, and every layout it applies built by `kubectl kustomize` and
valid; the router it deploys polls every vLLM pod, and every pod answers the router."""

from __future__ import annotations

import importlib
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.tools.test_doc_samples import samples_of
from tests.tools.test_kubernetes import KUBE, _block_network, build, containers, validate

PAGE = ROOT / "docs" / "quickstart.md"
MAX_WORDS = 2500
MIDDLEWARE = "redis_stats.integrations.vllm.get_load.GetLoadMiddleware"


def blocks() -> list[tuple[str, list[str]]]:
    """(the HTML comment above it, its lines) of every code block of the page."""
    lines = PAGE.read_text().splitlines()
    out, fence, start = [], False, 0
    for i, line in enumerate(lines):
        if line.startswith("```"):
            if not fence:
                start = i
            else:
                above = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
                out.append((above.strip(), lines[start + 1 : i]))
            fence = not fence
    return out


def commands(block: list[str]) -> list[list[str]]:
    """Each command of a bash block, continuation lines joined, comments dropped, split at `;`."""
    joined = "\n".join(block).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        for part in re.split(r";\s+", line):
            words = shlex.split(part, comments=True)
            if words:
                out.append(words[:-1] if words[-1] == "&" else words)
    return out


def test_the_quickstart_is_short_and_the_readme_points_to_it_first():
    words = len(PAGE.read_text().split())
    assert words <= MAX_WORDS, f"docs/quickstart.md has {words} words, over {MAX_WORDS}"
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    first = re.search(r"^\| `([^`]+)` \|", table, re.M)
    assert first and first.group(1) == "docs/quickstart.md"


def test_every_block_is_run_or_checked():
    kinds = []
    for above, _ in blocks():
        m = re.fullmatch(
            r"<!-- (?:sample: (fleet|empty)(?: run .+)?|quickstart: (install|cluster)) -->", above
        )
        assert m, f"a block of docs/quickstart.md that no test runs or checks (above it: {above!r})"
        kinds.append(m.group(1) or m.group(2))
    assert kinds.count("install") == 1 and kinds.count("cluster") >= 6
    # Step 2, every command a router's view needs, each a sample run by test_doc_samples.
    shown = " ".join(step.command for s in samples_of(PAGE) if s.mode for step in s.steps)
    for needed in ("redis-stats dev-redis", "redis-stats simulate", "redis-stats exporter", "/load",
                   "/get_load", "/v1/loads", "Accept: text/event-stream", "load_router.py"):  # fmt: skip
        assert needed in shown, needed


def test_the_install_is_the_readmes_which_the_install_test_runs():
    (install,) = [lines for above, lines in blocks() if above == "<!-- quickstart: install -->"]
    pip = [c for c in commands(install) if c[:2] == ["pip", "install"]]
    readme = (ROOT / "README.md").read_text()
    assert pip and all(shlex.join(c) in readme or " ".join(c[:2]) + " '" + c[2] + "'" in readme for c in pip)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r"^hiredis = ", pyproject, re.M) and re.search(r"^embedded = ", pyproject, re.M)


def applied() -> list[tuple[Path, list[dict]]]:
    """Every layout the page applies, built as `kubectl apply -k` sends it."""
    out = []
    for above, lines in blocks():
        if above == "<!-- quickstart: cluster -->":
            for c in commands(lines):
                if c[:3] == ["kubectl", "apply", "-k"]:
                    out.append((ROOT / c[3], build(ROOT / c[3])))
    return out


def test_every_layout_it_applies_builds_and_is_valid():
    layouts = applied()
    names = {p.relative_to(KUBE).as_posix() for p, _ in layouts}
    assert {".", "redis", "router", "alerts", "dashboard"} <= names, names
    # ... and every layout it names to apply instead (data-parallel, ha, vllm-rs, bridge, keda)
    named = set(re.findall(r"`deploy/kubernetes/([\w/-]+?)/?`", PAGE.read_text())) - names
    assert {"data-parallel", "ha", "vllm-rs", "bridge", "keda"} <= named, named
    for name in sorted(named):
        path = KUBE / name
        assert path.is_dir(), f"docs/quickstart.md names deploy/kubernetes/{name}, which does not exist"
        if (path / "kustomization.yaml").exists():
            layouts.append((path, build(path)))
        else:  # a directory of recipes (keda/): each one
            layouts += [(k.parent, build(k.parent)) for k in sorted(path.glob("*/kustomization.yaml"))]
    with pytest.MonkeyPatch.context() as mp:
        _block_network(mp)
        for path, docs in layouts:
            for doc in docs:
                validate(doc, f"kubectl kustomize {path.relative_to(ROOT)}:")


SHELL = {"umask", "openssl", "printf", "rm", "helm", "curl"}


def test_every_cluster_command_names_what_exists():
    """docker builds name Dockerfiles and images the layouts use; secrets are those the
    containers read, by key; port-forwards and rollouts name objects the applied layouts make."""
    objects = [d for _, docs in applied() for d in docs]
    secret_keys = set()
    for d in objects:
        for c in containers(d):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret_keys.add((ref["name"], ref["key"]))
        for v in d.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
            if "secret" in v:
                secret_keys |= {(v["secret"]["secretName"], i["key"]) for i in v["secret"].get("items", [])}
    images = {c["image"].rsplit(":", 1)[0].rsplit("/", 1)[-1] for d in objects for c in containers(d)}
    forwarded: set[int] = set()
    for above, lines in blocks():
        if above != "<!-- quickstart: cluster -->":
            continue
        for c in commands(lines):
            if c[0] == "docker":
                assert (ROOT / c[c.index("-f") + 1]).is_file(), c
                assert c[c.index("-t") + 1].rsplit(":", 1)[0].rsplit("/", 1)[-1] in images, c
            elif c[:3] == ["kubectl", "create", "secret"]:
                name, key = c[4], c[5].removeprefix("--from-file=").split("=")[0]
                assert (name, key) in secret_keys, f"no container reads key {key!r} of Secret {name!r}"
            elif c[:2] == ["kubectl", "port-forward"]:
                kind, name = c[2].split("/")
                local, remote = map(int, c[3].split(":"))
                (svc,) = [d for d in objects if d["kind"] == "Service" and d["metadata"]["name"] == name]
                assert remote in {p["port"] for p in svc["spec"]["ports"]}, c
                forwarded.add(local)
            elif c[:3] == ["kubectl", "rollout", "status"]:
                kind, name = c[3].split("/")
                assert any(d["kind"].lower() == kind and d["metadata"]["name"] == name for d in objects), c
            elif c[0] == "curl":
                port = int(re.search(r"localhost:(\d+)", " ".join(c)).group(1))
                assert port in forwarded, f"{c}: curl of a port no port-forward above opened"
            else:
                assert c[0] in SHELL or c[:3] == ["kubectl", "apply", "-k"], f"a command no test checks: {c}"


def _vllm_pods(layout: Path) -> list[dict]:
    sets = [d for d in build(layout) if d["kind"] == "StatefulSet"]
    return [c for d in sets for c in containers(d) if c["name"] == "vllm"]


def test_the_router_polls_every_vllm_pod_and_every_pod_answers_it():
    (sts,) = [d for d in build(KUBE) if d["kind"] == "StatefulSet"]
    service, replicas = sts["spec"]["serviceName"], sts["spec"]["replicas"]
    (port,) = [p["containerPort"] for c in containers(sts) for p in c["ports"] if p["name"] == "http"]
    (router,) = [c for d in build(KUBE / "router") for c in containers(d)]
    args = router["args"]
    urls = args[args.index("--worker-urls") + 1 : args.index("--worker-startup-check-interval")]
    assert urls == [f"http://{sts['metadata']['name']}-{i}.{service}:{port}" for i in range(replicas)]
    assert args[args.index("--policy") + 1] == "power_of_two"
    # Every vLLM pod that a router may poll loads the middleware that answers /get_load.
    for layout in (KUBE, KUBE / "data-parallel"):
        for c in _vllm_pods(layout):
            assert c["args"][c["args"].index("--middleware") + 1] == MIDDLEWARE, layout
    module, _, name = MIDDLEWARE.rpartition(".")
    assert callable(getattr(importlib.import_module(module), name))


def test_the_router_image_is_the_vllm_router_the_tests_run():
    # the test extra's pin (pyproject.toml, read as text: tomllib is Python 3.11's)
    (pinned,) = re.findall(r'"(vllm-router==[^;"]+)', (ROOT / "pyproject.toml").read_text())
    assert f"pip install --no-cache-dir {pinned}" in (KUBE / "Dockerfile.router").read_text()
    (image,) = yaml.safe_load((KUBE / "router" / "kustomization.yaml").read_text())["images"]
    assert image["newTag"] == pinned.split("==")[1]


def test_the_dashboard_it_applies_is_the_shipped_one():
    shipped = (ROOT / "compose" / "grafana" / "dashboards" / "redis_stats_fleet.json").read_text()
    (configmap,) = build(KUBE / "dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    # `kubectl apply` keeps the whole object in an annotation, which Kubernetes bounds at 256 KiB
    assert len(json.dumps(configmap)) < 200_000, "apply it with --server-side, and say so on the page"
    assert json.loads(configmap["data"]["redis_stats_fleet.json"]) == json.loads(shipped), (
        "cp compose/grafana/dashboards/redis_stats_fleet.json deploy/kubernetes/dashboard/ (kustomize "
        "reads no file outside its directory)"
    )


def test_what_the_page_says_of_alerts_and_labels_is_what_the_files_hold():
    text = PAGE.read_text()
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "redis-stats-alerts.yaml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert f"A `PrometheusRule` of {len(alerts)} alerts" in text
    for name in re.findall(r"`(RedisStats\w+)`", text):
        assert name in alerts, name
    (rule,) = [d for d in build(KUBE / "alerts") if d["kind"] == "PrometheusRule"]
    release = rule["metadata"]["labels"]["release"]  # monitor-labels/ sets it
    assert f"helm install {release} " in text and f"`release: {release}`" in text


def test_the_router_waits_for_the_vllm_pods_as_long_as_they_may_take_to_start():
    """vllm-router listens once its workers are healthy: a liveness probe that acts before the
    vLLM pods' own startup allowance would restart it in a loop while the model loads."""

    def allowance(probe: dict) -> int:
        return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)

    (vllm,) = _vllm_pods(KUBE)
    (router,) = [c for d in build(KUBE / "router") for c in containers(d)]
    args = router["args"]
    assert allowance(router["startupProbe"]) >= allowance(vllm["startupProbe"])
    assert int(args[args.index("--worker-startup-timeout-secs") + 1]) >= allowance(vllm["startupProbe"])


@pytest.mark.slow
@pytest.mark.redis_server
def test_the_router_runs_with_the_manifests_arguments(redis_server, namespace, tmp_path):
    """The real vllm-router binary, started with router/router.yaml's arguments as written (only
    its address and its workers' replaced: two stub "vLLM"s wrapped in the middleware), polls
    their /get_load and routes a completion: no flag of the manifest is one it refuses."""
    import subprocess
    import time

    from redis_stats import StatsConfig
    from tests.routers.procs import StubWorker, free_port, router_binary, sent_to

    binary = router_binary()
    if binary is None:
        pytest.skip("vllm-router is not installed (the test extra installs it on Linux x86_64/aarch64)")
    pytest.importorskip("uvicorn")
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    workers = [StubWorker(name, cfg).start() for name in ("a", "b")]
    (router,) = [c for d in build(KUBE / "router") for c in containers(d)]
    args, port = list(router["args"]), free_port()
    args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
    first, last = args.index("--worker-urls") + 1, args.index("--worker-startup-check-interval")
    args[first:last] = [w.url for w in workers]
    log = open(tmp_path / "router.log", "w")
    proc = subprocess.Popen(
        [binary, *args, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not all(w.polls for w in workers):  # it asks each worker's /get_load
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "router.log").read_text()
            time.sleep(0.1)
        assert sum(sent_to(f"http://127.0.0.1:{port}", 4).values()) == 4
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        for w in workers:
            w.close()
