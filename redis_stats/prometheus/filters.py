"""Cutting a Prometheus text down: samples by name, families, the engine label; long label values.

``name[]=<sample name>`` (repeatable, on ``/metrics``) keeps only those samples, with their
families' ``# HELP`` and ``# TYPE``, as prometheus_client's own server does; a family name (the
name in ``# TYPE``) keeps the whole family (:func:`select_samples`).

A label value longer than the reader's ``max_label_length`` (the writer's cap too, default 1,024
characters: a writer never stores a longer one, but a writer configured otherwise, or garbage,
may have) is replaced by its first 64 characters and a digest of the whole value (two long
values stay two series), and counted in ``redis_stats_label_values_replaced``: one value of
megabytes can never make a scrape megabytes long. The series' values are replaced where a read
is decoded (``short_label``, once per names field), so every view shows the same; the
self-metrics' (writer ids, kinds, from the writers' stats hashes) by :func:`cap_families`.

``/metrics?slice=i/N`` serves the engines ``e % N == i`` only; the fleet-wide self-metrics (every
writer's ``redis_stats_writer_*``) are in slice 0 only; each scrape's own self-metrics
(:data:`PER_SCRAPE`) are in every slice, about that scrape.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from redis_stats._core.read.groups import KEPT_CHARACTERS, short_label
from redis_stats.prometheus.exposition import label_pairs

__all__ = [
    "PER_SCRAPE",
    "cap_families",
    "family_of",
    "replaced_text",
    "select_samples",
    "short_label",
    "without_engine_label",
    "without_families",
]

# Families every slice carries, each about its own scrape (prefixes of family names).
PER_SCRAPE = (
    "redis_stats_up",
    "redis_stats_namespace_info",
    "redis_stats_read_",
    "redis_stats_skipped_fields",
    "redis_stats_label_values_replaced",
    "redis_stats_exporter_",
    "process_",
    "python_",
)


def _family_name(line: str) -> str:
    """The metric name of a ``# HELP`` or ``# TYPE`` line."""
    return line.split(" ", 3)[2] if line.count(" ") >= 2 else ""


def _sample_name(line: str) -> str:
    end = len(line)
    for stop in ("{", " "):
        at = line.find(stop)
        if at != -1 and at < end:
            end = at
    return line[:end]


def family_of(line: str) -> str:
    """The family a line of Prometheus text belongs to: its ``# HELP``/``# TYPE`` name, or its
    sample's name (enough to tell whole gauge families apart: no suffixes)."""
    return _family_name(line) if line.startswith("#") else _sample_name(line)


def select_samples(text: str, names: Iterable[str]) -> str:
    """*text* (Prometheus text or OpenMetrics) with only the samples named in *names* (and
    every sample of a family named there), each family's ``# HELP``/``# TYPE`` kept when one
    of its samples is; a final ``# EOF`` stays."""
    wanted = set(names)
    out: list[str] = []
    header: list[str] = []
    family_wanted = False
    header_name = ""
    for line in text.split("\n"):
        if not line:
            continue
        if line.startswith("#"):
            if line == "# EOF":
                out.append(line)
                continue
            name = _family_name(line)
            if name != header_name:  # a new family begins
                header, header_name = [], name
                family_wanted = name in wanted
            header.append(line)
            continue
        if family_wanted or _sample_name(line) in wanted:
            if header:
                out += header
                header = []
            out.append(line)
    return "\n".join(out) + "\n" if out else ""


def without_families(text: str, names: frozenset[str]) -> str:
    """*text* without the lines of the families *names* (gauges: their samples carry their name)."""
    if not names:
        return text
    return "".join(line for line in text.splitlines(keepends=True) if family_of(line) not in names)


def without_engine_label(text: str, engine: int) -> str:
    """*text* with ``engine="<engine>"`` taken out of every label set (a value holding that text
    is escaped, ``\\"``: never matched)."""
    label = f'engine="{engine}"'
    return text.replace("{" + label + "}", "").replace("{" + label + ",", "{").replace("," + label, "")


REPLACED = "redis_stats_label_values_replaced"
REPLACED_HELP = (
    f"Label values of this scrape longer than max_label_length, replaced by their first {KEPT_CHARACTERS} "
    "characters and a digest."
)


def replaced_text(count: int, labels: dict[str, str] | None = None) -> str:
    """The self-metric of the label values replaced in one scrape, as text (with *labels*)."""
    pairs = label_pairs(labels or {})
    sample = REPLACED + ("{" + pairs + "}" if pairs else "")
    return (
        "# HELP "
        + REPLACED
        + " "
        + REPLACED_HELP
        + "\n# TYPE "
        + REPLACED
        + " gauge\n"
        + sample
        + " "
        + repr(float(count))
        + "\n"
    )


def cap_families(families: list[Metric], cap: int) -> int:
    """Replace (:func:`short_label`) every label value longer than *cap* characters in the
    samples of *families*, in place; how many were replaced."""
    replaced = 0
    for family in families:
        samples = family.samples
        for i, sample in enumerate(samples):
            if max(map(len, sample.labels.values()), default=0) <= cap:
                continue
            labels = {}
            for name, value in sample.labels.items():
                if len(value) > cap:
                    replaced += 1
                    value = short_label(value, cap)
                labels[name] = value
            samples[i] = sample._replace(labels=labels)
    return replaced
