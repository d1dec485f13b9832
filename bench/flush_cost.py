"""Redis server time of one flush, against a floor measured in the same run (issue 15).

Starts one private redis-server (a free loopback port, never 6379) and measures, from
``INFO commandstats`` after a warm-up, the server time per call (``usec_per_call``) of:

- the floor: one Lua script doing 45 HINCRBYs on one hash (about what a busy engine changes per
  flush), and a plain HSET of 45 fields;
- **after**: the package's ``flush.lua`` (schema 2) with exactly the arguments the writers build;
- **before**: the schema-1 flush script (``bench/baseline/flush_schema1.lua``, merging histograms
  in Lua) with the same batches in its own argument format (deltas, all self-metrics);
- each one's duplicate path (a batch already applied, sent again);
- the load feed's ``load.lua`` (docs/load.md) that a writer given ``load=VLLM_LOAD`` pipelines
  beside each flush (mode 2: store and collect garbage), and the same entries alone (mode 0: what
  ``load_interval`` sends between flushes), with the writers' own arguments.

The busy-engine profile is real: two writers (two API servers of one engine, as the vLLM plugin
runs them, with an owner claim) record vLLM-shaped traffic through ``VllmRecorder`` driven by
``SimulatedApiServer`` (20 engine steps of 50 ms per flush, i.e. a 1 s flush interval). Each
candidate runs in its own namespace; the rounds interleave the candidates so that the machine's
noise hits them alike. The candidates measured before choosing the format, and why, are in
docs/key-schema.md ("Schema 2").

Usage: python bench/flush_cost.py [--rounds 9] [--calls 150] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
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

SCHEMA1 = Path(__file__).resolve().parent / "baseline" / "flush_schema1.lua"

FLOOR_LUA = """
for j = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[j], ARGV[j + 1]) end
return 1
"""


@dataclass
class Flush:
    """One flush of one writer: the schema-2 arguments it sent, and the same batch as schema 1's
    arguments (deltas, every self-metric, gauge fields ending with the writer id)."""

    keys: list[str]
    args: list[str]
    schema1: list[str]
    series: int = 0
    args_bytes: int = 0
    load: tuple[list[str], list[str]] | None = None  # load.lua beside it (load=VLLM_LOAD)


def schema1_args(writer: StatsWriter, args: list[str]) -> list[str]:
    """The batch in flight as the schema-1 script took it."""
    batch = writer._protocol.in_flight
    assert batch is not None
    stats = writer.stats.as_fields(writer.drops, 0, writer.engines, writer.owner)
    out = [*args[:4], "1", *args[5:7], "1", "0", str(len(stats) // 2), *stats, str(len(batch.specs))]
    for spec in batch.specs:
        out += (spec.name, spec.to_json())
    for engine, block in batch.engines.items():
        ints = [str(x) for x in block.ints]
        floats = [x if i % 2 == 0 else repr(x) for i, x in enumerate(block.floats)]
        gauges = [f"{x}|{writer.writer_id}" if i % 2 == 0 else x for i, x in enumerate(block.gauges)]
        hists = []
        for j in range(0, len(block.hists), 3):
            name, total, counts = block.hists[j : j + 3]
            hists += (name, repr(total), " ".join(map(str, counts)))
        out += (str(engine), str(len(ints) // 2), str(len(floats) // 2), str(len(gauges) // 2))
        out += (str(len(hists) // 3), *ints, *floats, *gauges, *hists)
    return out


def busy_profile(batches: int, writers: int = 2, steps_per_flush: int = 20) -> list[list[Flush]]:
    """*batches* flushes of each of *writers* API servers of one busy engine (the first carries
    the catalogue), as each writer built them. One list of flushes per writer, in order."""
    out: list[list[Flush]] = []
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace="profile")
    for w in range(writers):
        writer = StatsWriter(
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
            keys, args = writer.prepare_flush()
            batch = writer._protocol.in_flight
            series = sum(
                len(b.ints) // 2 + len(b.floats) // 2 + len(b.gauges) // 2 for b in batch.engines.values()
            )
            series += sum(len(b.hists) // 3 for b in batch.engines.values())
            flush = Flush(keys, args, schema1_args(writer, args), series, sum(map(len, args)))
            flush.load = writer.load_call(args)
            flushes.append(flush)
            # As if Redis confirmed it: the writer's totals and self-metrics move on as in a real run.
            writer.flush_succeeded([1, int(time.time() * 1000), 0, [], 0], 0.0004)
        writer._closed = True
        out.append(flushes)
    return out


def usec_per_call(client: redis.Redis, command: str) -> float:
    """``usec_per_call`` of *command* in INFO commandstats since the last reset."""
    entry = client.info("commandstats").get(f"cmdstat_{command}")
    return float(entry["usec_per_call"]) if entry else float("nan")


@dataclass
class Candidate:
    name: str
    script: str | None  # Lua source; None: a native command (the plain HSET)
    calls: list[tuple[list[str], list[str]]]  # (keys, args) per call, in order
    setup: list[tuple[list[str], list[str]]] = field(default_factory=list)


def in_namespace(ns: str, keys: list[str], args: list[str]) -> tuple[list[str], list[str]]:
    """A call moved to namespace *ns* (its keys and the prefix argument)."""
    old = args[0]
    new = Keys(ns).prefix
    return [new + k[len(old) :] for k in keys], [new, *args[1:]]


def build(profile: list[list[Flush]], warm: int) -> list[Candidate]:
    """Every candidate's calls: the same batches, each candidate in its own namespace."""
    flushes = [f for group in zip(*profile) for f in group]  # the writers alternate, as in time
    after = [in_namespace("after", f.keys, f.args) for f in flushes]
    # Schema 1's script declared its six fixed keys only (it built the others from the prefix).
    before = [in_namespace("before", f.keys[:6], f.schema1) for f in flushes]
    n = len(flushes)
    # The floor: 45 HINCRBYs on one hash, field names as long as the profile's.
    names = [line for f in profile[0][:3] for line in f.args if line.startswith("vllm:")]
    names = [x for text in names for x in text.split("\n")]
    names = list(dict.fromkeys(names))[:45]
    assert len(names) == 45, len(names)
    floor = [(["floor:{x}"], [x for name in names for x in (name, "3")])] * n
    hset = [
        (["hset:{x}"], ["HSET", "hset:{x}", *[x for name in names for x in (name, "1796069412345.123|12.0")]])
    ] * n
    flush_lua = load_script("flush")
    schema1 = SCHEMA1.read_text()
    load_keys = Keys("load")
    beside = [([load_keys.load, load_keys.writers], f.load[1]) for f in flushes if f.load is not None]
    alone = [(k, [a[0], "0", *a[2:]]) for k, a in beside]
    assert len(beside) == n
    return [
        Candidate("floor: 45 HINCRBY in one script", FLOOR_LUA, floor),
        Candidate("plain HSET of 45 fields (no script)", None, hset),
        Candidate("before: schema 1 flush (histograms merged in Lua)", schema1, before),
        Candidate("  schema 1 duplicate path (already applied)", schema1, before[warm - 2 : warm - 1] * n),
        Candidate("after: schema 2 flush.lua (writers' chunks)", flush_lua, after),
        Candidate("  schema 2 duplicate path (already applied)", flush_lua, after[warm - 2 : warm - 1] * n),
        Candidate("load.lua beside the flush (load=VLLM_LOAD)", load_script("load"), beside),
        Candidate("  load.lua alone (load_interval)", load_script("load"), alone),
    ]


def run(client: redis.Redis, cand: Candidate, start: int, count: int) -> float:
    """Send calls [start, start + count) of *cand*; the server's µs per call."""
    if cand.script is None:
        client.config_resetstat()
        for _keys, args in cand.calls[start : start + count]:
            client.execute_command(*args)
        return usec_per_call(client, "hset")
    sha = client.script_load(cand.script)
    client.config_resetstat()
    for keys, args in cand.calls[start : start + count]:
        client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
    return usec_per_call(client, "evalsha")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=150, help="calls per candidate per round")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 50 calls (a smoke run)")
    opts = parser.parse_args()
    if opts.quick:
        opts.rounds, opts.calls = 2, 50
    warm = 40  # calls per candidate before measuring: the catalogue stored, the hashes at full size
    per_writer = (warm + opts.rounds * opts.calls) // 2 + 1
    profile = busy_profile(per_writer)
    tail = [f for group in profile for f in group[warm // 2 :]]
    print(
        "busy-engine profile: 2 API servers of one engine, vLLM-shaped traffic through VllmRecorder, "
        f"1 s of engine steps per flush; per flush {statistics.mean(f.series for f in tail):.0f} changed "
        f"series, schema 2 arguments {statistics.mean(len(f.args) for f in tail):.0f} "
        f"({statistics.mean(f.args_bytes for f in tail) / 1024:.1f} KB), schema 1 arguments "
        f"{statistics.mean(len(f.schema1) for f in tail):.0f} "
        f"({statistics.mean(sum(map(len, f.schema1)) for f in tail) / 1024:.1f} KB)"
    )
    cands = build(profile, warm)
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        for cand in cands:  # warm-up: scripts loaded, specs stored, hashes at full size
            run(client, cand, 0, warm)
        results: dict[str, list[float]] = {c.name: [] for c in cands}
        for r in range(opts.rounds):
            start = warm + r * opts.calls
            for cand in cands:
                results[cand.name].append(run(client, cand, start, opts.calls))
        client.close()
    floor = statistics.median(results[cands[0].name])
    print(f"\nserver µs per call (INFO commandstats), median of {opts.rounds} rounds x {opts.calls} calls")
    print(f"    {'':<52}{'µs/call':>9}{'min':>8}{'max':>8}{'x floor':>9}")
    for cand in cands:
        xs = results[cand.name]
        med = statistics.median(xs)
        print(f"    {cand.name:<52}{med:>9.1f}{min(xs):>8.1f}{max(xs):>8.1f}{med / floor:>9.2f}")
    before = statistics.median(results[cands[2].name])
    after = statistics.median(results[cands[4].name])
    load = statistics.median(results[cands[6].name])
    print(
        f"\n    load.lua beside a flush: {load:.1f} µs, {load / after:.2f}x the flush's own; the flush "
        f"and its load entries together {(after + load) / floor:.2f}x the floor"
    )
    print(
        f"\n    after/floor {after / floor:.2f} (target <= 1.00); before/after {before / after:.1f}x; "
        f"one Redis core carries ~{1e6 / after:,.0f} flushes/s of this profile (before: ~{1e6 / before:,.0f})"
    )


if __name__ == "__main__":
    main()
