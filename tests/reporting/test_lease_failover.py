"""The log lease across a failover to a replica that missed the last renewal (found by the
nemesis run, issue 48, SEED=855465088): the promoted replica never saw holder A's renewal, B takes
the lease there, and A is still inside the validity that renewal gave it: two printers at once.
Not fixed yet (docs/reliability.md): strict xfail until a renewal counts only once a replica holds
it."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from redis_stats.keys import Keys
from redis_stats.leader import LeaseLeader
from redis_stats.tools.embedded import EmbeddedRedis

pytestmark = pytest.mark.redis_server


@pytest.mark.xfail(strict=True, reason="a lease renewal does not wait for a replica (issue 48, not fixed)")
def test_after_a_failover_to_a_replica_that_missed_the_renewal_there_is_one_printer(namespace):
    master = EmbeddedRedis(extra_args=["--repl-diskless-sync-delay", "0"]).start()
    replica = EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        rr = redis.Redis(port=replica.port)
        deadline = time.monotonic() + 15
        while rr.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.02)
        keys = Keys(namespace)
        a = LeaseLeader(redis.Redis(port=master.port), keys, "a", ttl=10, start=False)
        assert a.renew()  # replicated
        time.sleep(0.2)
        os.kill(replica.pid, signal.SIGSTOP)  # the replica lags from here
        assert a.renew()  # a's last renewal: the master only
        master.kill()  # the master dies
        os.kill(replica.pid, signal.SIGCONT)
        rr.replicaof("NO", "ONE")  # the lagging replica promoted
        # Its copy of a's key dates from the renewal before: it expires a ttl after that one, before
        # a's validity from its last renewal ends. Deleted here to reach that moment at once.
        rr.delete(keys.leader)
        b = LeaseLeader(rr, keys, "b", ttl=10, start=False)
        assert b.renew()
        assert not (a.is_leader() and b.is_leader()), "two printers at once"
    finally:
        replica.close()
        master.close()
