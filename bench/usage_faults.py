"""The usage ledger under faults, beside a naive ``INCRBY``-and-retry counter in the same run
(docs/usage.md, "Exact under faults"; issue 49 item 4).

*W* writer processes (default 16) serve *R* requests (default 1,000,000) of *T* tenants (default
100,000) between them, through a TCP proxy that holds a share of Redis' replies past the clients'
timeout (the server applied the command, the client gave up: the retry is where a counter
doubles); meanwhile writers are killed with SIGKILL and started again (a new process, a new
writer), and Redis is killed and started again from its append-only file (``appendfsync
always``). Each writer records every request twice:

- **exact**: :class:`~redis_stats.usage.UsageRecorder` (a batch per flush, under a sequence,
  applied once by ``usage.lua``); each batch is journaled as it is taken, before it is sent, and
  each confirmation as it comes;
- **naive**: the same requests' tokens added by the process to a buffer, sent every flush interval
  as one pipeline of ``HINCRBY`` (LiteLLM's spend buffer), resent whole on an error; journaled
  when Redis acknowledged it.

The checker, after the run: per tenant, the exact ledger (``u:t``) against what the writers
acknowledged, plus each killed writer's last batch, which the ledger's own sequence entry shows
applied or not (a kill leaves one batch in flight: applied once or not at all); phantom (more than
that) and lost (less) must be 0. The naive hash against what it acknowledged: its drift.

Then the prefill/decode case: two writers stand for the two legs of every request (both see the
full prompt, the prefill leg one generated token), recording by the leg rule agreed with the vLLM
middleware (the decode leg carries the request; the prefill leg adds only its own cache hits):
counted once, beside a naive pair that counts both legs.

Usage: python bench/usage_faults.py [--writers 16] [--requests 1000000] [--tenants 100000]
                                    [--seconds 90] [--kills 12] [--restarts 3] [--late 0.02]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from redis_stats import StatsConfig, StatsWriter  # noqa: E402
from redis_stats.keys import Keys  # noqa: E402
from redis_stats.tools.embedded import EmbeddedRedis  # noqa: E402
from redis_stats.usage import Usage, UsageRecorder  # noqa: E402
from redis_stats.usage.layout import UsageKeys, decode_values  # noqa: E402
from redis_stats.usage.recorder import Batch  # noqa: E402
from tests.proxy import CuttingProxy  # noqa: E402

NAMESPACE = "usage-faults"
NAIVE = "naive:prompt"  # hash: tenant -> prompt tokens, by HINCRBY
TIMEOUT_MS = 250
FLUSH = 0.05


def _config(url: str) -> StatsConfig:
    return StatsConfig(
        url=url, namespace=NAMESPACE, flush_interval=FLUSH, socket_timeout_ms=TIMEOUT_MS, close_timeout=900.0
    )


# -- a writer process --------------------------------------------------------------------------
class Journal:
    """A process's journal: one line per event, in the kernel before the next step (a SIGKILL
    keeps what was written); written from the flusher, the naive thread and the main one."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a")
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class Journaled(UsageRecorder):
    """A recorder that journals each batch as it is taken (before it is sent)."""

    journal: Any

    def _batch(self, shard: Any, entries: Any) -> Batch:
        batch = super()._batch(shard, entries)
        sums: dict[str, list[int]] = {}
        for (_hour, tenant, _a, _m), v in entries.items():
            s = sums.setdefault(tenant, [0, 0, 0])
            s[0] += v[0]
            s[1] += v[1]
            s[2] += v[3]
        self.journal.write(f"B {self.writer_id} {batch.seq} {json.dumps(sums)}\n")  # before it is sent
        return batch


def _naive_loop(
    url: str, buffer: dict[str, int], lock: threading.Lock, journal: Any, stop: threading.Event
) -> None:
    """Every flush interval, the buffer's tokens as one pipeline of HINCRBY; resent whole on an
    error (the client cannot tell a lost request from a lost reply)."""
    client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_MS / 1000, socket_connect_timeout=1)
    while True:
        done = stop.wait(FLUSH)
        with lock:
            deltas = dict(buffer)
            buffer.clear()
        for _attempt in range(1000):
            if not deltas:
                break
            try:
                pipe = client.pipeline(transaction=False)
                for tenant, n in deltas.items():
                    pipe.hincrby(NAIVE, tenant, n)
                pipe.execute()
                journal.write(f"N {json.dumps(deltas)}\n")
                break
            except redis.RedisError:
                time.sleep(0.02)
        if done:
            return


def worker(
    slot: int, incarnation: int, url: str, tenants: int, quota: int, pace: float, journal_path: str
) -> None:
    journal = Journal(journal_path)
    writer = StatsWriter(_config(url), role=f"w{slot}", start=False)

    def confirmed(batch: Batch, applied: bool) -> None:
        journal.write(f"C {writer.writer_id} {batch.seq}\n")

    rec = Journaled(writer, on_confirmed=confirmed)
    rec.journal = journal
    journal.write(f"W {writer.writer_id}\n")
    writer.start()
    buffer: dict[str, int] = defaultdict(int)
    lock = threading.Lock()
    stop = threading.Event()
    naive = threading.Thread(target=_naive_loop, args=(url, buffer, lock, journal, stop), daemon=True)
    naive.start()
    rng = random.Random(slot * 1000 + incarnation)
    started = time.monotonic()
    for i in range(quota):
        tenant = f"t{rng.randrange(tenants):06d}"
        prompt, gen = rng.randrange(1, 4000), rng.randrange(1, 600)
        rec.record(Usage(tenant=tenant, adapter=None, model="m", prompt_tokens=prompt, generation_tokens=gen))
        with lock:
            buffer[tenant] += prompt
        if i % 25 == 24:
            journal.write(f"I {i + 1}\n")
            # Paced: the requests spread over the run, so kills and restarts land among them.
            ahead = started + (i + 1) * pace - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    journal.write(f"I {quota}\n")
    stop.set()
    naive.join()
    writer.close()
    journal.write("E\n")
    journal.close()


# -- the driver --------------------------------------------------------------------------------
class Slot:
    def __init__(self, index: int, quota: int, directory: Path) -> None:
        self.index, self.quota, self.done = index, quota, 0
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.directory = directory
        self.kills = 0

    def journal(self, incarnation: int) -> Path:
        return self.directory / f"w{self.index}.{incarnation}.log"

    def start(self, url: str, tenants: int, pace: float) -> None:
        self.incarnation += 1
        left = self.quota - self.done
        args = [sys.executable, __file__, "--worker", str(self.index), str(self.incarnation), url]
        args += [str(tenants), str(left), str(pace), str(self.journal(self.incarnation))]
        self.proc = subprocess.Popen(args, cwd=ROOT)

    def issued(self, incarnation: int) -> int:
        n = 0
        path = self.journal(incarnation)
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith("I "):
                    n = int(line[2:])
        return n

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1
        self.done += self.issued(self.incarnation)


def check(client: redis.Redis, journals: list[Path]) -> dict[str, Any]:
    """Per tenant: the ledger against what was acknowledged (and resolved), the naive hash
    against what it acknowledged."""
    uk = UsageKeys(Keys(NAMESPACE))
    applied = {k.decode(): int(v) for k, v in client.hgetall(uk.base + "seq").items() if k}
    batches: dict[tuple[str, int], dict[str, list[int]]] = {}
    acked: set[tuple[str, int]] = set()
    naive_acked: dict[str, int] = defaultdict(int)
    issued = 0
    for path in journals:
        last_issued = 0
        for line in path.read_text().splitlines():
            kind, _, rest = line.partition(" ")
            try:
                json.loads(rest.split(" ", 2)[-1] if kind == "B" else rest) if kind in ("B", "N") else None
            except ValueError:
                continue  # the line a SIGKILL cut short: written before its batch was sent
            if kind == "B":
                wid, seq, sums = rest.split(" ", 2)
                batches[(wid, int(seq))] = json.loads(sums)
            elif kind == "C":
                wid, seq = rest.split(" ")
                acked.add((wid, int(seq)))
            elif kind == "N":
                for tenant, n in json.loads(rest).items():
                    naive_acked[tenant] += n
            elif kind == "I":
                last_issued = int(rest)
        issued += last_issued
    expect_acked: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    expect_resolved: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    in_flight_applied = in_flight_not = acked_not_applied = 0
    for (wid, seq), sums in batches.items():
        was_applied = seq <= applied.get(wid, 0)
        if (wid, seq) in acked:
            acked_not_applied += not was_applied
            targets = [expect_acked, expect_resolved]
        elif was_applied:
            in_flight_applied += 1
            targets = [expect_resolved]
        else:
            in_flight_not += 1
            targets = []
        for tenant, s in sums.items():
            for target in targets:
                t = target[tenant]
                for i in range(3):
                    t[i] += s[i]
    ledger: dict[str, list[int]] = {}
    for tenant, text in client.hgetall(uk.tenants).items():
        v = decode_values(text.decode())
        assert v is not None
        ledger[tenant.decode()] = [v[0], v[1], v[3]]
    tenants = set(ledger) | set(expect_resolved)
    phantom = sum(1 for t in tenants if ledger.get(t, [0, 0, 0]) > expect_resolved.get(t, [0, 0, 0]))
    lost = sum(1 for t in tenants if ledger.get(t, [0, 0, 0]) < expect_resolved.get(t, [0, 0, 0]))
    off = [t for t in tenants if ledger.get(t) != expect_resolved.get(t)]
    naive = {k.decode(): int(v) for k, v in client.hgetall(NAIVE).items()}
    naive_off = [t for t in set(naive) | set(naive_acked) if naive.get(t, 0) != naive_acked.get(t, 0)]
    naive_total, naive_truth = sum(naive.values()), sum(naive_acked.values())
    ledger_prompt = sum(v[1] for v in ledger.values())
    return {
        "requests_issued": issued,
        "requests_acknowledged": sum(v[0] for v in expect_acked.values()),
        "requests_in_ledger": sum(v[0] for v in ledger.values()),
        "batches": len(batches),
        "batches_acknowledged": len(acked),
        "killed_in_flight_applied": in_flight_applied,
        "killed_in_flight_not_applied": in_flight_not,
        "acknowledged_not_in_ledger": acked_not_applied,
        "tenants": len(tenants),
        "exact_tenants_off": len(off),
        "exact_phantom_tenants": phantom,
        "exact_lost_tenants": lost,
        "exact_prompt_ledger_over_acknowledged": ledger_prompt
        / max(1, sum(v[1] for v in expect_acked.values())),
        "naive_tenants_off": len(naive_off),
        "naive_prompt_over_acknowledged": naive_total / max(1, naive_truth),
        "naive_prompt_extra": naive_total - naive_truth,
        "naive_tenants_over": sum(1 for t in naive_off if naive.get(t, 0) > naive_acked.get(t, 0)),
    }


def legs(url: str, requests: int, seed: int) -> dict[str, Any]:
    """Prefill/decode: two writers see every request; the leg rule counts it once."""
    cfg = StatsConfig(url=url, namespace=NAMESPACE + "-pd")
    prefill, decode = (StatsWriter(cfg, role=r, start=False) for r in ("prefill", "decode"))
    recs = [UsageRecorder(prefill), UsageRecorder(decode)]
    naive = redis.Redis.from_url(url)
    rng = random.Random(seed)
    truth = [0, 0, 0, 0]
    for i in range(requests):
        tenant = f"pd{rng.randrange(100)}"
        prompt, hit, gen = rng.randrange(10, 4000), rng.randrange(0, 10), rng.randrange(2, 500)
        # Both legs carry the full prompt; the prefill leg generates one token.
        recs[0].record(
            Usage(
                tenant=tenant,
                adapter=None,
                model="m",
                requests=0,
                prompt_tokens=0,
                cached_prompt_tokens=hit,
                generation_tokens=0,
            )
        )
        recs[1].record(
            Usage(tenant=tenant, adapter=None, model="m", prompt_tokens=prompt, generation_tokens=gen)
        )
        naive.hincrby("naive:pd:requests", tenant, 2)  # each leg a request
        naive.hincrby("naive:pd:prompt", tenant, 2 * prompt)
        truth = [truth[0] + 1, truth[1] + prompt, truth[2] + hit, truth[3] + gen]
        if i % 500 == 0:
            prefill.flush()
            decode.flush()
    for w in (prefill, decode):
        while w.pending():
            w.flush()
        w.close()
    from redis_stats.usage import UsageReader

    total = UsageReader(cfg).query().total
    got = [total.get(f) for f in ("requests", "prompt_tokens", "cached_prompt_tokens", "generation_tokens")]
    naive_req = sum(int(v) for v in naive.hgetall("naive:pd:requests").values())
    return {
        "pd_requests": requests,
        "pd_ledger": got,
        "pd_truth": truth,
        "pd_exact": got == truth,
        "pd_naive_requests": naive_req,
    }


def run(
    writers: int, requests: int, tenants: int, seconds: float, kills: int, restarts: int, late: float
) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="usage-faults-"))
    server = EmbeddedRedis(extra_args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    proxy = CuttingProxy(server.port, seed=49)
    proxy.late_probability, proxy.late_delay = late, 2 * TIMEOUT_MS / 1000
    pace = seconds / (requests / writers)
    slots = [Slot(i, requests // writers + (i < requests % writers), directory) for i in range(writers)]
    started = time.monotonic()
    rng = random.Random(4949)
    events = sorted(
        [("kill", rng.uniform(0.1, 0.8) * seconds) for _ in range(kills)]
        + [("restart", (i + 1) * seconds / (restarts + 1)) for i in range(restarts)],
        key=lambda e: e[1],
    )
    try:
        for slot in slots:
            slot.start(proxy.url, tenants, pace)
        for kind, at in events:
            time.sleep(max(0.0, started + at - time.monotonic()))
            if kind == "kill":
                alive = [s for s in slots if s.proc is not None and s.proc.poll() is None]
                if alive:
                    victim = rng.choice(alive)
                    victim.kill()
                    victim.start(proxy.url, tenants, pace)
            else:
                server.kill()  # SIGKILL: what it acknowledged is in its AOF (appendfsync always)
                time.sleep(0.5)
                server.start(timeout=180.0)  # AOF replay on a loaded machine
        for slot in slots:
            assert slot.proc is not None
            slot.proc.wait(timeout=seconds * 4 + 900)  # a close drains its backlog (close_timeout)
            assert slot.proc.returncode == 0, f"writer {slot.index} exited {slot.proc.returncode}"
        elapsed = time.monotonic() - started
        proxy.late_probability = 0.0
        client = redis.Redis.from_url(server.url)
        journals = sorted(directory.glob("w*.log"))
        result = check(client, journals)
        result |= {
            "writers": writers,
            "seconds": round(elapsed, 1),
            "writer_kills": sum(s.kills for s in slots),
            "redis_restarts": restarts,
            "replies_held_past_timeout": proxy.lates,
            "late_probability": late,
        }
        proxy.late_probability = late
        result |= legs(proxy.url, max(2000, requests // 100), 7)
        return result
    finally:
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()
        proxy.close()
        server.close()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        worker(int(a[0]), int(a[1]), a[2], int(a[3]), int(a[4]), float(a[5]), a[6])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--tenants", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--late", type=float, default=0.02, help="share of replies held past the timeout")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "usage_faults.json")
    args = ap.parse_args()
    result = run(
        args.writers, args.requests, args.tenants, args.seconds, args.kills, args.restarts, args.late
    )
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
