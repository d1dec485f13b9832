"""Claims renewed every ``stale_after / 4`` (CLAIMS_PER_STALE): what a writer believes it claimed
is what Redis holds, and an engine it starts writing is claimed at once."""

import time

import redis

from redis_stats import StatsReader, StatsWriter
from redis_stats.keys import Keys


def _claim(client, config, engine: int) -> str | None:
    return client.hget(Keys(config.namespace).claims, str(engine))


def test_a_retried_flush_answered_already_applied_does_not_count_as_a_claim(config, catalog, fake_client):
    """A flush whose reply was lost carried no claim (not due); by its retry the renewal is due,
    so the retry carries one, but Redis answers "already applied" and writes nothing: the writer
    must not believe it renewed its claim (it would wait another stale_after / 4 while Redis holds
    an old one, and a second owner's first flush would not see it)."""
    client = fake_client()
    a = StatsWriter(config, catalog, engines=[0], owner="node-a:100", client=client, start=False)
    a.claim_interval = 0.2
    assert a.flush()  # claims engine 0
    first = _claim(client, config, 0)
    real = a._script

    def reply_lost(*args, **kwargs):
        real(*args, **kwargs)  # applied ...
        raise redis.TimeoutError("Timeout reading from socket")  # ... its answer lost

    a._script = reply_lost
    [(_shard, _keys, args)] = a.prepare_flushes()
    assert args[10] == "0"  # this attempt carries no claim
    assert not a.flush()
    a._script = real
    time.sleep(0.25)  # the renewal is due: the retry carries the claim
    assert a.flush() and a.stats.duplicates == 1  # already applied: nothing written
    assert _claim(client, config, 0) == first  # Redis holds the old claim only
    [(_shard, _keys, args)] = a.prepare_flushes()
    assert args[10:12] == ["1", "0"]  # so the next flush claims engine 0 again
    assert a.flush()
    assert _claim(client, config, 0) != first
    a._closed = True


def test_an_engine_added_later_is_claimed_with_the_next_flush(config, catalog, fake_client):
    """A bridge learns a source's engines as it scrapes them (add_engines): an engine it starts
    writing is claimed with its next flush, so another live owner of it is found then, not a
    quarter of stale_after later."""
    b = StatsWriter(config, catalog, engines=[1], owner="node-b:200", client=fake_client(), start=False)
    a = StatsWriter(config, catalog, engines=[0], owner="node-a:100", client=fake_client(), start=False)
    assert b.flush() and a.flush()
    assert a.stats.conflicts == 0
    a.add_engines([1])
    [(_shard, _keys, args)] = a.prepare_flushes()
    assert args[10:13] == ["2", "0", "1"]  # both engines claimed ...
    assert a.flush() and a.stats.conflicts == 1  # ... and b's live claim of engine 1 is met
    a._closed = b._closed = True


def test_owners_with_different_stale_afters_find_the_conflict_within_the_longer_ones_renewal(
    config, catalog, fake_client
):
    """Owner a declares stale_after 60 s (renews every 15 s), b 4 s. A claim counts as live for
    the stale_after of whoever checks it: b, started while a's claim is 5 s old, does not find a
    with its first flush; a's next renewal finds b (b's claim is at most 1 s plus a flush old),
    and every reader shows the conflict from then on (its window is the longest stale_after the
    namespace's writers declared, 60 s: a renews it every 15 s, it never flickers off)."""
    client = fake_client()
    a = StatsWriter(
        config.replace(stale_after=60.0), catalog, engines=[0], owner="node-a:100", client=client, start=False
    )
    assert a.claim_interval == 15.0
    assert a.flush()
    claims = Keys(config.namespace).claims
    owner, at = client.hget(claims, "0").rsplit("|", 1)
    client.hset(claims, "0", f"{owner}|{int(at) - 5000}")  # a's claim, 5 s later (not due yet)
    b = StatsWriter(
        config.replace(stale_after=4.0), catalog, engines=[0], owner="node-b:200", client=client, start=False
    )
    assert b.flush() and b.stats.conflicts == 0  # a's claim is older than b's 4 s
    assert a.flush() and a.stats.conflicts == 0  # a's renewal is not due
    reader = StatsReader(config, catalog, client=fake_client())
    assert reader.snapshot().engines[0].conflict == ()
    a._flows[0].claimed_at -= 15.0  # 15 s later: a renews its claim and meets b's live one
    assert a.flush() and a.stats.conflicts == 1
    assert set(reader.snapshot().engines[0].conflict) == {"node-a:100", "node-b:200"}
    conflicts = Keys(config.namespace).conflicts
    pair, at = client.hget(conflicts, "0").rsplit("|", 1)
    client.hset(conflicts, "0", f"{pair}|{int(at) - 40_000}")  # found 40 s ago: within a's 60 s
    assert set(reader.snapshot().engines[0].conflict) == {"node-a:100", "node-b:200"}
    a._closed = b._closed = True


def test_conflicts_total_counts_each_engine_met_by_a_claiming_flush(config, catalog, fake_client):
    """docs/self-metrics.md, ``redis_stats_writer_conflicts_total``: one per engine a claiming flush
    finds claimed by another live owner; a flush that does not claim counts none."""
    a = StatsWriter(config, catalog, engines=[0, 1], owner="node-a:100", client=fake_client(), start=False)
    b = StatsWriter(config, catalog, engines=[0, 1], owner="node-b:200", client=fake_client(), start=False)
    assert a.flush() and b.flush()
    assert b.stats.conflicts == 2  # two engines, one flush
    assert b.flush() and b.stats.conflicts == 2  # not due: no claim, nothing counted
    a._closed = b._closed = True
