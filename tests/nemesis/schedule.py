"""The fault schedule: a pure function of the seed and the run's length, so ``SEED=`` replays the
same faults at the same offsets against the same targets (the processes' own timing is the
machine's: a replay injects the same faults, not the same interleaving)."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["EVICTION_POLICIES", "PROCESS_SLOTS", "QUIET", "Fault", "make_schedule"]

# The processes of the deployment, by slot (a slot's process is restarted under the same slot).
PROCESS_SLOTS = {
    "sync0": "sync",
    "sync1": "sync",
    "aio0": "asyncio",
    "fork0": "fork",
    "old0": "sync-old",  # a writer of the previous release beside the current ones
    "exp0": "exporter",
    "exp1": "exporter",
    "lease0": "lease",
    "lease1": "lease",
    "lease2": "lease",
    "watch0": "watch",
    "watch1": "watch",
}

# Faults of Redis itself, one at a time (a frozen server cannot also be killed).
# "failover": the replica stops applying (frozen) for the fault's seconds, then the master is
# killed and the lagging replica promoted behind the same address (both proxies retargeted).
REDIS_FAULTS = ("redis-kill", "redis-travel", "redis-freeze", "evict", "failover")
# maxmemory-policy of an "evict" fault: the two docs/redis-servers.md asks for (the store stays
# exact), and one that evicts any key (departed writers' data lost for good, as documented).
EVICTION_POLICIES = ("noeviction", "volatile-lru", "allkeys-lru")
# Faults of a proxy between clients and Redis: "w" is the writers' and lease holders', "r" the
# exporters'.
PROXY_FAULTS = ("delay", "cut", "reset", "partition", "server-clock")
# Faults of one process.
PROCESS_FAULTS = ("kill", "pause")

QUIET = 25.0
"""Seconds at the end without faults: everything healed, the writers closed, the final reads."""


@dataclass(frozen=True)
class Fault:
    """One fault: from *at* (seconds into the run) for *seconds*, on *target*; *param* its
    strength (a delay, a probability, a clock shift, the seconds of skew of a restarted writer)."""

    at: float
    kind: str
    target: str
    seconds: float
    param: float = 0.0

    def describe(self) -> str:
        if self.kind == "evict":
            return f"evict ({EVICTION_POLICIES[int(self.param)]}) at {self.at:.1f}s for {self.seconds:.1f}s"
        extra = f" ({self.param:g})" if self.param else ""
        return f"{self.kind} {self.target}{extra} at {self.at:.1f}s for {self.seconds:.1f}s"


def _proxy_fault(rng: random.Random, at: float, seconds: float) -> Fault:
    kind = rng.choice(PROXY_FAULTS)
    target = rng.choice(("w", "r"))
    param = {
        "delay": rng.choice((0.05, 0.2, 0.6, 1.5)),
        "cut": rng.choice((0.02, 0.1, 0.3)),
        "reset": rng.choice((0.02, 0.1, 0.3)),
        "partition": 0.0,
        "server-clock": rng.choice((-300_000, -5_000, 5_000, 300_000)),
    }[kind]
    if kind == "server-clock":
        target = "w"  # what the writers see of the server's clock
    return Fault(at, kind, target, seconds, param)


def _process_fault(rng: random.Random, at: float, seconds: float, free: list[str]) -> Fault:
    target = rng.choice(free)
    kind = rng.choice(PROCESS_FAULTS)
    skew = 0.0
    if kind == "kill" and PROCESS_SLOTS[target] in ("sync", "sync-old", "asyncio", "fork"):
        skew = rng.choice((0.0, 0.0, -90.0, -2.0, 2.0, 90.0))  # the restarted writer's host clock
    return Fault(at, kind, target, seconds, skew)


def make_schedule(seed: int, duration: float) -> list[Fault]:
    """The faults of a run of *duration* seconds: a new one every 2.5 s on average, each lasting
    0.5-10 s, so several overlap; none in the last :data:`QUIET` seconds."""
    rng = random.Random(seed)
    end = duration - QUIET
    faults: list[Fault] = []
    busy: dict[str, float] = {}  # target -> when its current fault ends
    at = 3.0
    while True:
        at += rng.expovariate(1 / 2.5)
        if at >= end:
            return faults
        seconds = min(rng.uniform(0.5, 10.0), end - at)
        roll = rng.random()
        if roll < 0.25:
            kind = rng.choice(REDIS_FAULTS)
            target = "redis"
            # evict: the policy, an index of EVICTION_POLICIES (the supported ones more often)
            param = float(rng.choice((0, 0, 1, 1, 2))) if kind == "evict" else 0.0
            fault = Fault(at, kind, target, seconds, param)
        elif roll < 0.5:
            fault = _proxy_fault(rng, at, seconds)
        else:
            free = [s for s in PROCESS_SLOTS if busy.get(s, 0.0) <= at]
            if not free:
                continue
            fault = _process_fault(rng, at, seconds, free)
        key = fault.target if fault.kind not in PROXY_FAULTS else f"proxy-{fault.target}-{fault.kind}"
        if busy.get(key, 0.0) > at:
            continue  # one fault of a kind per target at a time; others overlap freely
        busy[key] = at + seconds
        faults.append(fault)
