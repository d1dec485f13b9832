"""The lease's sans-I/O core with no Redis: what a renewal asks, what each answer means, when a
holder stops counting itself leader, and when there is something to release."""

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from redis_stats._core.lease import LeaseState
from redis_stats.aio.leader import AsyncLeaseLeader
from redis_stats.keys import Keys
from redis_stats.leader import LeaseLeader


def _state(ttl: float = 3.0) -> LeaseState:
    return LeaseState(Keys("ns"), "me", ttl)


def test_a_renewal_asks_lease_lua_to_acquire_for_this_holder_every_third_of_the_ttl():
    state = _state(3.0)
    keys, args, _ = state.renewal()
    assert keys == [Keys("ns").leader, Keys("ns").leader_epoch]
    assert args == ["me", 3000, "acquire"]
    assert state.period == pytest.approx(1.0)
    with pytest.raises(ValueError):
        _state(0.3)


def test_validity_is_counted_from_when_the_renewal_was_sent_minus_the_margin():
    state = _state(3.0)
    sent = state.renewal()[2]
    time.sleep(0.05)  # the answer arrives later: it does not extend the lease
    assert state.renewed(7, sent) and state.is_leader() and state.token == 7
    assert state.valid_until == sent + 3.0 - state.margin


def test_a_new_fencing_token_is_a_new_tenure_and_on_acquire_runs_once_per_tenure():
    state, calls = _state(), []
    state.on_acquire = lambda: calls.append(state.token)
    sent = state.renewal()[2]
    state.renewed(5, sent)
    sent = state.renewal()[2]
    state.renewed(5, sent)  # a renewal of the same tenure
    assert calls == [5]
    sent = state.renewal()[2]
    state.renewed(0, sent)  # lost: another process holds it
    assert not state.is_leader() and state.valid_until == 0.0
    sent = state.renewal()[2]
    state.renewed(9, sent)
    assert calls == [5, 9]


def test_a_lapsed_tenure_answered_again_is_released_and_a_new_token_taken():
    # Found by the nemesis run (issue 48, SEED=855465088): a lagging replica promoted gave a
    # holder back the lease it had lost, with its old token, after another had printed with a
    # newer one. The old tenure is not resumed: released, then a new token taken.
    state, calls = _state(0.5), []
    state.on_acquire = lambda: calls.append(state.token)
    sent = state.renewal()[2]
    assert state.renewed(5, sent)
    sent = state.renewal()[2]
    assert not state.renewed(0, sent)  # lost: another holds it (with a newer token)
    sent = state.renewal()[2]
    assert not state.renewed(5, sent) and not state.is_leader()  # the store went back: not resumed
    _, args, sent = state.renewal()
    assert args == ["me", 0, "release"]  # the old tenure given up...
    state.renewed(0, sent)
    sent = state.renewal()[2]
    assert state.renewed(8, sent) and state.is_leader()  # ...and a new one taken
    assert calls == [5, 8]


def test_a_failing_on_acquire_callback_does_not_lose_the_lease():
    state = _state()
    state.on_acquire = lambda: 1 / 0
    sent = state.renewal()[2]
    assert state.renewed(1, sent) and state.is_leader()


def test_no_answer_keeps_the_lease_only_while_it_is_still_valid():
    state = _state(0.5)
    assert not state.renewed(ConnectionError("down"), time.monotonic())  # never held
    sent = state.renewal()[2]
    state.renewed(3, sent)
    sent = state.renewal()[2]
    assert state.renewed(ConnectionError("down"), sent) and state.token == 3
    assert state.renewed("not a token", sent) and state.token == 3  # a bad reply: no answer
    time.sleep(0.5 - state.margin + 0.02)
    sent = state.renewal()[2]
    assert not state.renewed(TimeoutError("still down"), sent) and not state.is_leader()


def test_release_only_what_is_held_and_only_once():
    state = _state()
    assert state.release() is None  # never held: nothing to send
    sent = state.renewal()[2]
    state.renewed(4, sent)
    assert state.release() == ([Keys("ns").leader, Keys("ns").leader_epoch], ["me", 0, "release"])
    assert not state.is_leader()
    assert state.release() is None


def test_overlapping_renewals_each_reply_is_judged_by_its_own_send_time():
    """A renewal (the thread's) is applied but its reply is slow; a second renewal (a caller's
    ``renew()``) is sent later and gets no answer. The key expires ttl after the first was
    applied, so the first reply must not count validity from the second one's send time."""
    leader = LeaseLeader(None, Keys("ns"), "me", ttl=3.0, start=False)
    first_sent, second_done, calls = threading.Event(), threading.Event(), []

    def script(keys: list[str], args: list[Any]) -> Any:
        calls.append(time.monotonic())
        if len(calls) == 1:
            first_sent.set()
            second_done.wait(5)  # the reply arrives after the second renewal is over
            return 1
        raise ConnectionError("lost on the way")

    leader._script = script  # type: ignore[assignment]
    thread = threading.Thread(target=leader.renew)
    before = time.monotonic()
    thread.start()
    first_sent.wait(5)
    time.sleep(0.3)
    assert not leader.renew()  # never held yet: no answer, not leader
    second_done.set()
    thread.join(5)
    assert leader.is_leader()
    assert leader.state.valid_until <= calls[0] + 3.0 - leader.state.margin
    assert leader.state.valid_until >= before + 3.0 - leader.state.margin


def test_overlapping_async_renewals_each_reply_is_judged_by_its_own_send_time():
    async def main() -> tuple[float, float, float]:
        leader = AsyncLeaseLeader(None, Keys("ns"), "me", ttl=3.0)
        first_sent, second_done, calls = asyncio.Event(), asyncio.Event(), []

        async def script(keys: list[str], args: list[Any]) -> Any:
            calls.append(time.monotonic())
            if len(calls) == 1:
                first_sent.set()
                await second_done.wait()
                return 1
            raise ConnectionError("lost on the way")

        leader._script = script  # type: ignore[assignment]
        first = asyncio.create_task(leader.renew())
        await first_sent.wait()
        await asyncio.sleep(0.3)
        assert not await leader.renew()
        second_done.set()
        assert await first
        return leader.state.valid_until, calls[0], leader.state.margin

    valid_until, first_call, margin = asyncio.run(main())
    assert valid_until <= first_call + 3.0 - margin


def test_an_older_reply_of_the_same_tenure_does_not_shorten_a_later_one():
    state = _state(3.0)
    old = state.renewal()[2]
    new = state.renewal()[2] + 0.5
    assert state.renewed(2, new)
    assert state.renewed(2, old)  # overtaken: the key's expiry was already moved on
    assert state.valid_until == new + 3.0 - state.margin


def test_a_reply_to_a_renewal_sent_before_the_release_does_not_make_it_leader_again():
    # close() releases while a renewal is still in flight (the thread's, past its join, or a
    # caller's renew()): its token arrived after the release and counted as a new tenure, so
    # the process printed for another ttl though Redis may already have deleted its key and
    # let another holder in. A renewal sent after the release is a new take, judged as usual.
    state, acquired = _state(), []
    state.on_acquire = lambda: acquired.append(1)
    state.renewed(4, state.renewal()[2])
    in_flight = state.renewal()[2]
    assert state.release() is not None
    assert not state.renewed(4, in_flight) and not state.is_leader()
    assert acquired == [1] and state.release() is None
    assert state.renewed(5, state.renewal()[2]) and state.is_leader() and acquired == [1, 1]


def test_with_wait_replicas_a_renewal_fewer_replicas_acknowledged_does_not_extend_the_validity(caplog):
    # Issue 48 (SEED=855465088): a renewal only the master holds is undone by a failover to a
    # replica that missed it, where another holder takes the lease; it must not keep this one
    # printing past the validity of its last acknowledged renewal.
    state, calls = LeaseState(Keys("ns"), "me", 0.5, wait_replicas=1, wait_timeout_ms=50), []
    state.on_acquire = lambda: calls.append(state.token)
    assert state.wait_args(0) is None and state.wait_args(ConnectionError("down")) is None
    assert state.wait_args(5) == (1, 50)
    sent = state.renewal()[2]
    with caplog.at_level(logging.INFO, logger="redis_stats.leader"):
        assert not state.renewed(state.acknowledged(5, 0), sent)  # taken on the master only: not yet
    assert calls == [] and state.token == 0
    # Nobody prints while replicas do not acknowledge: said as a warning, with how many did.
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "0 of 1 replicas" in caplog.text
    sent = state.renewal()[2]
    assert state.renewed(state.acknowledged(5, 1), sent) and calls == [5]  # acknowledged: held
    acknowledged_until = state.valid_until
    time.sleep(0.05)
    sent = state.renewal()[2]
    assert state.renewed(state.acknowledged(5, 0), sent)  # still inside the acknowledged validity...
    assert state.valid_until == acknowledged_until  # ...which it does not extend
    assert state.renewed(state.acknowledged(5, ConnectionError("lost")), sent)
    assert state.valid_until == acknowledged_until
    time.sleep(acknowledged_until - time.monotonic() + 0.01)
    assert not state.renewed(state.acknowledged(5, 0), state.renewal()[2]) and not state.is_leader()


def test_without_wait_replicas_no_wait_is_sent():
    state = _state()
    assert state.wait_args(5) is None
    with pytest.raises(ValueError, match="wait_replicas"):
        LeaseState(Keys("ns"), "me", 3.0, wait_replicas=-1)


class _Replicated:
    """A client whose replicas acknowledge *acked* writes; it records the WAITs sent."""

    def __init__(self, acked: int) -> None:
        self.acked, self.waits = acked, []  # type: list[tuple[Any, ...]]

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.waits.append(args)
        return self.acked


def test_the_lease_leader_waits_for_replicas_after_a_take_or_renewal_it_won():
    client = _Replicated(acked=0)
    leader = LeaseLeader(client, Keys("ns"), "me", ttl=3.0, start=False, wait_replicas=2, wait_timeout_ms=70)
    replies = iter([7, 7, 0])
    leader._script = lambda keys, args: next(replies)  # type: ignore[assignment]
    assert not leader.renew() and client.waits == [("WAIT", 2, 70)]  # 0 of 2: not leader
    client.acked = 2
    assert leader.renew() and leader.token == 7
    assert not leader.renew() and len(client.waits) == 2  # another holds it: nothing to wait for


def test_the_async_lease_leader_waits_for_replicas_too():
    class _Async(_Replicated):
        async def execute_command(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            self.waits.append(args)
            return self.acked

    async def main() -> tuple[bool, bool, list[tuple[Any, ...]]]:
        client = _Async(acked=0)
        leader = AsyncLeaseLeader(client, Keys("ns"), "me", ttl=3.0, wait_replicas=1, wait_timeout_ms=70)

        async def script(keys: list[str], args: list[Any]) -> Any:
            return 4

        leader._script = script  # type: ignore[assignment]
        first = await leader.renew()
        client.acked = 1
        return first, await leader.renew(), client.waits

    first, second, waits = asyncio.run(main())
    assert (first, second) == (False, True) and waits == [("WAIT", 1, 70), ("WAIT", 1, 70)]
