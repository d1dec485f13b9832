"""Bounded scrapes: a slice of the fleet per target, families by name, label values capped.

``/metrics?slice=i/N`` serves the engines ``e % N == i`` only, read from Redis by ``read.lua``'s
own choice (one round trip; the other engines' hashes are never read), so one exporter can be
scraped as N Prometheus targets (``params: {slice: [i/N]}``) and no scrape grows with the whole
fleet. The N slices hold every engine exactly once; the fleet-wide self-metrics (every writer's
``redis_stats_writer_*``) are in slice 0 only; each scrape's own self-metrics
(:data:`PER_SCRAPE`: ``redis_stats_up``, ``redis_stats_namespace_info``, ``redis_stats_read_*``,
the skipped fields of that read, the exporter's ``redis_stats_exporter_*``, ``process_*``,
``python_*``) are in every slice, about that scrape.

``name[]=<sample name>`` (repeatable) keeps only those samples, with their families' ``# HELP``
and ``# TYPE``, as prometheus_client's own server does; a family name (the name in ``# TYPE``)
keeps the whole family.

A label value longer than the reader's ``max_label_length`` (the writer's cap too, default 1,024
characters: a writer never stores a longer one, but a writer configured otherwise, or garbage,
may have) is replaced by its first 64 characters and a digest of the whole value (two long
values stay two series), and counted in ``redis_stats_label_values_replaced``: one value of
megabytes can never make a scrape megabytes long.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import parse_qs

from prometheus_client.core import Metric

from redis_stats._core.slices import MAX_SLICES, EngineSlice

__all__ = [
    "MAX_SLICES",
    "PER_SCRAPE",
    "EngineSlice",
    "ScrapeQuery",
    "cap_families",
    "cap_label_values",
    "parse_query",
    "select_samples",
    "short_label",
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

# A replaced label value keeps this many characters of the original.
KEPT_CHARACTERS = 64


@dataclass(frozen=True)
class ScrapeQuery:
    """What a request's query string asks for: a slice, and sample names (None: all)."""

    slice: EngineSlice | None = None
    names: frozenset[str] | None = None


def parse_query(query: str) -> ScrapeQuery:
    """The ``slice`` and ``name[]`` parameters of a query string; ValueError naming a bad one."""
    params = parse_qs(query, keep_blank_values=True)
    found = params.get("slice", [])
    if len(found) > 1:
        raise ValueError(f"slice given {len(found)} times ({found}); give one i/N")
    part = EngineSlice.parse(found[0]) if found else None
    names = params.get("name[]")
    return ScrapeQuery(part, frozenset(names) if names is not None else None)


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


@lru_cache(maxsize=8)
def _long_value(cap: int) -> re.Pattern[str]:
    # A quoted label value (escapes \" \\ \n inside) of more than *cap* characters.
    return re.compile(r'="((?:[^"\\\n]|\\.){' + str(cap + 1) + r',})"')


def short_label(value: str, cap: int) -> str:
    """*value* if at most *cap* characters long, else its first :data:`KEPT_CHARACTERS`
    characters and ``...[sha1:<16 hex of the whole value>]`` (two long values stay apart)."""
    if len(value) <= cap:
        return value
    digest = hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{value[:KEPT_CHARACTERS]}...[sha1:{digest}]"


_UNESCAPE = re.compile(r"\\(.)")


def cap_label_values(text: str, cap: int) -> tuple[str, int]:
    """*text* (exposition text) with every label value longer than *cap* characters replaced
    by :func:`short_label` (the same value the prometheus_client path gives), and how many
    were replaced. Text without one is returned as it is (one regular-expression scan)."""
    pattern = _long_value(cap)
    if pattern.search(text) is None:
        return text, 0
    replaced = 0

    def short(match: re.Match[str]) -> str:
        nonlocal replaced
        replaced += 1
        raw = _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), match.group(1))
        value = short_label(raw, cap)
        return '="' + value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"'

    return pattern.sub(short, text), replaced


REPLACED = "redis_stats_label_values_replaced"
REPLACED_HELP = (
    f"Label values of this scrape longer than max_label_length, replaced by their first {KEPT_CHARACTERS} "
    "characters and a digest."
)


def replaced_text(count: int) -> str:
    """The self-metric of the label values replaced in one scrape, as text."""
    return f"# HELP {REPLACED} {REPLACED_HELP}\n# TYPE {REPLACED} gauge\n{REPLACED} {float(count)!r}\n"


def cap_families(families: list[Metric], cap: int) -> int:
    """Replace (:func:`short_label`) every label value longer than *cap* characters in the
    samples of *families*, in place; how many were replaced."""
    replaced = 0
    for family in families:
        samples = family.samples
        for i, sample in enumerate(samples):
            if not any(len(v) > cap for v in sample.labels.values()):
                continue
            labels = {}
            for name, value in sample.labels.items():
                if len(value) > cap:
                    replaced += 1
                    value = short_label(value, cap)
                labels[name] = value
            samples[i] = sample._replace(labels=labels)
    return replaced
