"""Redis server time of one flush against a floor, at the paces writers really flush (issues 15, 28).

Starts one private redis-server (a free loopback port, never 6379) and measures, per script call
and by script SHA (``SLOWLOG`` with threshold 0: Redis' own time of each call), the server time of:

- the floor: one Lua script doing 45 HINCRBYs on one hash (about what a busy engine changes per
  flush);
- the package's ``flush.lua`` with exactly the arguments the writers build (the vLLM plugin's
  writers: their load entries, the ``/load`` feed's fields, travel in the flush).

at three paces, the two candidates interleaved call by call so that the machine's noise and the
server's state hit them alike:

- **back to back**: calls one after the other (a warm server: how these figures were first taken);
- **one writer** at its flush interval (``--interval``, default 1 s: the server idles between
  calls and runs each one cold, as it does for a single live writer);
- **the fleet's rate** (``--fleet-rate`` calls per second in all, default 2,048: 1,024 engines x 2
  API servers at 1 flush/s), as far as one client process can send them (the rate reached is
  printed).

The busy-engine profile is real: two writers (two API servers of one engine, as the vLLM plugin
runs them, with an owner claim) record vLLM-shaped traffic through ``VllmRecorder`` driven by
``SimulatedApiServer`` (20 engine steps of 50 ms per flush, i.e. a 1 s flush interval); their
steady-state flushes are cycled, each sent with the writer's next sequence number (so every call
is applied, never a duplicate). As at 1 s a flush, one flush in 5 stores the writers' routine
self-metrics (``STATS_INTERVAL``) and one in 8 claims the engine (``stale_after / 4``);
``--every-flush`` adds the same script with both in every call (as before those intervals). The
candidates measured before choosing the stored format, and why, are in docs/benchmarks.md
("Schema 2: what a flush costs Redis, and the format chosen").

Usage: python bench/flush_cost.py [--rounds 2] [--interval 1.0] [--single-calls 15] [--variant other.lua]
                                  [--before bench/baseline/flush_before_held.lua]
                                  [--fleet-rate 2048] [--fleet-seconds 3] [--every-flush] [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats._scripts import load_script  # noqa: E402
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.keys import Keys  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402
from redis_stats.tools.simulate import SimulatedApiServer  # noqa: E402
from redis_stats.writer.stats import CLAIMS_PER_STALE, STATS_INTERVAL  # noqa: E402

PROFILE_INTERVAL = 1.0  # seconds of engine steps per flush in the profile (20 steps of 50 ms)
# Flushes per flush that stores the routine self-metrics, and per flush that claims the engine
# (every stale_after / 4, the default stale_after), at the profile's interval.
STATS_EVERY = max(1, round(STATS_INTERVAL / PROFILE_INTERVAL))
CLAIMS_EVERY = max(1, round(StatsConfig().stale_after / CLAIMS_PER_STALE / PROFILE_INTERVAL))
READ_EVERY = 120  # calls between two reads of the slow log at a fast pace (see measure)
SLOWLOG_US = 10  # the slow log's threshold (see main)

FLOOR_LUA = """
for j = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[j], ARGV[j + 1]) end
return 1
"""


@dataclass
class Flush:
    """One flush of one writer: the arguments it sent."""

    keys: list[str]
    args: list[str]
    series: int = 0
    args_bytes: int = 0


def busy_profile(
    batches: int,
    writers: int = 2,
    steps_per_flush: int = 20,
    stats_every: int = STATS_EVERY,
    claims_every: int = CLAIMS_EVERY,
) -> list[list[Flush]]:
    """*batches* flushes of each of *writers* API servers of one busy engine (the first carries
    the catalogue), as each writer built them. One list of flushes per writer, in order; one
    flush in *stats_every* stores the writer's self-metrics, one in *claims_every* claims its
    engine (as a writer does at 1 s a flush: the profile is built faster than real time)."""
    out: list[list[Flush]] = []
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace="profile")
    for w in range(writers):
        writer = StatsWriter(  # as the vLLM plugin makes it: its load entries travel in the flush
            cfg, vllm_catalog(), engines=[0], start=False, role=f"api{w}", owner="node1:4242", load=VLLM_LOAD
        )
        sim = SimulatedApiServer(VllmRecorder(writer, "meta-llama/Llama-3-8B", [0]), 0, seed=w + 1)
        now = time.monotonic()
        step = 0
        flushes = []
        for _ in range(batches):
            for _ in range(steps_per_flush):
                sim.step(now + step * 0.05)
                step += 1
            writer.stats_interval = 0.0 if len(flushes) % stats_every == 0 else math.inf
            writer.claim_interval = 0.0 if len(flushes) % claims_every == 0 else math.inf
            [(_shard, keys, args)] = writer.prepare_flushes()
            batch = writer._flows[0].in_flight
            assert batch is not None
            flushes.append(Flush(keys, args, batch.series(), sum(map(len, args))))
            # As if Redis confirmed it: the writer's totals and self-metrics move on as in a real run.
            writer.flush_succeeded([1, int(time.time() * 1000), 0, [], 0], 0.0004)
        writer._closed = True
        out.append(flushes)
    return out


def in_namespace(ns: str, keys: list[str], args: list[str]) -> tuple[list[str], list[str]]:
    """A call moved to namespace *ns* (its keys and the prefix argument)."""
    old = args[0]
    new = Keys(ns).prefix
    return [new + k[len(old) :] for k in keys], [new, *args[1:]]


class Calls:
    """The flush calls of the profile's writers, cycled: each call carries its writer's next
    sequence number (and the one before as confirmed), so the script applies every one (no
    duplicate path)."""

    def __init__(self, profile: list[list[Flush]], warm: int, ns: str) -> None:
        self.first = [in_namespace(ns, f.keys, f.args) for group in zip(*profile) for f in group[:warm]]
        self.steady = [[in_namespace(ns, f.keys, f.args) for f in group[warm:]] for group in profile]
        self.seq = [warm] * len(profile)
        self.n = 0

    def next(self) -> tuple[list[str], list[str]]:
        w = self.n % len(self.steady)
        group = self.steady[w]
        keys, args = group[(self.n // len(self.steady)) % len(group)]
        self.n += 1
        self.seq[w] += 1
        seq = self.seq[w]
        return keys, [*args[:2], str(seq), *args[3:7], str(seq - 1), "0", *args[9:]]


def before_held(keys: list[str], args: list[str]) -> tuple[list[str], list[str]]:
    """A call of today's ``flush.lua`` in the arguments of the one before issue 32 (no ``held``
    argument, no checked engines, no ``held`` per block), for ``--before``."""
    out = args[:9]
    i = 10
    n = int(args[i])
    out += args[i : i + 1 + n]
    i += 1 + n
    for _ in range(3):  # stats, specs, load: pairs
        n = int(args[i])
        out += args[i : i + 1 + 2 * n]
        i += 1 + 2 * n
    checked = int(args[i])
    i += 1 + 3 * checked
    while i < len(args):  # engine, held, nset, pairs -> engine, nset, pairs
        n = int(args[i + 2])
        out += [args[i], args[i + 2], *args[i + 3 : i + 3 + 2 * n]]
        i += 3 + 2 * n
    return keys[: len(keys) - checked], out


class BeforeCalls(Calls):
    """The profile's calls for the flush.lua before issue 32 (``--before``)."""

    def __init__(self, profile: list[list[Flush]], warm: int, ns: str) -> None:
        super().__init__(profile, warm, ns)
        self.first = [before_held(k, a) for k, a in self.first]
        self.steady = [[before_held(k, a) for k, a in group] for group in self.steady]


def floor_call(profile: list[list[Flush]]) -> tuple[list[str], list[str]]:
    """45 HINCRBYs on one hash, field names as long as the profile's."""
    names = [line for f in profile[0][:3] for line in f.args if line.startswith("vllm:")]
    names = [x for text in names for x in text.split("\n")]
    names = list(dict.fromkeys(names))[:45]
    assert len(names) == 45, len(names)
    return ["floor:{x}"], [x for name in names for x in (name, "3")]


def slowlog_by_sha(client: redis.Redis, shas: dict[str, str]) -> dict[str, list[int]]:
    """Server µs of each EVALSHA call logged since the last SLOWLOG RESET, by candidate name."""
    by_sha = {sha: name for name, sha in shas.items()}
    out: dict[str, list[int]] = {name: [] for name in shas}
    for entry in client.execute_command("SLOWLOG", "GET", -1):
        args = entry[3]
        if len(args) > 1 and args[0].upper() == "EVALSHA" and args[1] in by_sha:
            out[by_sha[args[1]]].append(int(entry[2]))
    return out


def measure(
    client: redis.Redis,
    shas: dict[str, str],
    calls: dict[str, Calls],
    floor: tuple[list[str], list[str]],
    n: int,
    gap: float,
) -> tuple[dict[str, list[int]], float]:
    """*n* calls of each candidate, taking turns call by call, one call every *gap* s (0: back
    to back); the server µs of each call by candidate, and the calls per second reached.

    The log is read (and reset) every :data:`READ_EVERY` calls when the pace is fast; a paced run
    (gap over 10 ms) reads it only at the end, so that no read warms the server between two calls.
    """
    names = list(shas)
    out: dict[str, list[int]] = {name: [] for name in shas}
    client.execute_command("SLOWLOG", "RESET")
    start = time.perf_counter()
    total = len(names) * n
    paused = 0.0
    for i in range(total):
        if gap:
            wait = start + paused + i * gap - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        # The order rotates every cycle, so that each candidate follows each other one alike (a
        # call right after a similar script finds its code paths warmer).
        cycle, pos = divmod(i, len(names))
        name = names[(pos + cycle) % len(names)]
        keys, args = calls[name].next() if name in calls else floor
        client.execute_command("EVALSHA", shas[name], len(keys), *keys, *args)
        if gap <= 0.01 and (i + 1) % READ_EVERY == 0:
            t0 = time.perf_counter()
            for cand, xs in slowlog_by_sha(client, shas).items():
                out[cand] += xs
            client.execute_command("SLOWLOG", "RESET")
            paused += time.perf_counter() - t0
    rate = total / (time.perf_counter() - start - paused)
    for cand, xs in slowlog_by_sha(client, shas).items():
        out[cand] += xs
    for cand, xs in out.items():
        if len(xs) != n:
            print(f"    ({cand}: {len(xs)} of {n} calls logged: some took under {SLOWLOG_US} µs)")
    return out, rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three paces")
    parser.add_argument("--calls", type=int, default=300, help="calls per candidate per round, back to back")
    parser.add_argument("--interval", type=float, default=1.0, help="one writer's flush interval (s)")
    parser.add_argument("--single-calls", type=int, default=15, help="calls per candidate per round at it")
    parser.add_argument("--fleet-rate", type=float, default=2048.0, help="calls per second in all")
    parser.add_argument("--fleet-seconds", type=float, default=3.0)
    parser.add_argument(
        "--variant",
        type=Path,
        action="append",
        default=[],
        help="another flush.lua (after common.lua), measured beside the package's (repeatable)",
    )
    parser.add_argument(
        "--every-flush",
        action="store_true",
        help="also the flush with self-metrics and claims in every call (before their intervals)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="the flush.lua of before issue 32 (bench/baseline/flush_before_held.lua), measured beside "
        "the package's with the same calls in its argument format",
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 6 paced calls (a smoke run)")
    opts = parser.parse_args()
    if opts.quick:
        opts.rounds, opts.calls, opts.single_calls, opts.fleet_seconds = 1, 100, 6, 1.0
    warm = 10  # flushes per writer before the steady state: the catalogue, every chunk's names
    variants = {path.stem: load_script("common") + path.read_text() for path in opts.variant}
    per_call = 2 + len(variants) + opts.every_flush + bool(opts.before)  # candidates taking turns
    fleet_n = int(opts.fleet_rate * opts.fleet_seconds / per_call)
    profile = busy_profile(warm + 30)
    tail = [f for group in profile for f in group[warm:]]
    print(
        "busy-engine profile: 2 API servers of one engine, vLLM-shaped traffic through VllmRecorder, "
        f"1 s of engine steps per flush; per flush {statistics.mean(f.series for f in tail):.0f} changed "
        f"series, {statistics.mean(len(f.args) for f in tail):.0f} arguments "
        f"({statistics.mean(f.args_bytes for f in tail) / 1024:.1f} KB)"
    )
    paces = [
        ("back to back", opts.calls, 0.0),
        (f"one writer, every {opts.interval:g} s", opts.single_calls, opts.interval / per_call),
        (f"fleet, {opts.fleet_rate:,.0f} calls/s", fleet_n, 1.0 / opts.fleet_rate),
    ]
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        # Redis 7 logs every command a script calls too: with a threshold of 0 the floor's 45
        # HINCRBYs would each add a log entry (and their cost) to the floor. 10 µs keeps them out
        # (they take 0.5-3 µs) and every script call in (each takes 30 µs or more; the number
        # logged is checked against the number sent).
        client.config_set("slowlog-log-slower-than", SLOWLOG_US)
        client.config_set("slowlog-max-len", 10 * max(READ_EVERY, 3 * opts.single_calls))
        shas = {"floor": client.script_load(FLOOR_LUA), "flush": client.script_load(load_script("flush"))}
        calls = {"flush": Calls(profile, warm, "after")}
        if opts.every_flush:  # the same script under another SHA, with the other profile
            shas["every flush"] = client.script_load(load_script("flush") + "\n-- every flush\n")
            every = busy_profile(warm + 30, stats_every=1, claims_every=1)
            calls["every flush"] = Calls(every, warm, "each")
        for name, source in variants.items():
            shas[name] = client.script_load(source)
            calls[name] = Calls(profile, warm, name)
        if opts.before:
            shas["before"] = client.script_load(load_script("common") + opts.before.read_text())
            calls["before"] = BeforeCalls(profile, warm, "before")
        floor = floor_call(profile)
        for name, cand in calls.items():  # the catalogue stored, every chunk's names: the steady state
            for keys, args in cand.first:
                client.execute_command("EVALSHA", shas[name], len(keys), *keys, *args)
        measure(client, shas, calls, floor, 100, 0.0)  # hashes at full size
        results: dict[str, dict[str, list[int]]] = {p: {c: [] for c in shas} for p, _, _ in paces}
        rates: dict[str, list[float]] = {p: [] for p, _, _ in paces}
        for _ in range(opts.rounds):
            for name, n, gap in paces:
                got, rate = measure(client, shas, calls, floor, n, gap)
                for cand, xs in got.items():
                    results[name][cand] += xs
                rates[name].append(rate)
        client.close()
    print(
        f"\nserver µs per call (SLOWLOG, threshold {SLOWLOG_US} µs: each call by its script SHA), "
        "the candidates interleaved call by call; "
        f"{opts.rounds} round(s) of the three paces"
    )
    print(
        f"    {'pace':<30}{'calls/s':>9}{'calls':>7}{'floor µs':>10}  {'candidate':<14}{'µs':>8}"
        f"{'x floor':>9}{'(means)':>9}{'p90 µs':>8}"
    )
    worst = 0.0
    for name, _, _ in paces:
        fl = results[name]["floor"]
        for cand in [c for c in shas if c != "floor"]:
            fx = results[name][cand]
            ratio = statistics.median(fx) / statistics.median(fl)
            if cand == "flush":
                worst = max(worst, ratio)
            p90 = sorted(fx)[int(len(fx) * 0.9)]
            print(
                f"    {name if cand == 'flush' else '':<30}{statistics.mean(rates[name]):>9,.0f}{len(fx):>7}"
                f"{statistics.median(fl):>10.1f}  {cand:<14}{statistics.median(fx):>8.1f}{ratio:>9.2f}"
                f"{statistics.mean(fx) / statistics.mean(fl):>9.2f}{p90:>8}"
            )
    fleet = statistics.median(results[paces[2][0]]["flush"])
    print(
        f"\n    worst flush/floor {worst:.2f} (target <= 1.00 at every pace; medians); at the fleet's pace "
        f"one Redis core carries ~{1e6 / fleet:,.0f} flushes/s of this profile (server time alone)"
    )


if __name__ == "__main__":
    main()
