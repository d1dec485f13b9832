"""A source's body and the store's view of it, as comparable samples.

Both sides become ``{(sample name, sorted labels): value}`` through prometheus_client's parsers;
the source's series get the ``engine`` label the store adds (its engine label's value, or 0,
plus the offset); ``le`` is compared as a number, ``_created`` samples are left out (the store
keeps no creation time).
"""

from __future__ import annotations

import fnmatch
import urllib.request
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from redis_stats.prometheus.collector import RedisCollector
from redis_stats.reader import StatsReader

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(families: Any, include: str, engine: Any = None) -> Samples:
    out: Samples = {}
    for fam in families:
        if fam.type in ("summary", "gaugehistogram") or fam.name.startswith("redis_stats_"):
            continue
        for s in fam.samples:
            if s.name.endswith("_created") or not fnmatch.fnmatchcase(s.name, include):
                continue
            labels = dict(s.labels)
            if engine is not None:
                labels = engine(labels)
            if "le" in labels:
                labels["le"] = repr(float(labels["le"]))
            key = (s.name, tuple(sorted(labels.items())))
            assert key not in out, f"series twice: {key}"
            out[key] = float(s.value)
    return out


def source_samples(
    body: bytes, content_type: str, *, offset: int = 0, engine_label: str | None = None, include: str = "*"
) -> Samples:
    """The source's samples as the store should show them."""
    parse = parse_om if content_type.startswith("application/openmetrics-text") else parse_text

    def engine(labels: dict[str, str]) -> dict[str, str]:
        index = int(labels.pop(engine_label, 0)) if engine_label else 0
        labels["engine"] = str(index + offset)
        return labels

    return _samples(parse(body.decode()), include, engine)


def get(url: str, accept: str) -> tuple[bytes, str]:
    """One GET of *url* with *accept*: the body and its Content-Type."""
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def store_text(config: Any, client: Any = None) -> str:
    """The namespace's Prometheus view (what the exporter's /metrics serves)."""
    return RedisCollector(StatsReader(config, client=client)).render_text()


def store_samples(
    config: Any, client: Any = None, include: str = "*", engines: set[str] | None = None
) -> Samples:
    """The store's samples of the catalogue (not redis_stats_*), of *engines* (default all)."""
    got = _samples(parse_text(store_text(config, client)), include)
    if engines is not None:
        got = {k: v for k, v in got.items() if dict(k[1]).get("engine") in engines}
    return got


def self_metric(config: Any, client: Any, name: str, **labels: str) -> float | None:
    """One redis_stats_* sample of the view (None when absent)."""
    for fam in parse_text(store_text(config, client)):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None
