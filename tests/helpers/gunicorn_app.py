"""A WSGI app for ``gunicorn --preload``: the writer is made at import, in the master, before
the workers are forked (the case a preloaded web app meets). Every request records one
``requests``, 3 ``tokens`` (through a child bound at import) and one latency observation.

Settings come from REDIS_STATS_* variables (URL, NAMESPACE).
"""

from redis_stats import StatsConfig, StatsWriter
from tests.conftest import sample_catalog

writer = StatsWriter(StatsConfig.from_env(flush_interval=0.05), sample_catalog(), engines=[0], role="web")
tokens = writer.counter("tokens").labels(engine=0)  # bound in the master, used in the workers
latency = writer.histogram("latency_seconds").labels(engine=0)


def app(environ, start_response):
    writer.counter("requests").labels(engine=0, reason="ok").inc()
    tokens.inc(3)
    latency.observe(0.3)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]
