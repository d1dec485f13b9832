"""The shipped Grafana dashboard's queries as Grafana sends them to Prometheus.

Grafana interpolates a panel's PromQL as text before sending it: ``$var`` and ``${var}`` become
the picked values (a variable that is ``multi`` or ``includeAll`` is regex-escaped, several values
become ``(a|b)``, "All" its ``allValue``), and the interval macros become durations computed from
the panel's step and the data source's scrape interval. This does the same, for the tests that
run every panel in a real Prometheus; a ``$`` left over (a macro or variable not known here)
fails the test instead of reaching Prometheus as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..conftest import ROOT

DASHBOARD = ROOT / "compose" / "grafana" / "dashboards" / "redis_stats_fleet.json"
ALL = object()  # "All" picked for a variable that offers it


def load(path: Path = DASHBOARD) -> dict:
    return json.loads(path.read_text())


def regex_escape(value: str) -> str:
    """Grafana's ``prometheusSpecialRegexEscape``: a value of a multi-value variable, put inside
    ``=~"..."`` as PromQL text."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def rate_interval(step: float, scrape_interval: float) -> float:
    """``$__rate_interval``: max($__interval + scrape interval, 4 x scrape interval)."""
    return max(step + scrape_interval, 4 * scrape_interval)


@dataclass(frozen=True)
class Query:
    panel: str
    legend: str
    expr: str


def queries(
    dash: dict, picked: Mapping[str, object], *, step: float, scrape_interval: float
) -> Iterator[Query]:
    """Every panel target's expression with *picked* (variable name -> a value, a list of values,
    or :data:`ALL`) and the interval macros filled in as Grafana fills them."""
    variables = {v["name"]: v for v in dash["templating"]["list"] if v["type"] == "query"}
    assert set(picked) == set(variables), (sorted(picked), sorted(variables))
    text = {name: _format(variables[name], value) for name, value in picked.items()}
    macros = {
        "__rate_interval": f"{rate_interval(step, scrape_interval):g}s",
        "__interval": f"{step:g}s",
        "__interval_ms": f"{step * 1000:g}",
    }
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = _fill(target["expr"], {**text, **macros})
            yield Query(panel["title"], target.get("legendFormat", ""), expr)


def _format(variable: dict, value: object) -> str:
    if value is ALL:
        assert variable.get("includeAll"), f"{variable['name']} offers no All"
        return str(variable["allValue"])
    values: Sequence[str] = value if isinstance(value, list) else [str(value)]
    if not (variable.get("multi") or variable.get("includeAll")):
        assert len(values) == 1, variable["name"]
        # prometheusRegularEscape: a single-value variable's backslashes and quotes only
        return values[0].replace("\\", "\\\\").replace("'", "\\\\'")
    escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _fill(expr: str, values: Mapping[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"{name!r} in {expr}: not a variable or macro Grafana fills here"
        return values[name]

    out = re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)
    assert "$" not in out, out
    return out
