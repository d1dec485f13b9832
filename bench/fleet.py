"""A fleet's write load on Redis (issue 15): N engines x 2 API-server writers at 1 flush/s.

Prints, for N = 64, 256 and 1,024, against (a) one private redis-server and (b) the 3-master
Cluster the tests start (``tests/servers.py``): Redis CPU per node (``INFO cpu`` delta over the
wall time of the run, as a fraction of one core), flush latency p50/p99 (one script call, seen by
the client) and the scrape time of the whole namespace afterwards (``RedisCollector.render_text``).

**How the writers are driven.** This machine has 2 cores: it cannot run 2,048 writer processes
(plus their recorders) next to Redis. So the script calls are what is reproduced, not the
processes: 8 real writers (4 engines x 2 API servers, vLLM-shaped traffic through
``VllmRecorder`` and ``SimulatedApiServer``, 1 s of engine steps per flush) build 30 s of flushes
with the package's own ``prepare_flushes``; every fleet writer then sends one of those argument
lists per second, with its own writer id, engine, sequence number and chunk fields, from
``--drivers`` processes. The first two flushes of each fleet writer are the template's first two
(the catalogue, every chunk's names), as in a real start. A driver that falls behind says so.

**Calibration** (issue 28), (a) only: in the same window the bench process calls the floor (a
function of 45 ``HINCRBY`` calls on one hash, ``FCALL``, so that ``INFO commandstats`` keeps it apart
from the writers' ``EVALSHA`` calls) ``--floor-rate`` times a second, and prints the server time per
flush and per floor call at the fleet's pace, and their ratio.

(b) runs twice: with the namespace in one hash slot (``shards`` K = 1), where one master carries
the whole load, and with K = 3 (engine e in shard e % 3, one shard per master, see
docs/key-schema.md "Shards"): each fleet writer then sends its calls to its engine's shard, and
the spread is (busiest - idlest) / mean of the masters' CPU.

**The load feed** (``--load``, docs/load.md): (a) runs three times per size: without it (the
baseline), with every writer's load entries in each of its flushes (``load=VLLM_LOAD``: the
template writers' own flush arguments), and with that plus the load entries alone (the load lane's
``HSET``) every ``--load-interval`` seconds (0.1: what a router polling every 50 ms would ask for;
a driver sends its writers' calls of one tick in one pipeline, so the driver processes keep up: Redis runs the
same scripts). During the two load runs an exporter's ``/load`` refresher reads every 0.25 s. The
Redis CPU of each is printed with its ratio to the baseline of the same size, measured in the same
run.

Usage: python bench/fleet.py [--engines 64,256,1024] [--seconds 10] [--drivers 2] [--no-cluster]
                             [--only-cluster] [--load] [--load-interval 0.1]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter, codec  # noqa: E402
from redis_stats._scripts import load_script  # noqa: E402  (flush.lua)
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog  # noqa: E402
from redis_stats.integrations.vllm.load import VLLM_LOAD  # noqa: E402
from redis_stats.keys import Keys  # noqa: E402
from redis_stats.server.states.load_feed import LoadFeed  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402
from redis_stats.tools.simulate import SimulatedApiServer  # noqa: E402

TEMPLATE_ENGINES = 4
TEMPLATE_FLUSHES = 30

# The floor of bench/flush_cost.py as a function: FCALL has its own line in INFO commandstats.
FLOOR_LIBRARY = """#!lua name=rs_bench_floor
redis.register_function('floor45', function(keys, args)
  for j = 1, #args, 2 do redis.call('HINCRBY', keys[1], args[j], args[j + 1]) end
  return 1
end)
"""
FLOOR_ARGS = [x for i in range(45) for x in (f"vllm:series_{i}|meta-llama/Llama-3-8B|0", "3")]


def templates() -> list[tuple[str, list[list[str]], list[list[str]]]]:
    """(writer id, the ARGV of each of its flushes, its load entry at the same moment as
    ``[writer, engine, entry]``) of 4 engines x 2 API servers."""
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace="template")
    out = []
    for engine in range(TEMPLATE_ENGINES):
        for api in range(2):
            w = StatsWriter(
                cfg,
                vllm_catalog(),
                engines=[engine],
                start=False,
                role=f"api{api}",
                owner=f"n{engine}",
                load=VLLM_LOAD,
            )
            sim = SimulatedApiServer(
                VllmRecorder(w, "meta-llama/Llama-3-8B", [engine]), engine, seed=engine * 2 + api
            )
            step, flushes, loads = 0, [], []
            for _ in range(TEMPLATE_FLUSHES):
                for _ in range(20):
                    sim.step(step * 0.05)
                    step += 1
                flushes.append(w.prepare_flushes()[0][2])
                assert w.load is not None
                loads.append([w.writer_id, *w.load.entries([engine])])  # [writer, engine, entry]
                w.flush_succeeded([1, 0, 0, [], 0], 0.0004)
            w._closed = True
            out.append((w.writer_id, flushes, loads))
    return out


def rewrite(
    args: list[str], template_id: str, keys: Keys, writer: str, engine: int, seq: int, *, with_load: bool
) -> tuple[list[str], list[str]]:
    """A template flush as fleet writer *writer* of *engine* sends it: its KEYS and ARGV (its
    load entries in it *with_load*, else none, as a writer without a load map sends it). The
    flush's checks of what the store already holds (``held``, checked engines, a block's held
    chunk count) are left out: the fleet's writers are new to the store, and a check that fails
    makes the script apply nothing (Batch.script_args has the layout)."""
    prefix = keys.prefix
    # Confirmed: the previous one, applied "just now" (the fleet runs no gc: the time is not read).
    out = [prefix, writer, str(seq), *args[3:7], str(seq - 1), "0", ""]
    i = 10
    nclaims = int(args[i])
    out += [str(nclaims), *[str(engine)] * nclaims]
    i += 1 + nclaims
    nstats = int(args[i])
    out += args[i : i + 1 + 2 * nstats]
    i += 1 + 2 * nstats
    nspecs = int(args[i])
    out += args[i : i + 1 + 2 * nspecs]
    i += 1 + 2 * nspecs
    nload = int(args[i])
    out += (
        [str(nload), *[x for j in range(nload) for x in (str(engine), args[i + 2 + 2 * j])]]
        if with_load
        else ["0"]
    )
    i += 1 + 2 * nload
    ncheck = int(args[i])
    out.append("0")
    i += 1 + 3 * ncheck
    old_head = codec.chunk_field(template_id, 0)[:-1]
    new_head = codec.chunk_field(writer, 0)[:-1]
    blocks = 0
    while i < len(args):
        nset = int(args[i + 2])
        out += [str(engine), "0", str(nset)]
        for j in range(i + 3, i + 3 + 2 * nset, 2):
            out += [new_head + args[j][len(old_head) :], args[j + 1]]
        i += 3 + 2 * nset
        blocks += 1
    fixed = [keys.seq, keys.engines, keys.writers, keys.meta, keys.claims, keys.conflicts]
    return [*fixed, keys.writer_stats(writer), keys.load, *[keys.counters(engine)] * blocks], out


def drive(
    url: str,
    namespace: str,
    writers: list[tuple[int, int]],
    seconds: float,
    start_at: float,
    queue: Any,
    shards: int = 1,
    load: float | None = None,
    period: float = 1.0,
) -> None:
    """Send each (engine, api) writer's flushes, one per second (*period* s), spread over it, from
    wall-clock time *start_at*, to its engine's shard. Latencies are kept from the third second
    (steady state). With *load* (None: off), each flush carries its writer's load entries, and
    with *load* > 0 every writer's load entries go alone (the load lane's ``HSET``, as if every
    number changed every time) that often as well, pipelined per driver."""
    tpl = templates()
    # A loaded machine answers late: a driver must not die of the 1 s default (its writers stop).
    cfg = StatsConfig(url=url, namespace=namespace, shards=shards, socket_timeout_ms=30_000)
    writer = StatsWriter(cfg, vllm_catalog(), start=False)
    client = writer._client  # the package's own client setup
    writer._shards_script(*writer.shards_call())  # as a sharded writer does once: readers find K
    writer._closed = True
    script = client.register_script(load_script("flush"))
    shard_keys = [Keys(namespace).shard(s, shards) for s in range(shards)]
    ids = [f"fleet:{e}:api{a}" for e, a in writers]
    latencies: list[float] = []
    behind = 0.0
    start = time.monotonic() + (start_at - time.time())
    total_calls = int(seconds / period) * len(writers)
    next_tick = start + (load or 0.0)
    for n in range(total_calls):
        k, idx = divmod(n, len(writers))
        engine, api = writers[idx]
        template_id, flushes, _ = tpl[(engine % TEMPLATE_ENGINES) * 2 + api]
        at = k if k < 2 else 2 + (k - 2) % (TEMPLATE_FLUSHES - 2)
        keys = shard_keys[engine % shards]
        key_list, args = rewrite(
            flushes[at], template_id, keys, ids[idx], engine, k + 1, with_load=load is not None
        )
        due = start + (k + idx / len(writers)) * period
        while load and next_tick <= due:  # the load entries alone, every writer of this driver
            pause = next_tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            pipe = client.pipeline(transaction=False)
            for (e, a), wid in zip(writers, ids):
                entry = tpl[(e % TEMPLATE_ENGINES) * 2 + a][2][at]
                lk = shard_keys[e % shards]
                pipe.hset(lk.load, f"{e}|{wid}", f"{time.time() * 1000:.0f},{entry[2]}")
            pipe.execute()
            next_tick += load
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            behind = max(behind, -wait)
        t0 = time.perf_counter()
        script(keys=key_list, args=args)
        if k >= 2:
            latencies.append(time.perf_counter() - t0)
    queue.put((latencies, behind))


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def run(
    url: str,
    nodes: list[redis.Redis],
    engines: int,
    seconds: float,
    drivers: int,
    shards: int = 1,
    floor_rate: float = 0.0,
    load: float | None = None,
) -> dict[str, Any]:
    namespace = f"fleet{engines}-{int(time.time())}"
    writers = [(e, a) for e in range(engines) for a in range(2)]
    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    start_at = time.time() + 15.0  # the drivers build their templates first
    procs = [
        ctx.Process(
            target=drive, args=(url, namespace, writers[d::drivers], seconds, start_at, queue, shards, load)
        )
        for d in range(drivers)
    ]
    for p in procs:
        p.start()
    # Measure from the third second: the first two carry the catalogue and every chunk's names.
    time.sleep(max(0.0, start_at + 2.0 - time.time()))
    if floor_rate:
        nodes[0].execute_command("FUNCTION", "LOAD", "REPLACE", FLOOR_LIBRARY)
        nodes[0].config_resetstat()
    feed = None
    if load is not None:  # an exporter's /load refresher reads meanwhile, every 0.25 s
        feed_reader = StatsReader(StatsConfig(url=url, namespace=namespace, shards=shards))
        feed = LoadFeed(feed_reader, refresh=0.25)
        feed.answer()
    cpu0 = [cpu_seconds(n) for n in nodes]
    t0 = time.monotonic()
    if floor_rate:  # the floor at the fleet's pace, until the drivers are done
        k = 0
        while queue.empty():
            wait = t0 + k / floor_rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            nodes[0].execute_command("FCALL", "floor45", 1, "floor:{x}", *FLOOR_ARGS)
            k += 1
    results = [queue.get() for _ in procs]
    wall = time.monotonic() - t0
    cpu1 = [cpu_seconds(n) for n in nodes]
    stats = nodes[0].info("commandstats") if floor_rate else {}
    load_engines = 0
    if feed is not None:
        feed.close()
        view = feed_reader.load()
        load_engines = sum(e.up and e.writers == 2 for e in view.engines.values())
        feed_reader.close()
    for p in procs:
        p.join()
    latencies = sorted(x for lat, _ in results for x in lat)
    reader = StatsReader(StatsConfig(url=url, namespace=namespace, shards=shards), vllm_catalog())
    collector = RedisCollector(reader)
    collector.render_text()
    scrape = min(_timed(collector.render_text) for _ in range(3))
    assert len(reader.snapshot().engines) == engines, "the scrape must see every engine"
    reader.close()
    cpu = [(b - a) / wall for a, b in zip(cpu0, cpu1)]
    return {
        "engines": engines,
        "shards": shards,
        "spread": (max(cpu) - min(cpu)) / statistics.mean(cpu) if len(cpu) > 1 else 0.0,
        "calls_per_s": len(latencies) / wall,  # steady-state calls over the measured window
        "cpu": cpu,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        "behind_s": max(b for _, b in results),
        "scrape_ms": scrape * 1e3,
        "flush_us": float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", "nan")),
        "floor_us": float(stats.get("cmdstat_fcall", {}).get("usec_per_call", "nan")),
        "load": "off" if load is None else ("in each flush" if not load else f"and alone every {load} s"),
        "load_engines": load_engines,
    }


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def report(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(
        f"    {'engines':>8}{'writers':>9}{'flushes/s':>11}  {'Redis CPU per node (1.0 = one core)':<38}"
        f"{'spread':>8}{'p50 ms':>8}{'p99 ms':>8}{'scrape ms':>11}{'driver behind s':>17}"
    )
    for r in rows:
        cpu = " ".join(f"{c:.3f}" for c in r["cpu"])
        print(
            f"    {r['engines']:>8}{2 * r['engines']:>9}{r['calls_per_s']:>11.0f}  {cpu:<38}"
            f"{100 * r['spread']:>7.0f}%{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}"
            f"{r['scrape_ms']:>11.0f}{r['behind_s']:>17.2f}"
        )
    calibrated = [r for r in rows if r.get("floor_us") == r.get("floor_us") and r.get("floor_us")]
    if calibrated:
        print("    server µs per call at the fleet's pace (INFO commandstats, the same window):")
        for r in calibrated:
            print(
                f"    {r['engines']:>8} engines: flush {r['flush_us']:.1f}, floor (45 HINCRBY) "
                f"{r['floor_us']:.1f}: {r['flush_us'] / r['floor_us']:.2f}x the floor; one core carries "
                f"~{1e6 / r['flush_us']:,.0f} flushes/s of this profile"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="64,256,1024")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--drivers", type=int, default=2, help="processes sending the writers' calls")
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--only-cluster", action="store_true", help="skip (a)")
    parser.add_argument("--load", action="store_true", help="(a) with the load feed too (docs/load.md)")
    parser.add_argument("--load-interval", type=float, default=0.1)
    parser.add_argument(
        "--floor-rate", type=float, default=50.0, help="floor calls per second during (a) (0: none)"
    )
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "fleet.json"), help="results (JSON)"
    )
    parser.add_argument("--plot", default=str(ROOT / "docs" / "img" / "fleet_redis_cpu.png"))
    opts = parser.parse_args()
    counts = [int(x) for x in opts.engines.split(",")]
    results: dict[str, Any] = {}
    if not opts.only_cluster:
        with EmbeddedRedis() as server:
            node = redis.Redis.from_url(server.url)
            rows = [
                run(server.url, [node], n, opts.seconds, opts.drivers, floor_rate=opts.floor_rate)
                for n in counts
            ]
            if opts.load:
                load_rows = []
                for n, base in zip(counts, rows):
                    for mode in (0.0, opts.load_interval):
                        row = run(server.url, [node], n, opts.seconds, opts.drivers, load=mode)
                        row["x_baseline"] = row["cpu"][0] / base["cpu"][0]
                        load_rows.append(row)
            node.close()
        report("(a) one Redis", rows)
        results["one_redis"] = rows
        if opts.load:
            print(
                "\n(a) one Redis, with the load feed (docs/load.md); an exporter's /load refreshes "
                "every 0.25 s"
            )
            print(
                f"    {'engines':>8}{'writers':>9}  {'load entries':<26}{'Redis CPU':>10}{'x baseline':>12}"
                f"{'p50 ms':>8}{'p99 ms':>8}{'engines in /load':>18}"
            )
            for r in load_rows:
                print(
                    f"    {r['engines']:>8}{2 * r['engines']:>9}  {r['load']:<26}{r['cpu'][0]:>10.3f}"
                    f"{r['x_baseline']:>12.2f}{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}{r['load_engines']:>18}"
                )
            results["one_redis_load"] = load_rows
    if not opts.no_cluster:
        results.update(cluster_rows(counts, opts))
    Path(opts.out).write_text(json.dumps(results, indent=1))
    plot(results, opts.plot)


def plot(results: dict[str, Any], path: str) -> None:
    """Redis CPU (busiest node) against writers."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    labels = {
        "one_redis": "one Redis",
        "cluster_k1": "Cluster, busiest master (K = 1)",
        "cluster_k3": "Cluster, busiest master (K = 3)",
    }
    for name, rows in results.items():
        if name not in labels:
            continue
        ax.plot(
            [2 * r["engines"] for r in rows], [100 * max(r["cpu"]) for r in rows], "o-", label=labels[name]
        )
    ax.axhline(25, color="grey", linestyle=":", label="target: 25 % of a core at 2,048 writers")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("writers (2 API servers per engine), 1 flush/s each, busy-engine profile")
    ax.set_ylabel("Redis CPU, % of one core")
    ax.set_title("Write load on Redis (bench/fleet.py)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def cluster_rows(counts: list[int], opts: Any) -> dict[str, list[dict[str, Any]]]:
    """(b): the 3-master Cluster the tests start, with K = 1 and K = 3."""
    sys.path.insert(0, str(ROOT / "tests"))
    from servers import Cluster

    cluster = Cluster().start()
    out = {}
    try:
        nodes = [redis.Redis(host="127.0.0.1", port=n.port) for n in cluster.nodes]
        for k in (1, 3):
            rows = [run(cluster.url, nodes, n, opts.seconds, opts.drivers, shards=k) for n in counts]
            what = "namespace in one slot (K = 1)" if k == 1 else "K = 3 shards, one per master"
            report(f"(b) 3-master Cluster, {what}", rows)
            out[f"cluster_k{k}"] = rows
        for n in nodes:
            n.close()
    finally:
        cluster.close()
    return out


if __name__ == "__main__":
    main()
