"""Ctrl-C and SIGTERM stop a long-running command through one function (tools/stopping.py)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from redis_stats.tools.stopping import stop_on_signals


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_calls_stop_and_the_old_handlers_come_back(sig):
    stop = threading.Event()
    before = signal.getsignal(sig)
    with stop_on_signals(stop.set):
        os.kill(os.getpid(), sig)  # no KeyboardInterrupt, no end of the process
        assert stop.wait(5)
    assert signal.getsignal(sig) is before


def test_the_handlers_come_back_when_the_command_raises():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(RuntimeError), stop_on_signals(lambda: None):
        raise RuntimeError("the command failed")
    assert signal.getsignal(signal.SIGINT) is before
