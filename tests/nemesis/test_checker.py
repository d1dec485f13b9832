"""The nemesis checker finds each kind of anomaly it is for, in small made-up histories, and
passes the histories the store's promises allow (a killed writer's unflushed records lost, data
taken away by a time travel); the schedule is a function of the seed."""

from __future__ import annotations

from typing import Any

from tests.nemesis.checker import check_events
from tests.nemesis.schedule import QUIET, make_schedule

S = "0|sync0"


class History:
    """Events at increasing times, as the processes would have written them."""

    def __init__(self) -> None:
        self.t = 0.0
        self.events: list[dict[str, Any]] = [{"t": 0.0, "k": "deployed", "p": "harness"}]

    def add(self, k: str, p: str = "harness", **fields: Any) -> History:
        self.t += 1.0
        self.events.append({"t": self.t, "k": k, "p": p, **fields})
        return self

    def rec(self, p: str, c: int, h: int = 0) -> History:
        return self.add("rec", p, s=S, c=c, h=h)

    def ack(self, p: str, c: int, h: int = 0) -> History:
        return self.add("ack", p, s=S, c=c, h=h, t0=self.t + 0.5)

    def read(self, k: str = "metrics", c: float | None = None, **fields: Any) -> History:
        return self.add(k, "observer", t0=self.t + 0.9, port=1, status=200, c={S: c} if c is not None else {},
                        **fields)  # fmt: skip

    def check(self) -> list[str]:
        return [a.what for a in check_events(self.events, seed=7).anomalies]


def test_a_history_within_the_promises_passes():
    h = History().rec("w.0", 70, 10).read(c=70).ack("w.0", 70, 10).add("writers_closed")
    h.add("final", c={S: 70}, h={}, g={})
    assert h.check() == []


def test_a_counter_above_what_was_recorded_is_an_anomaly():
    h = History().rec("w.0", 70).read(c=77)
    assert h.check() == ["counter 0|sync0 = 77 above what was recorded (70)"]


def test_a_final_counter_below_what_was_acknowledged_is_a_loss():
    h = History().rec("w.0", 70).ack("w.0", 70).rec("w.0", 140).add("writers_closed")
    h.add("final", c={S: 63}, h={}, g={})
    assert h.check() == ["final counter 0|sync0 = 63: acknowledged 70, recorded 140 (lost 7)"]


def test_a_killed_writers_unflushed_records_may_be_lost_and_no_more():
    h = History().rec("w.0", 70).ack("w.0", 70).rec("w.0", 140).add("killed", slot="w")
    h.rec("w.1", 7).ack("w.1", 7).add("writers_closed")
    for value in (77, 100, 147):
        h.add("final", c={S: value}, h={}, g={})
    assert h.check() == []
    h.add("final", c={S: 148}, h={}, g={})
    assert h.check() == [
        "counter 0|sync0 = 148 above what was recorded (147)",
        "final counter 0|sync0 = 148: acknowledged 77, recorded 147 (invented 1)",
    ]


def test_a_time_travel_takes_back_what_was_acknowledged_after_the_snapshot_and_nothing_before():
    h = History().rec("w.0", 70).ack("w.0", 70).add("rdb", taken=2.5).rec("w.0", 140).ack("w.0", 140)
    h.add("killed", slot="w")  # dead: nobody stores its 140 again
    h.add("loss")
    h.add("travel", taken=2.5).add("writers_closed")
    h.add("final", c={S: 70}, h={}, g={})
    assert h.check() == []
    h.add("final", c={S: 63}, h={}, g={})
    assert h.check() == ["final counter 0|sync0 = 63: acknowledged 70, recorded 140 (lost 7)"]


def test_a_torn_histogram_is_an_anomaly():
    torn = {S: {"b": {"0.3": 5, "+Inf": 5}, "count": 6, "sum": 1.8}}
    h = History().rec("w.0", 0, 6).read(h=torn)
    assert h.check() == ["histogram 0|sync0 torn: count 6, +Inf 5, sum 1.8"]
    whole = {S: {"b": {"0.3": 6, "+Inf": 6}, "count": 6, "sum": 6 * 0.3}}
    assert History().rec("w.0", 0, 6).read(h=whole).check() == []


def test_a_gauge_value_no_writer_set_is_an_anomaly():
    h = History().add("gauge", "w.0", s=S, v=3).read(g={S: 3})
    assert h.check() == []
    assert h.read(g={S: 4}).check() == ["gauge 0|sync0 = 4, a value no writer set"]


def test_two_log_line_printers_at_once_are_an_anomaly():
    h = History().add("print", "lease0.0", token=1).add("print", "lease1.0", token=2)
    assert h.check() == []
    h.add("print", "lease0.0", token=1)
    assert h.check() == [
        "log-line printer lease0.0 printed with fencing token 1 after lease1.0 printed with 2 (two "
        "printers at once, or a token handed out again)"
    ]


def test_load_up_while_the_store_cannot_be_read_is_an_anomaly():
    h = History().add("redis_frozen").add("load", "observer", t0=0.0, port=1, status=503, states=None)
    h.t += 5
    h.add("load", "observer", t0=h.t + 0.5, port=1, status=200, states={"0": ["up", None]})
    h.add("redis_thawed")
    assert h.check() == ["/load answered 200 with engines ['0'] up while the store could not be read"]


def test_watch_sequences_going_back_within_an_epoch_are_an_anomaly():
    h = History().add("watch_poll", "watch0.0", t0=0.5, status=200, since=5, epoch="e", got_epoch="e", seq=7,
                      gap=False, events=[[0, 6, "up"], [1, 7, "stale"]])  # fmt: skip
    assert h.check() == []
    h.add("watch_poll", "watch0.0", t0=1.5, status=200, since=7, epoch="e", got_epoch="e", seq=7, gap=False,
          events=[[0, 7, "up"]])  # fmt: skip
    assert h.check() == ["/watch events out of order within epoch e: since 7, seqs [7]"]


def test_the_schedule_is_a_function_of_the_seed():
    assert make_schedule(11, 300) == make_schedule(11, 300)
    assert make_schedule(11, 300) != make_schedule(12, 300)
    faults = make_schedule(11, 300)
    assert len({f.kind for f in faults}) >= 8  # every kind of fault, several at once
    assert all(f.at + f.seconds <= 300 - QUIET for f in faults)
    overlapping = sum(1 for a in faults for b in faults if a is not b and a.at <= b.at < a.at + a.seconds)
    assert overlapping > len(faults) / 2


def test_a_writer_killed_while_redis_answered_loses_less_than_a_flush_interval():
    def run(fault: bool) -> list[str]:
        h = History().add("spawn", slot="w", name="w.0").rec("w.0", 70).ack("w.0", 70)
        if fault:
            h.add("fault", phase="start", what="freeze", kind="redis-freeze", target="redis")
            h.add("fault", phase="end", what="freeze", kind="redis-freeze", target="redis")
        for c in (140, 210, 280, 350):  # recorded, one a second, never acknowledged
            h.rec("w.0", c)
        h.add("killed", slot="w").add("writers_closed")
        h.add("final", c={S: 140}, h={}, g={})
        return h.check()

    # 280 recorded 2 s before the kill: flushed by then unless something stood in the way
    assert run(fault=False) == ["final counter 0|sync0 = 140: acknowledged 280, recorded 350 (lost 140)"]
    assert run(fault=True) == []


def test_the_ledger_is_exact_and_never_above_what_was_recorded():
    h = History().add("rec", "w.0", s=S, c=0, h=0, u={"acme": [1, 70, 10, 20]})
    h.add("usage", "observer", t0=h.t, u={"acme": [1, 70, 10, 20]})
    h.add("ack", "w.0", s=S, c=0, h=0, t0=h.t, u={"acme": [1, 70, 10, 20]}).add("writers_closed")
    h.add("final", c={}, h={}, g={}, u={"acme": [1, 70, 10, 20]})
    assert h.check() == []
    h.add("usage", "observer", t0=h.t, u={"acme": [2, 70, 10, 20]})
    h.add("final", c={}, h={}, g={}, u={"acme": [1, 63, 10, 20]})
    assert h.check() == [
        "ledger requests of acme = 2 above what was recorded (1)",
        "final ledger prompt tokens usage|acme = 63: acknowledged 70, recorded 70 (lost 7)",
    ]


def test_in_flight_and_bookings_come_back_to_zero_once_drained():
    h = History().add(
        "drained", t0=0.5, port=1, status=200, states={"0": ["up", 3, 0, 0], "4": ["up", 3, None, 0]}
    )
    assert h.check() == []
    h.add("drained", t0=1.5, port=1, status=200, states={"0": ["up", 3, 1, 0], "1": ["down", None, None, 2]})
    assert h.check() == [
        "engine 0 up with in_flight 1, booked 0 after the drain",
        "engine 1 down with in_flight None, booked 2 after the drain",
    ]


def test_the_ledger_may_lose_what_an_ack_straddling_an_eviction_confirmed_and_no_more():
    h = History().add("rec", "w.0", s=S, c=0, h=0, u={"acme": [1, 70, 10, 20]})
    h.add("ack", "w.0", s=S, c=0, h=0, t0=h.t, u={"acme": [1, 70, 10, 20]})
    h.add("evict", policy="allkeys-lru", lru=True).add(
        "rec", "w.0", s=S, c=0, h=0, u={"acme": [2, 140, 20, 40]}
    )
    h.add("evict_end")  # keys evicted meanwhile: the first request, and maybe the second
    h.add("ack", "w.0", s=S, c=0, h=0, t0=h.t - 2.5, u={"acme": [2, 140, 20, 40]})  # sent before the end
    h.add("rec", "w.0", s=S, c=0, h=0, u={"acme": [3, 210, 30, 60]})
    h.add("ack", "w.0", s=S, c=0, h=0, t0=h.t, u={"acme": [3, 210, 30, 60]}).add("writers_closed")
    h.add("final", c={}, h={}, g={}, u={"acme": [1, 70, 10, 20]})  # only the third is sure to be there
    assert h.check() == []
    report = check_events(h.events, seed=7)
    assert report.ledger_lost["requests of acme"] == 2  # acknowledged, taken by the eviction
    h.add("final", c={}, h={}, g={}, u={"acme": [0, 0, 0, 0]})
    assert "final ledger requests usage|acme = 0: acknowledged 1, recorded 3 (lost 1)" in h.check()
