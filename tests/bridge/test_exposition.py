"""The exporter's view over a bridged prometheus_client source stays a valid exposition: by
default the bridge leaves out the source's own process families (process_*, python_*), which
would clash with the exporter's own; --family still stores them when asked."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections import Counter

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats.integrations.bridge import BridgedSource
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.reader import StatsReader
from redis_stats.server import Exporter

from .compare import store_samples

PROMTOOL = shutil.which("promtool")
OPENMETRICS = "application/openmetrics-text;version=1.0.0"


def _scrape(url: str, accept: str = "") -> str:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read().decode()


def _help_lines(text: str) -> Counter[str]:
    return Counter(line.split(" ")[2] for line in text.splitlines() if line.startswith("# HELP "))


def test_the_exporter_over_a_bridged_source_serves_each_family_once(cfg, inproc):
    cat, url = inproc("sglang", process=True)  # prometheus_client's process, platform, gc collectors
    assert {"process_cpu_seconds_total", "python_info"} <= {m.name for m in parse_text(_scrape(url))} | {
        m.name + "_total" for m in parse_text(_scrape(url))
    }
    source = BridgedSource(url, cfg, known=vllm_catalog())
    cat.step(2)
    assert source.scrape(), source.stats
    exporter = Exporter(StatsReader(cfg), port=0, self_metrics=True).start()  # as the CLI serves it
    try:
        text = _scrape(exporter.url + "/metrics")
        openmetrics = _scrape(exporter.url + "/metrics", OPENMETRICS)
    finally:
        exporter.close()
        source.close()
    twice = [name for name, n in _help_lines(text).items() if n > 1]
    assert not twice, f"families served twice: {twice}"
    families = list(parse_om(openmetrics))  # raises "Clashing name" on a family served twice
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    assert "sglang:prompt_tokens" in names and "process_cpu_seconds" in names, names  # the exporter's own
    if PROMTOOL:
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True)
        out = (lint.stdout + lint.stderr).decode()
        assert "error" not in out.lower() and "second HELP" not in out, out
        assert lint.returncode in (0, 3), out  # 3: lint findings only (the ':' of sglang:* names)
    # left out, and said so (one log line each)
    assert {"process_cpu_seconds", "python_info", "python_gc_collections"} <= set(source.stats.skipped)


def test_family_stores_the_process_families_when_asked(cfg, inproc):
    _cat, url = inproc("sglang", process=True)
    source = BridgedSource(url, cfg, include=("sglang:*", "process_*"))
    assert source.scrape(), source.stats
    stored = {name for name, _ in store_samples(cfg)}
    assert "process_cpu_seconds_total" in stored and "sglang:prompt_tokens_total" in stored
    assert not any(name.startswith("python_") for name in stored)
    source.close()
