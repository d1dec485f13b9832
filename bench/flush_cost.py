"""Redis server time of one flush, against a floor measured in the same run (issue 15).

Starts one private redis-server (a free loopback port, never 6379) and measures, from
``INFO commandstats`` after a warm-up, the server time per call (``usec_per_call``) of:

- the floor: one Lua script doing 45 HINCRBYs on one hash (about what a busy engine changes per
  flush), and a plain HSET of 45 fields;
- the flush script in the package (``redis_stats/scripts/flush.lua``) with the busy-engine profile;
- candidate formats (prototypes under ``bench/prototypes/`` while deciding, see docs/key-schema.md).

The busy-engine profile is real: two writers (two API servers of one engine, as the vLLM plugin
runs them, with an owner claim) record vLLM-shaped traffic through ``VllmRecorder`` driven by
``SimulatedApiServer`` (20 engine steps of 50 ms per flush, i.e. a 1 s flush interval), and the
bench sends exactly the script arguments those writers build (``WriterCore.prepare_flush``). Every
candidate gets the same batches in its own namespace; each measurement resets the server's
statistics, sends a fresh run of batches, and reads ``usec_per_call`` of ``evalsha``.

Usage: python bench/flush_cost.py [--rounds 5] [--calls 200] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats.embedded import EmbeddedRedis  # noqa: E402
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog  # noqa: E402
from redis_stats.keys import Keys  # noqa: E402
from redis_stats.scripts import load_script  # noqa: E402
from redis_stats.simulate import SimulatedApiServer  # noqa: E402

PROTOTYPES = Path(__file__).resolve().parent / "prototypes"

FLOOR_LUA = """
for j = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[j], ARGV[j + 1]) end
return 1
"""

SEQ_ONLY_LUA = """
local t = redis.call('TIME')
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
if tonumber(ARGV[2]) <= last then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


# -- the busy-engine profile ------------------------------------------------------------------


@dataclass
class Flush:
    """One flush of one writer, parsed from the ARGV of the current flush.lua."""

    writer: str
    head: list[str]  # prefix .. stale ms
    claims: list[str]
    stats: list[str]
    specs: list[str]
    engine: str
    ints: list[str] = field(default_factory=list)
    floats: list[str] = field(default_factory=list)
    gauges: list[str] = field(default_factory=list)
    hists: list[str] = field(default_factory=list)


def parse_args(args: list[str]) -> Flush:
    """Split one flush.lua ARGV (one engine block) into its parts."""
    i = 7
    nclaims = int(args[i])
    claims = args[i + 1 : i + 1 + nclaims]
    i += 1 + nclaims
    nstats = int(args[i])
    stats = args[i + 1 : i + 1 + 2 * nstats]
    i += 1 + 2 * nstats
    nspecs = int(args[i])
    specs = args[i + 1 : i + 1 + 2 * nspecs]
    i += 1 + 2 * nspecs
    engine, nint, nfloat, ngauge, nhist = args[i], *(int(x) for x in args[i + 1 : i + 5])
    i += 5
    f = Flush(args[1], args[:7], claims, stats, specs, engine)
    f.ints = args[i : i + 2 * nint]
    i += 2 * nint
    f.floats = args[i : i + 2 * nfloat]
    i += 2 * nfloat
    f.gauges = args[i : i + 2 * ngauge]
    i += 2 * ngauge
    f.hists = args[i : i + 3 * nhist]
    assert i + 3 * nhist == len(args), "one engine block expected"
    return f


def busy_profile(batches: int, writers: int = 2, steps_per_flush: int = 20) -> list[list[Flush]]:
    """*batches* flushes of each of *writers* API servers of one busy engine (the first carries the
    catalogue). Returns one list of flushes per writer, in order."""
    out: list[list[Flush]] = []
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace="profile")
    for w in range(writers):
        writer = StatsWriter(
            cfg, vllm_catalog(), engines=[0], start=False, role=f"api{w}", owner="node1:4242"
        )
        sim = SimulatedApiServer(VllmRecorder(writer, "meta-llama/Llama-3-8B", [0]), 0, seed=w + 1)
        now = time.monotonic()
        step = 0
        flushes = []
        for _ in range(batches):
            for _ in range(steps_per_flush):
                sim.step(now + step * 0.05)
                step += 1
            _keys, args = writer.prepare_flush()
            flushes.append(parse_args(args))
            # As if Redis confirmed it: the writer's self-metrics move on as in a real run.
            writer.flush_succeeded([1, 1, 0, int(time.time() * 1000), 0, [], 0], 0.0004)
        writer._closed = True
        out.append(flushes)
    return out


# -- candidate formats ------------------------------------------------------------------------


def emit(
    f: Flush,
    ns_prefix: str,
    *,
    stats: list[str] | None = None,
    ints=None,
    floats=None,
    gauges=None,
    hists=None,
    specs=None,
) -> list[str]:
    """A flush.lua-shaped ARGV from the parts of *f* (each part may be replaced)."""
    ints = f.ints if ints is None else ints
    floats = f.floats if floats is None else floats
    gauges = f.gauges if gauges is None else gauges
    hists = f.hists if hists is None else hists
    stats = f.stats if stats is None else stats
    specs = f.specs if specs is None else specs
    head = [ns_prefix, *f.head[1:]]
    return [
        *head,
        str(len(f.claims)),
        *f.claims,
        str(len(stats) // 2),
        *stats,
        str(len(specs) // 2),
        *specs,
        f.engine,
        str(len(ints) // 2),
        str(len(floats) // 2),
        str(len(gauges) // 2),
        str(len(hists) // 3),
        *ints,
        *floats,
        *gauges,
        *hists,
    ]


def sparse(f: Flush) -> tuple[list[str], list[str]]:
    """Per-bucket fields: a HINCRBY per non-zero bucket increase, a HINCRBYFLOAT for the sum."""
    ints, floats = list(f.ints), list(f.floats)
    for j in range(0, len(f.hists), 3):
        name, dsum, deltas = f.hists[j : j + 3]
        for b, d in enumerate(deltas.split()):
            if d != "0":
                ints += (f"{name}|{b}", d)
        if float(dsum):
            floats += (f"{name}|sum", dsum)
    return ints, floats


class Absolute:
    """Per-writer absolute values: each writer's own totals (histograms "<sum> <c0> ... <cN>",
    cumulative), kept here from the deltas of the profile."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str], Any] = {}  # (writer, series field) -> total
        self.gauges: dict[tuple[str, str], str] = {}

    def update(self, f: Flush) -> list[tuple[str, str]]:
        """Apply one flush; returns the (series field, absolute value) of the series it changed."""
        changed = []
        for block in (f.ints, f.floats):
            for j in range(0, len(block), 2):
                name, delta = block[j], block[j + 1]
                total = self.totals.get((f.writer, name), 0) + (float(delta) if "." in delta else int(delta))
                self.totals[(f.writer, name)] = total
                changed.append((name, str(total)))
        for j in range(0, len(f.hists), 3):
            name, dsum, deltas = f.hists[j : j + 3]
            d = [int(x) for x in deltas.split()]
            total_sum, cum = self.totals.get((f.writer, name), (0.0, [0] * len(d)))
            running, new = 0, []
            for c, x in zip(cum, d):
                running += x
                new.append(c + running)
            total_sum += float(dsum)
            self.totals[(f.writer, name)] = (total_sum, new)
            changed.append((name, " ".join([repr(total_sum), *map(str, new)])))
        suffix = "|" + f.writer
        for j in range(0, len(f.gauges), 2):
            # The profile's gauge fields end with the writer id; in a writer's chunk they need not.
            self.gauges[(f.writer, f.gauges[j].removesuffix(suffix))] = f.gauges[j + 1]
        return changed

    def chunk(self, writer: str) -> list[tuple[str, str]]:
        """Every series of *writer* (counters, histograms, gauges) with its current value."""
        out = []
        for (w, name), total in self.totals.items():
            if w == writer:
                text = (
                    " ".join([repr(total[0]), *map(str, total[1])])
                    if isinstance(total, tuple)
                    else str(total)
                )
                out.append((name, text))
        out += [(name, v) for (w, name), v in self.gauges.items() if w == writer]
        return out


def emit_per_series(f: Flush, ns_prefix: str, changed: list[tuple[str, str]], stats: list[str]) -> list[str]:
    """ARGV of bench/prototypes/flush_series.lua: per engine {series|writer, absolute} and gauges."""
    pairs = [x for name, value in changed for x in (f"{name}|{f.writer}", value)]
    return [
        ns_prefix, *f.head[1:], str(len(f.claims)), *f.claims, str(len(stats) // 2), *stats,
        str(len(f.specs) // 2), *f.specs, f.engine, str(len(pairs) // 2), str(len(f.gauges) // 2),
        *pairs, *f.gauges,
    ]  # fmt: skip


def emit_chunks(
    f: Flush, ns_prefix: str, chunks: list[str], stats: list[str], claims: bool = True
) -> list[str]:
    """ARGV of the schema-2 flush script (bench/prototypes/flush_v3.lua): per engine {field, chunk}."""
    claimed = f.claims if claims else []
    return [
        ns_prefix, *f.head[1:], str(len(claimed)), *claimed, str(len(stats) // 2), *stats,
        str(len(f.specs) // 2), *f.specs, f.engine, str(len(chunks) // 2), *chunks,
    ]  # fmt: skip


def short_ids(changed: list[tuple[str, str]], ids: dict[str, str]) -> list[tuple[str, str]]:
    """Series fields with a short catalogue id instead of the metric name (and no bucket layout)."""
    out = []
    for name, value in changed:
        parts = name.split("|")
        parts[0] = ids.setdefault(parts[0], str(len(ids)))
        out.append(("|".join(p for p in parts if not p.startswith("h:")), value))
    return out


def changed_stats(f: Flush, last: dict[str, str]) -> list[str]:
    """Only the self-metrics that changed since the writer's previous flush."""
    out = []
    for j in range(0, len(f.stats), 2):
        k, v = f.stats[j], f.stats[j + 1]
        if last.get(k) != v:
            out += (k, v)
            last[k] = v
    return out


# -- measuring --------------------------------------------------------------------------------


def usec_per_call(client: redis.Redis, command: str) -> float:
    """``usec_per_call`` of *command* in INFO commandstats since the last reset."""
    stats = client.info("commandstats")
    entry = stats.get(f"cmdstat_{command}")
    return float(entry["usec_per_call"]) if entry else float("nan")


@dataclass
class Candidate:
    name: str
    script: str | None  # Lua source; None: a native command (plain HSET)
    calls: list[tuple[list[str], list[str]]]  # (keys, args) per call, in order
    setup: list[tuple[list[str], list[str]]] = field(default_factory=list)
    note: str = ""


def keys_for(ns: str) -> list[str]:
    k = Keys(ns)
    return [k.seq, k.engines, k.writers, k.meta, k.claims, k.conflicts]


def build(profile: list[list[Flush]], warm: int) -> list[Candidate]:
    """Every candidate's calls: the same batches, each candidate in its own namespace."""
    flush_lua = load_script("flush")
    series_lua = (PROTOTYPES / "flush_series.lua").read_text()
    chunks_lua = (PROTOTYPES / "flush_v3.lua").read_text()
    calls: dict[str, list[tuple[list[str], list[str]]]] = {}

    def add(name: str, args: list[str]) -> None:
        ns = name
        args[0] = Keys(ns).prefix
        calls.setdefault(name, []).append((keys_for(ns), args))

    absolute = Absolute()
    last_stats: dict[str, dict[str, str]] = {}
    ids: dict[str, str] = {}
    names_sent: dict[str, str] = {}
    for j in range(len(profile[0])):
        for flushes in profile:  # the two writers alternate, as they do in time
            f = flushes[j]
            add("current", emit(f, ""))
            ints, floats = sparse(f)
            add("sparse", emit(f, "", ints=ints, floats=floats, hists=[]))
            changed = absolute.update(f)
            stats = changed_stats(f, last_stats.setdefault(f.writer, {}))
            add("series-all-stats", emit_per_series(f, "", changed, f.stats))
            add("series", emit_per_series(f, "", changed, stats))
            add("series-ids", emit_per_series(f, "", short_ids(changed, ids), stats))
            chunk = absolute.chunk(f.writer)
            field = f"@|{f.writer}|0"
            add("chunk", emit_chunks(f, "", [field, "\n".join(f"{n}\t{v}" for n, v in chunk)], stats))
            names = "\n".join(n for n, _ in chunk)
            fields = [field, "\n".join(v for _, v in chunk)]
            if names_sent.get(f.writer) != names:
                fields += [f"{field}|n", names]
                names_sent[f.writer] = names
            add("chunk-names", emit_chunks(f, "", list(fields), stats))
            add("chunk-names-claims", emit_chunks(f, "", list(fields), stats, claims=j % 8 == 0))
    n = len(calls["current"])
    # The floor: 45 HINCRBYs on one hash, field names as long as the profile's.
    names = [f.ints[j] for f in profile[0][:3] for j in range(0, len(f.ints), 2)]
    names += [f.hists[j] for f in profile[0][:3] for j in range(0, len(f.hists), 3)]
    names = list(dict.fromkeys(names))[:45]
    assert len(names) == 45, len(names)
    floor = [(["floor:{x}"], [x for name in names for x in (name, "3")])] * n
    hset = [
        (["hset:{x}"], ["HSET", "hset:{x}", *[x for name in names for x in (name, "1796069412345.123|12.0")]])
    ] * n
    writers = [f.writer for fl in zip(*profile) for f in fl]
    seq_only = [(["rs:{seq}:seq"], [w, str(k + 1)]) for k, w in enumerate(writers)]
    dup = calls["current"][warm - 2 : warm - 1] * n  # an applied batch sent again: the duplicate path
    return [
        Candidate("floor: 45 HINCRBY in one script", FLOOR_LUA, floor),
        Candidate("plain HSET of 45 fields", None, hset),
        Candidate("schema 1: flush.lua, histogram merge", flush_lua, calls["current"]),
        Candidate("  its duplicate path (already applied)", flush_lua, dup),
        Candidate("  dedup check alone (TIME, HGET, HSET)", SEQ_ONLY_LUA, seq_only),
        Candidate("sparse per-bucket HINCRBY", flush_lua, calls["sparse"]),
        Candidate("per-series absolute (HSET), all self-metrics", series_lua, calls["series-all-stats"]),
        Candidate("  + self-metrics only when changed", series_lua, calls["series"]),
        Candidate("  + short catalogue ids", series_lua, calls["series-ids"]),
        Candidate("per-writer chunk (all its series, one field)", chunks_lua, calls["chunk"]),
        Candidate("  + names in their own field (CHOSEN)", chunks_lua, calls["chunk-names"]),
        Candidate("  + claims every 8th flush only", chunks_lua, calls["chunk-names-claims"]),
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
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="calls per candidate per round")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 50 calls (a smoke run)")
    opts = parser.parse_args()
    if opts.quick:
        opts.rounds, opts.calls = 2, 50
    warm = 40  # calls per writer before measuring: the catalogue stored, the hashes at full size
    per_writer = warm + opts.rounds * opts.calls // 2 + 1
    profile = busy_profile(per_writer)
    f = profile[0][-1]
    print(
        "busy-engine profile (one flush of one API server after warm-up): "
        f"{len(f.ints) // 2 + len(f.floats) // 2} counters, {len(f.gauges) // 2} gauges, "
        f"{len(f.hists) // 3} histogram series of "
        f"{statistics.mean(len(f.hists[j + 2].split()) for j in range(0, len(f.hists), 3)):.0f} buckets, "
        f"{len(f.stats) // 2} self-metric fields, {len(f.claims)} claim; 2 writers alternate"
    )
    cands = build(profile, 2 * warm)
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        for cand in cands:  # warm-up: scripts loaded, specs stored, hashes at full size
            for keys, args in cand.setup:
                client.evalsha(client.script_load(cand.script), len(keys), *keys, *args)
            run(client, cand, 0, 2 * warm)
        results: dict[str, list[float]] = {c.name: [] for c in cands}
        for r in range(opts.rounds):
            start = 2 * warm + r * opts.calls
            for cand in cands:  # interleaved, so the machine's noise hits every candidate alike
                results[cand.name].append(run(client, cand, start, opts.calls))
        client.close()
    floor = statistics.median(results[cands[0].name])
    print(f"\nserver µs per call (INFO commandstats), median of {opts.rounds} rounds x {opts.calls} calls")
    print(f"    {'':<44}{'µs/call':>9}{'min':>8}{'max':>8}{'x floor':>9}")
    for cand in cands:
        xs = results[cand.name]
        med = statistics.median(xs)
        print(f"    {cand.name:<44}{med:>9.1f}{min(xs):>8.1f}{max(xs):>8.1f}{med / floor:>9.2f}")


if __name__ == "__main__":
    main()
