"""redis_stats/outage.py: each outage's start and end in the log, at one level, for every
outage of a lifetime, and a flapping link that cannot flood the log (a clock of the test's own)."""

from __future__ import annotations

import logging
import re

import pytest

from redis_stats.outage import BURST, REFILL, Outage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def outage(clock: Clock, **kw) -> Outage:
    return Outage(
        "flushes of w to redis://x", logging.getLogger("test.outage"), clock=clock, wall=clock, **kw
    )


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "test.outage"]


def test_two_outages_are_two_pairs_of_lines_each_end_at_its_start_level(clock, caplog):
    link = outage(clock, retry="retried every 1 s")
    caplog.set_level(logging.DEBUG, logger="test.outage")
    for _ in range(2):
        link.succeeded()
        clock.now += 5
        for kind in ("connection", "connection", "timeout"):
            link.failed(kind, "Error 111 connecting")
            clock.now += 1
        link.succeeded("nothing lost")
        clock.now += 100
    got = lines(caplog)
    assert len(got) == 4, got
    starts, ends = got[0::2], got[1::2]
    for level, text in starts:
        assert level == logging.WARNING
        assert text.startswith(
            "flushes of w to redis://x failed (connection: Error 111 connecting): outage started"
        )
        assert text.endswith("; retried every 1 s")
    for level, text in ends:
        assert level == logging.WARNING
        assert "works again: outage ended after 3.0 s" in text
        assert "3 attempts failed (connection 2, timeout)" in text and text.endswith("; nothing lost")


def test_an_outage_started_at_info_ends_at_info(clock, caplog):
    link = outage(clock)
    caplog.set_level(logging.DEBUG, logger="test.outage")
    link.failed("connection", "x", level=logging.INFO)
    link.failed("connection", "x", level=logging.WARNING)  # the outage's level is its start's
    link.succeeded()
    assert [level for level, _ in lines(caplog)] == [logging.INFO, logging.INFO]


def test_what_ended_is_asked_only_when_an_outage_ends(clock):
    link = outage(clock)
    asked = []

    def ended() -> str:
        asked.append(1)
        return "kept"

    for _ in range(5):
        link.succeeded(ended)
    link.failed("timeout", "x")
    link.succeeded(ended)
    link.succeeded(ended)
    assert asked == [1]


def test_a_flapping_link_cannot_flood_the_log_and_every_outage_is_accounted_for(clock, caplog):
    link = outage(clock)
    caplog.set_level(logging.DEBUG, logger="test.outage")
    flaps = 500
    for _ in range(flaps):  # down 0.2 s, up 0.2 s: for 200 s
        link.failed("connection", "reset")
        clock.now += 0.2
        link.succeeded()
        clock.now += 0.2
    got = lines(caplog)
    # BURST pairs at once, then at most one line per REFILL s (a start, whose end follows).
    assert len(got) <= 2 * (BURST + 200 / REFILL + 1), len(got)
    starts = [t for _, t in got if "outage started" in t]
    ends = [t for _, t in got if "outage ended" in t]
    assert len(starts) == len(ends)  # every start logged has its end
    # The outages not logged one by one are all said (in a later line), and nothing is lost.
    clock.now += REFILL
    link.succeeded()
    said = [t for _, t in lines(caplog) if "not logged one by one" in t]
    counted = sum(int(re.search(r"(\d+) (?:more )?outages? since", text).group(1)) for text in said)
    assert len(starts) + counted == flaps, (len(starts), counted)
    assert "works again after" in lines(caplog)[-1][1]


def test_an_outage_held_back_by_the_limit_is_logged_when_it_lasts(clock, caplog):
    link = outage(clock)
    caplog.set_level(logging.DEBUG, logger="test.outage")
    for _ in range(BURST):
        link.failed("connection", "x")
        link.succeeded()
    link.failed("connection", "refused")  # past the limit: not logged yet
    assert len(lines(caplog)) == 2 * BURST
    clock.now += REFILL  # still down a minute later: the next failure logs its start
    link.failed("connection", "refused")
    start = lines(caplog)[-1][1]
    assert "outage started at " in start
    clock.now += 1
    link.succeeded()
    assert "outage ended after 61.0 s" in lines(caplog)[-1][1]
