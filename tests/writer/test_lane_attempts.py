"""The load lane's calls are counted (``redis_stats_writer_load_lane_calls_total``), failed ones
included: what its errors (``flush_errors_total{kind=~"load_.*"}``) are a share of, so the alerts
divide each kind of error by its own attempts (issue 50: a 2 s blip's 13 lane errors counted over
the flushes paged)."""

from __future__ import annotations

import pytest
import redis

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from tests.prometheus.test_collector import samples, scrape

pytestmark = pytest.mark.redis_server


def test_every_lane_call_is_counted_beside_the_errors_it_made(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0], start=False, load=VLLM_LOAD)
    w.stats_interval = 0  # every flush stores the self-metrics
    running = w.metric("vllm:num_requests_running").labels(0, model_name="m")
    w.metric("vllm:num_requests_waiting").labels(0, model_name="m").set(0)
    try:
        running.set(1)
        assert w.flush()
        assert not w.flush_load()  # nothing changed since the flush: no call, none counted
        running.set(2)
        assert w.flush_load()  # one call
        real = w._client.execute_command

        def blip(*args, **kwargs):
            if args[0] == "HSET":
                raise redis.ConnectionError("Redis went away")
            return real(*args, **kwargs)

        w._client.execute_command = blip
        running.set(3)
        assert w.flush_load()  # a call that failed: an attempt too
        assert w.flush_load()  # and its retry (every entry goes again)
        w._client.execute_command = real
        assert w.flush()
        wid = w.writer_id
        fams, _ = scrape(StatsReader(cfg, vllm_catalog()))
        assert samples(fams["redis_stats_writer_load_lane_calls"]) == {
            ("redis_stats_writer_load_lane_calls_total", (("writer", wid),)): 3.0
        }
        assert samples(fams["redis_stats_writer_flush_errors"]) == {
            ("redis_stats_writer_flush_errors_total", (("kind", "load_connection"), ("writer", wid))): 2.0
        }
        assert samples(fams["redis_stats_writer_flushes"]) == {
            ("redis_stats_writer_flushes_total", (("writer", wid),)): 1.0  # as of before the last flush
        }
    finally:
        w.close()
