"""The alerts (deploy/prometheus/redis-stats-alerts.yaml and its PrometheusRule,
deploy/kubernetes/alerts): promtool checks the file and runs its unit tests, every alert follows
the operators' conventions (CamelCase, severity, summary and description, a runbook that exists,
a ``for:``), reads only series redis_stats serves, is tested firing, and the PrometheusRule says
exactly what the file says.

``python -m tests.tools.test_alerts --write`` makes the PrometheusRule again from the file.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

RULES = ROOT / "deploy" / "prometheus" / "redis-stats-alerts.yaml"
UNIT_TESTS = ROOT / "deploy" / "prometheus" / "redis-stats-alerts.test.yaml"
LAYOUT = ROOT / "deploy" / "kubernetes" / "alerts"
RULE_FILE = LAYOUT / "prometheusrule.yaml"
RUNBOOKS_DOC = ROOT / "docs" / "runbooks.md"
RUNBOOKS = "https://docs.example.invalid/redis_stats/docs/runbooks.md"
PROMTOOL = shutil.which("promtool")
SEVERITIES = {"critical", "warning"}
DURATION = re.compile(r"^(\d+)(s|m|h)$")

RULE_HEADER = """\
# Made from deploy/prometheus/redis-stats-alerts.yaml by `python -m tests.tools.test_alerts --write`
# (tests/tools/test_alerts.py fails when the two differ): edit the rules file, then make this again.
# Runbook addresses: set `redis-stats/runbooks` in kustomization.yaml (docs/runbooks.md,
# "Alerts and runbooks").
"""


def need_promtool() -> str:
    """promtool's path; without it the test skips, or fails under CI (``CI_REQUIRE_PROMTOOL=1``)."""
    if PROMTOOL is None:
        if os.environ.get("CI_REQUIRE_PROMTOOL") == "1":
            raise RuntimeError("CI_REQUIRE_PROMTOOL=1 but promtool is not installed (.ci/install-prometheus)")
        pytest.skip("no promtool (make test installs Debian's prometheus package: .ci/install-prometheus)")
    return PROMTOOL


def rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def alerts() -> list[dict]:
    return [r for g in rules()["groups"] for r in g["rules"] if "alert" in r]


def prometheus_rule() -> dict:
    """The PrometheusRule the rules file makes (runbook addresses as the file has them)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "redis-stats", "labels": {"app.kubernetes.io/name": "redis-stats"}},
        "spec": copy.deepcopy(rules()),
    }


def write_rule() -> None:
    text = yaml.safe_dump(prometheus_rule(), sort_keys=False, width=100, allow_unicode=True)
    RULE_FILE.write_text(RULE_HEADER + text)


def test_promtool_checks_the_rules_and_every_unit_test_passes():
    promtool = need_promtool()
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in checked.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", UNIT_TESTS.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=UNIT_TESTS.parent,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_unit_tests_can_fail(tmp_path):
    """promtool reports a wrong expectation: the unit tests are not vacuous."""
    promtool = need_promtool()
    text = UNIT_TESTS.read_text()
    broken = text.replace("summary: Engine 3 of redis_stats namespace llama", "summary: Engine 9 of x")
    assert broken != text
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / UNIT_TESTS.name).write_text(broken)
    tested = subprocess.run(
        [promtool, "test", "rules", UNIT_TESTS.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert tested.returncode != 0
    assert "alertname: RedisStatsEngineDown" in tested.stdout + tested.stderr


def _seconds(duration: str) -> int:
    m = DURATION.match(duration)
    assert m, duration
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def test_every_alert_follows_the_operators_conventions():
    """kube-prometheus mixins' conventions: CamelCase names, a severity, a summary and a
    description, a runbook_url to its own section of docs/runbooks.md, a `for:` of at least a
    minute (one scrape's noise ridden out)."""
    found = alerts()
    assert len(found) >= 10
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line[4:].strip().lower()).replace(" ", "-")
        for line in RUNBOOKS_DOC.read_text().splitlines()
        if line.startswith("### ")
    }
    names = [a["alert"] for a in found]
    assert len(set(names)) == len(names)
    for alert in found:
        name = alert["alert"]
        assert re.fullmatch(r"RedisStats(?:[A-Z][a-z0-9]+)+", name), name
        assert alert["labels"]["severity"] in SEVERITIES, name
        annotations = alert["annotations"]
        assert {"summary", "description", "runbook_url"} <= annotations.keys(), name
        base, _, anchor = annotations["runbook_url"].partition("#")
        assert base == RUNBOOKS and anchor == name.lower(), (name, annotations["runbook_url"])
        assert anchor in headings, f"docs/runbooks.md has no section '### {name}' for its runbook"
        assert _seconds(alert["for"]) >= 60, name


def test_every_alert_reads_only_series_redis_stats_serves():
    """A misspelt name in an expression never fires: each redis_stats_* name an alert reads is
    one the package serves (its source names the family)."""
    source = "\n".join(p.read_text() for p in (ROOT / "redis_stats").rglob("*.py"))
    for alert in alerts():
        for name in set(re.findall(r"\bredis_stats_[a-z_]+", alert["expr"])):
            family = re.sub(r"_total$", "", name)
            assert f'"{family}"' in source, (alert["alert"], name)


def test_every_alert_has_a_unit_test_that_fires_it():
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {
        case["alertname"] for test in tests for case in test["alert_rule_test"] if case.get("exp_alerts")
    }
    quiet = {
        case["alertname"] for test in tests for case in test["alert_rule_test"] if not case.get("exp_alerts")
    }
    names = {a["alert"] for a in alerts()}
    assert names <= fired, names - fired
    assert names <= quiet, f"no case where these must stay quiet: {names - quiet}"


def test_the_prometheus_rule_says_what_the_rules_file_says(tmp_path):
    from tests.tools.test_kubernetes import build

    assert RULE_FILE.read_text() == RULE_HEADER + yaml.safe_dump(
        prometheus_rule(), sort_keys=False, width=100, allow_unicode=True
    ), (
        "deploy/kubernetes/alerts/prometheusrule.yaml is not the rules file's: "
        "python -m tests.tools.test_alerts --write"
    )
    (built,) = build(LAYOUT)
    base = built["metadata"]["annotations"]["redis-stats/runbooks"]
    assert base == RUNBOOKS
    assert built["spec"] == rules()  # the replacement writes the one address into every alert
    # ... and one change of the annotation reaches every runbook_url.
    text = (LAYOUT / "kustomization.yaml").read_text().replace(RUNBOOKS, "https://wiki.internal/ops.md")
    # A copy beside its component, in a directory of its own: one made in deploy/kubernetes/
    # was a layout that the kubernetes tests running meanwhile found and failed on.
    moved = tmp_path / LAYOUT.name
    shutil.copytree(LAYOUT, moved)
    shutil.copytree(LAYOUT.parent / "monitor-labels", tmp_path / "monitor-labels")
    (moved / "kustomization.yaml").write_text(text)
    (elsewhere,) = build(moved)
    urls = [r["annotations"]["runbook_url"] for g in elsewhere["spec"]["groups"] for r in g["rules"]]
    assert urls and all(u.startswith("https://wiki.internal/ops.md#redisstats") for u in urls), urls


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write_rule()
    print(f"wrote {RULE_FILE.relative_to(ROOT)}")
