"""The lease's sans-I/O core with no Redis: what a renewal asks, what each answer means, when a
holder stops counting itself leader, and when there is something to release."""

import time

import pytest

from redis_stats._core.lease import LeaseState
from redis_stats.keys import Keys


def _state(ttl: float = 3.0) -> LeaseState:
    return LeaseState(Keys("ns"), "me", ttl)


def test_a_renewal_asks_lease_lua_to_acquire_for_this_holder_every_third_of_the_ttl():
    state = _state(3.0)
    keys, args = state.renewal()
    assert keys == [Keys("ns").leader, Keys("ns").leader_epoch]
    assert args == ["me", 3000, "acquire"]
    assert state.period == pytest.approx(1.0)
    with pytest.raises(ValueError):
        _state(0.3)


def test_validity_is_counted_from_when_the_renewal_was_sent_minus_the_margin():
    state = _state(3.0)
    state.renewal()
    sent = time.monotonic()
    time.sleep(0.05)  # the answer arrives later: it does not extend the lease
    assert state.renewed(7) and state.is_leader() and state.token == 7
    assert sent - 0.05 <= state.valid_until - (3.0 - state.margin) <= sent


def test_a_new_fencing_token_is_a_new_tenure_and_on_acquire_runs_once_per_tenure():
    state, calls = _state(), []
    state.on_acquire = lambda: calls.append(state.token)
    state.renewal()
    state.renewed(5)
    state.renewal()
    state.renewed(5)  # a renewal of the same tenure
    assert calls == [5]
    state.renewal()
    state.renewed(0)  # lost: another process holds it
    assert not state.is_leader() and state.valid_until == 0.0
    state.renewal()
    state.renewed(9)
    assert calls == [5, 9]


def test_a_failing_on_acquire_callback_does_not_lose_the_lease():
    state = _state()
    state.on_acquire = lambda: 1 / 0
    state.renewal()
    assert state.renewed(1) and state.is_leader()


def test_no_answer_keeps_the_lease_only_while_it_is_still_valid():
    state = _state(0.5)
    assert not state.renewed(ConnectionError("down"))  # never held
    state.renewal()
    state.renewed(3)
    state.renewal()
    assert state.renewed(ConnectionError("down")) and state.token == 3
    assert state.renewed("not a token") and state.token == 3  # a bad reply counts as no answer
    time.sleep(0.5 - state.margin + 0.02)
    state.renewal()
    assert not state.renewed(TimeoutError("still down")) and not state.is_leader()


def test_release_only_what_is_held_and_only_once():
    state = _state()
    assert state.release() is None  # never held: nothing to send
    state.renewal()
    state.renewed(4)
    assert state.release() == ([Keys("ns").leader, Keys("ns").leader_epoch], ["me", 0, "release"])
    assert not state.is_leader()
    assert state.release() is None
