"""``/pool``: the pool's averages for the tier above, in llm-d-router's multi-cluster families.

llm-d-router's multi-cluster extractor (``pkg/epp/framework/plugins/datalayer/extractor/metrics/
multicluster.go``) scrapes each cluster's endpoint (its source: ``.../source/metrics/
multicluster.go``, https by default, a configurable ``path``, the body cut at 8 MiB) and reads two
families, ``llm_d_epp_average_kv_cache_utilization`` and ``llm_d_epp_average_queue_size``: of each
the first series (``Spec.getLatestMetric``: none carries a timestamp), a gauge's value. The picker
itself computes them as the mean over its pool's pods with fresh metrics
(``pkg/epp/datalayer/logger/logger.go``, ``refreshPrometheusMetrics``), each pod's number being
the one series it kept of that pod's scrape.

Here they are exact, from the store: the mean over the namespace's **live** engines (``up`` or
``stale``, the one rule of every view) of each engine's own KV usage and waiting requests (not
one engine standing for a data-parallel pod, not an average of scrapes), from the ``/load``
feed's newest read, one series each, labelled ``name`` (the
namespace, as the picker labels its pool). A family some live engine has no number of is not
served (a mean over the engines that report is not the pool's), nor one some live engine reports
with a value no engine can have (:mod:`redis_stats.routers.vouch`: a negative queue):
``redis_stats_pool_withheld{family,engine}`` says which; with no live engine, none is served
(the extractor then records nothing, never a zero).
"""

from __future__ import annotations

from prometheus_client.utils import floatToGoString

from redis_stats.load import LoadView
from redis_stats.prometheus.exposition import label_pairs
from redis_stats.routers.vouch import impossible

__all__ = ["CONTENT_TYPE", "FAMILIES", "PATH", "pool_text"]

PATH = "/pool"

FAMILIES = (
    (
        "llm_d_epp_average_kv_cache_utilization",
        "kv_cache_usage",
        "The average kv cache utilization for an inference server pool: the mean over its live "
        "engines (redis_stats, from the store).",
    ),
    (
        "llm_d_epp_average_queue_size",
        "requests_waiting",
        "The average number of requests pending in the model server queue: the mean over the "
        "pool's live engines (redis_stats, from the store).",
    ),
    (
        "llm_d_epp_average_running_requests",
        "requests_running",
        "The average number of requests running: the mean over the pool's live engines "
        "(redis_stats, from the store).",
    ),
)
"""(family, the load feed's field, help) of each average served."""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def pool_text(view: LoadView, name: str) -> str:
    """The Prometheus text of the pool *name*'s averages over *view*'s live engines."""
    live = [view.engines[e] for e in sorted(view.engines) if view.engines[e].up]
    pool = label_pairs({"name": name})
    lines = [
        "# HELP redis_stats_pool_engines_up Live engines of the pool (the averages' divisor).",
        "# TYPE redis_stats_pool_engines_up gauge",
        f"redis_stats_pool_engines_up{{{pool}}} {len(live)}",
    ]
    withheld = []
    for family, field, help_text in FAMILIES:
        values = [getattr(e, field) for e in live]
        missing = [e.engine for e in live if impossible(field, getattr(e, field))]
        if not live or missing:
            withheld += [(family, e) for e in missing]
            continue
        mean = sum(values) / len(values)
        lines += [
            f"# HELP {family} {help_text}",
            f"# TYPE {family} gauge",
            f"{family}{{{pool}}} {floatToGoString(mean)}",
        ]
    if withheld:
        lines += [
            "# HELP redis_stats_pool_withheld A family not served: this live engine has no number of it.",
            "# TYPE redis_stats_pool_withheld gauge",
        ]
        lines += [
            f"redis_stats_pool_withheld{{{label_pairs({'family': f, 'engine': str(e), 'name': name})}}} 1"
            for f, e in withheld
        ]
    return "\n".join(lines) + "\n"
