"""The library's own health, next to the data: writer self-metrics and engine ownership conflicts."""

import logging
import time

from redis_stats import StatsReader, StatsWriter
from tests.prometheus.test_collector import samples, scrape


def test_writer_self_metrics_are_exposed_by_any_reader(config, catalog, fake_client):
    w = StatsWriter(config, catalog, engines=[0], client=fake_client(), start=False)
    w.stats_interval = 0  # every flush stores them (the cadence: test_routine_self_metrics_...)
    real = w._script

    def broken(**kw):
        raise __import__("redis").ConnectionError("down")

    w._script = broken
    w.counter("tokens").labels(engine=0).inc(float("nan"))  # dropped, counted
    assert not w.flush() and not w.flush()
    w._script = real
    assert w.flush()
    assert w.flush()
    fams, _ = scrape(StatsReader(config, catalog, client=fake_client()))
    wid = w.writer_id
    assert samples(fams["redis_stats_writer_up"]) == {("redis_stats_writer_up", (("writer", wid),)): 1.0}
    # The second flush reports what the writer knew after the first success.
    assert samples(fams["redis_stats_writer_flushes"]) == {
        ("redis_stats_writer_flushes_total", (("writer", wid),)): 1.0
    }
    assert samples(fams["redis_stats_writer_flush_errors"]) == {
        ("redis_stats_writer_flush_errors_total", (("kind", "connection"), ("writer", wid))): 2.0
    }
    assert samples(fams["redis_stats_writer_dropped_updates"]) == {
        ("redis_stats_writer_dropped_updates_total", (("reason", "invalid_value"), ("writer", wid))): 1.0
    }
    hist = samples(fams["redis_stats_writer_flush_duration_seconds"])
    assert hist[("redis_stats_writer_flush_duration_seconds_count", (("writer", wid),))] == 1.0
    age = samples(fams["redis_stats_writer_last_flush_age_seconds"])
    assert 0 <= age[("redis_stats_writer_last_flush_age_seconds", (("writer", wid),))] < 5
    w._closed = True


def test_two_live_owners_of_one_engine_are_detected_warned_once_and_exposed(
    config, catalog, fake_client, caplog
):
    a = StatsWriter(config, catalog, engines=[0], owner="node-a:100", client=fake_client(), start=False)
    b = StatsWriter(config, catalog, engines=[0], owner="node-b:200", client=fake_client(), start=False)
    a.claim_interval = b.claim_interval = 0  # both claim with every flush (the cadence: below)
    with caplog.at_level(logging.WARNING, logger="redis_stats.writer"):
        for _ in range(3):
            assert a.flush() and b.flush()
    assert a.stats.conflicts >= 2 and b.stats.conflicts >= 3
    warnings = [r for r in caplog.records if "another live instance" in r.getMessage()]
    assert len(warnings) == 2  # once per writer, not once per flush
    snap = StatsReader(config, catalog, client=fake_client()).snapshot()
    assert set(snap.engines[0].conflict) == {"node-a:100", "node-b:200"}
    fams, _ = scrape(StatsReader(config, catalog, client=fake_client()))
    assert (
        samples(fams["redis_stats_engine_conflict"])[("redis_stats_engine_conflict", (("engine", "0"),))] == 1
    )


def test_api_servers_of_one_instance_share_an_owner_and_do_not_conflict(config, catalog, fake_client):
    writers = [
        StatsWriter(config, catalog, engines=[0, 1], owner="node-a:100", client=fake_client(), start=False)
        for _ in range(3)
    ]
    for _ in range(2):
        for w in writers:
            assert w.flush()
    assert all(w.stats.conflicts == 0 for w in writers)
    fams, _ = scrape(StatsReader(config, catalog, client=fake_client()))
    assert set(samples(fams["redis_stats_engine_conflict"]).values()) == {0.0}


def test_routine_self_metrics_wait_for_the_stats_interval_the_rest_go_at_once(config, catalog, fake_client):
    """Flush counts and durations change with every flush: they are stored at most every
    ``stats_interval`` (each flush that stores them writes one more hash in Redis); an error, a
    drop or the writer's close is stored by the next flush."""
    w = StatsWriter(config, catalog, engines=[0], client=fake_client(), start=False)
    w.stats_interval = 60.0
    reader = StatsReader(config, catalog, client=fake_client())

    def stored() -> dict[str, str]:
        return reader.snapshot().writers[w.writer_id].stats

    assert w.flush()  # the first flush stores them all (engines, owner, stale_after, ...)
    assert stored()["flushes"] == "0" and "engines" in stored()
    for _ in range(3):
        assert w.flush()
    assert stored()["flushes"] == "0"  # only routine ones changed: they wait
    [(_shard, _keys, args)] = w.prepare_flushes()
    assert args[11] == "0"  # no self-metric in the call at all
    w.counter("tokens").labels(engine=0).inc(float("nan"))  # a drop: not routine
    assert w.flush()
    assert stored()["drop:invalid_value"] == "1" and stored()["flushes"] == "4"  # with the rest
    w.stats_interval = 0.2
    assert w.flush()
    assert stored()["flushes"] == "4"
    time.sleep(0.25)
    assert w.flush()
    assert stored()["flushes"] == "6"  # the interval passed: the routine ones are stored again
    assert w.flush()
    assert w.close()
    assert stored()["flushes"] == "8"  # a closing flush stores its last values whatever changed


def test_claims_are_renewed_every_quarter_stale_after_and_a_second_owner_is_found_at_once(
    config, catalog, fake_client
):
    """A writer claims its engines with its first flush and then every ``stale_after / 4``, not
    with every flush (each claim costs the flush a read and a write of the claims hash): a second
    live owner is found by its own first flush, and the first owner finds it at its next renewal."""
    a = StatsWriter(config, catalog, engines=[0], owner="node-a:100", client=fake_client(), start=False)
    assert a.claim_interval == config.stale_after / 4
    assert a.flush()
    for _ in range(3):
        [(_shard, _keys, args)] = a.prepare_flushes()
        assert args[10] == "0"  # no claim within the interval
        assert a.flush()
    b = StatsWriter(config, catalog, engines=[0], owner="node-b:200", client=fake_client(), start=False)
    assert b.flush() and b.stats.conflicts == 1  # found by the newcomer's first flush
    assert a.flush() and a.stats.conflicts == 0  # a has not renewed its claim yet
    a.claim_interval = 0.2
    time.sleep(0.25)
    [(_shard, _keys, args)] = a.prepare_flushes()
    assert args[10:12] == ["1", "0"]  # its renewal claims engine 0 ...
    assert a.flush() and a.stats.conflicts == 1  # ... and meets b's live claim
    snap = StatsReader(config, catalog, client=fake_client()).snapshot()
    assert set(snap.engines[0].conflict) == {"node-a:100", "node-b:200"}
    a._closed = b._closed = True
