"""Three node processes, all reporters on: exactly one prints, with every engine's true rates;
SIGKILL the printer and another takes over within the lease time, never two at once."""

import re
import subprocess
import threading
import time

import pytest

from tests.conftest import PYTHON, ROOT

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

RATES = {0: (1000.0, 100.0), 1: (2000.0, 200.0), 2: (500.0, 300.0)}
INTERVAL = 3.0
TTL = 3.0
LINE = re.compile(
    r"^(?P<t>[\d.]+) (?P<pid>\d+) Engine (?P<e>\d{3}): Avg prompt throughput: (?P<p>[\d.]+) "
    r"tokens/s, Avg generation throughput: (?P<g>[\d.]+) tokens/s"
)


def test_one_printer_true_rates_and_failover(redis_server, namespace, python_env):
    procs = [
        subprocess.Popen(
            [
                PYTHON,
                "-m",
                "tests.helpers.node_proc",
                redis_server.url,
                namespace,
                str(rank),
                str(p),
                str(g),
                str(INTERVAL),
                str(TTL),
            ],
            cwd=ROOT,
            env=python_env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank, (p, g) in RATES.items()
    ]
    lines: list[tuple[float, int, str]] = []
    lock = threading.Lock()

    def pump(proc):
        for raw in proc.stdout:
            parts = raw.rstrip("\n").split(" ", 2)
            if len(parts) == 3 and parts[1].isdigit():
                with lock:
                    lines.append((float(parts[0]), int(parts[1]), raw.rstrip("\n")))

    threads = [threading.Thread(target=pump, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    try:
        time.sleep(4 * INTERVAL + 1)
        with lock:
            printers = {pid for _, pid, _ in lines}
        assert len(printers) == 1, f"more than one process printed: {printers}"
        victim_pid = printers.pop()
        victim = next(p for p in procs if p.pid == victim_pid)
        killed_at = time.time()
        victim.kill()
        deadline = killed_at + 15
        while time.time() < deadline:
            with lock:
                if any(pid != victim_pid for _, pid, _ in lines):
                    break
            time.sleep(0.1)
        time.sleep(2 * INTERVAL)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    with lock:
        got = sorted(lines)
    before = [x for x in got if x[1] == victim_pid]
    after = [x for x in got if x[1] != victim_pid]
    assert after, "nobody took over after the printer was killed"
    takeover = after[0][0] - killed_at
    print(f"takeover after {takeover:.1f} s (lease ttl {TTL} s, interval {INTERVAL} s)")
    # The lease expires within TTL, a renewal attempt comes within TTL/3, and the new holder prints
    # at once (not at its next tick). With the default ttl of 10 s that is within 14 s.
    assert takeover <= TTL + TTL / 3 + 1
    assert before[-1][0] < after[0][0], "two processes printed at the same time"
    assert len({pid for _, pid, _ in after}) == 1

    # Every printed interval has every live engine at its true rate within 5 %. The killed node's
    # engine stops counting; once stale it is reported DOWN, not with old numbers.
    # The first report of the first printer covers the nodes' start-up (three interpreters starting
    # at once on two cores pace their load late): it is not held to 5 %.
    victim_rank = procs.index(victim)
    warm_up = before[0][0]
    for group, skip in ((before, None), (after, victim_rank)):
        checked = 0
        for when, _, text in group:
            if when < warm_up + 1.0:
                continue
            m = LINE.match(text)
            if not m or int(m["e"]) == skip:
                continue
            engine = int(m["e"])
            want_p, want_g = RATES[engine]
            assert float(m["p"]) == pytest.approx(want_p, rel=0.05), text
            assert float(m["g"]) == pytest.approx(want_g, rel=0.05), text
            checked += 1
        assert checked >= 3
    engines_before = {int(m["e"]) for _, _, t in before if (m := LINE.match(t))}
    assert engines_before == {0, 1, 2}
    assert any("3 Engines Aggregated" in t for _, _, t in before)
    assert any(t.split(" ", 2)[2].startswith(f"Engine {victim_rank:03d}: DOWN") for _, _, t in after)
