"""The newcomer's path (issue 17): clean errors with exit codes, namespaces that find themselves,
a `top` that fits, a demo that shows failover, small things."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from rich.console import Console

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.keys import Keys
from redis_stats.tools.cli import main
from redis_stats.tools.embedded import free_port
from redis_stats.tools.simulate import LoadProfile, SimulatedApiServer
from redis_stats.tools.top import COLUMNS, render, run_top
from tests.conftest import PYTHON, ROOT
from tests.vllm_shapes import iteration, scheduler, snapshot_pair


def invoke(args: list[str], env: dict[str, str] | None = None):
    return CliRunner().invoke(main, args, env={"REDIS_STATS_CONNECT_TIMEOUT_MS": "500", **(env or {})})


def run_cli(args: list[str], python_env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "redis_stats", *args],
        cwd=ROOT,
        env=python_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fill(url: str, namespace: str, engines: list[int], **settings: float) -> None:
    """One flush of vLLM-shaped stats for *engines* in *namespace*, by a writer that stays live
    (not closed: an engine whose writers all closed is down at once), configured by *settings*."""
    config = StatsConfig(url=url, namespace=namespace, **settings)
    writer = StatsWriter(config, vllm_catalog(), engines=engines, start=False)
    recorder = VllmRecorder(writer, "m", engines)
    for e in engines:
        recorder.record(scheduler(running=2, kv=0.1), iteration(prompt=10, generation=5), engine_idx=e)
    writer.flush()


# --- 1. expected failures: one or two lines, a masked URL, what to do, a documented exit code ---

COMMANDS = [["inspect"], ["gc"], ["top", "--once", "--interval", "0.2"], ["namespaces"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_redis_not_running_is_two_lines_naming_the_url_and_what_to_do(cmd):
    url = f"redis://statsuser:s3cret@127.0.0.1:{free_port()}/0"
    result = invoke(cmd, {"REDIS_STATS_URL": url})
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2, result.output
    assert lines[0].startswith("Error: reading redis://statsuser:***@127.0.0.1:")
    assert "connection" in lines[0]
    assert "is Redis running there?" in lines[1]
    assert "s3cret" not in result.output


@pytest.mark.redis_server
@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_a_wrong_password_says_auth_and_what_to_check(cmd, own_redis_server, python_env):
    redis.Redis.from_url(own_redis_server.url).config_set("requirepass", "right")
    url = f"redis://:wrong-pw@127.0.0.1:{own_redis_server.port}/0"
    out = run_cli(cmd, {**python_env, "REDIS_STATS_URL": url})
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, out.stderr
    masked = f"redis://:***@127.0.0.1:{own_redis_server.port}/0"
    assert lines[0].startswith(f"Error: reading {masked} failed (auth:")
    assert "check the user and password" in lines[1]
    assert "wrong-pw" not in out.stderr + out.stdout and "Traceback" not in out.stderr


@pytest.mark.parametrize("cmd", [*COMMANDS, ["exporter", "--port", "0"]], ids=lambda c: c[0])
def test_an_http_url_is_a_usage_error_without_traceback(cmd):
    result = invoke(cmd, {"REDIS_STATS_URL": "http://user:pw-xyz@127.0.0.1:1/0"})
    assert result.exit_code == 2, result.output
    error = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(error) == 1 and "scheme 'http' is not supported" in error[0]
    assert "pw-xyz" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_exporter_on_a_taken_port_is_two_lines_naming_port_0(python_env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**python_env, "REDIS_STATS_URL": "redis://127.0.0.1:1/0"}
        out = run_cli(["exporter", "--port", str(port)], env)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0] == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "--port 0" in lines[1]


@pytest.mark.redis_server
def test_top_shows_redis_unavailable_and_keeps_trying_across_a_restart(own_redis_server, namespace):
    fill(own_redis_server.url, namespace, [0])
    config = StatsConfig(url=own_redis_server.url, namespace=namespace, socket_timeout_ms=300)
    out = io.StringIO()
    console = Console(file=out, width=200)  # not a terminal: plain tables, one per interval
    failed: list[BaseException] = []

    def top() -> None:
        try:
            run_top(StatsReader(config, vllm_catalog()), interval=0.3, console=console)
        except BaseException as exc:  # the old top ended here, with a traceback
            failed.append(exc)

    thread = threading.Thread(target=top, daemon=True)
    thread.start()
    time.sleep(1.0)
    own_redis_server.stop(keep_data=True)
    time.sleep(1.2)
    own_redis_server.start()
    fill(own_redis_server.url, namespace, [0])
    deadline = time.monotonic() + 10
    while "Redis is back" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    text = out.getvalue()
    assert not failed, failed
    assert thread.is_alive()
    assert f"Redis unavailable at {config.safe_url} (connection:" in text
    after = text[text.index("Redis is back") :]
    assert re.search(r"^engine\s+up", after, re.M), text[-2000:]  # a table again after the restart


# --- 2. namespaces that find themselves ---


@pytest.mark.redis_server
def test_namespaces_lists_each_with_engines_writers_and_heartbeat(redis_server, namespace):
    fill(redis_server.url, namespace + "-a", [0, 1])
    fill(redis_server.url, namespace + "-b", [3])
    result = invoke(["namespaces", "--redis-url", redis_server.url])
    assert result.exit_code == 0, result.output
    lines = {ln.split(":")[0]: ln for ln in result.output.splitlines()}
    assert re.fullmatch(
        rf"{namespace}-a: 2 engines \(2 up\), 1 writer \(1 live\), last heartbeat \d+\.\d s ago",
        lines[namespace + "-a"],
    ), result.output
    assert lines[namespace + "-b"].startswith(f"{namespace}-b: 1 engine (1 up), 1 writer")


@pytest.mark.redis_server
def test_namespaces_ignores_keys_that_only_look_like_a_namespace(own_redis_server):
    raw = redis.Redis.from_url(own_redis_server.url)
    fill(own_redis_server.url, "real", [0])
    for key in (b"rs:{}:meta", b"rs:{open:meta", b"rs:{x}:e:0:c", b"rs:{y}:metadata", b"rs:{\xff\xfe}:meta"):
        raw.set(key, "garbage")
    raw.set(Keys("wrongtype").writers, "not a sorted set")
    result = invoke(["namespaces", "--redis-url", own_redis_server.url])
    assert result.exit_code == 0, result.output
    names = [ln.split(":")[0] for ln in result.output.splitlines()]
    assert "real" in names and not {"", "x", "y", "open"} & set(names)
    assert "wrongtype: unreadable (WRONGTYPE" in result.output  # and the others still listed


@pytest.mark.redis_server
@pytest.mark.parametrize(
    "cmd",
    # inspect --json too (before: exit 0 and a document with no engine, for a misspelt namespace
    # as for an empty one, while docs/cli.md promised exit 3).
    [["inspect"], ["inspect", "--json"], ["gc", "--dry-run"], ["top", "--once", "--interval", "0.2"]],
)
def test_an_empty_namespace_is_answered_with_the_ones_that_exist(cmd, own_redis_server, namespace):
    fill(own_redis_server.url, "demo", [0, 1])
    result = invoke([*cmd, "--redis-url", own_redis_server.url])  # namespace "default": empty
    assert result.exit_code == 3, result.output
    assert f"namespace 'default' holds nothing at {own_redis_server.url}" in result.output
    assert "  demo: 2 engines (2 up)" in result.output
    assert "pass --namespace demo" in result.output
    # The namespace that holds data works as before.
    assert invoke([*cmd, "--redis-url", own_redis_server.url, "--namespace", "demo"]).exit_code == 0


@pytest.mark.redis_server
def test_an_empty_redis_says_nothing_has_written_there(own_redis_server):
    result = invoke(["inspect", "--redis-url", own_redis_server.url])
    assert result.exit_code == 3
    assert "no namespace does: nothing has written there yet" in result.output
    result = invoke(["namespaces", "--redis-url", own_redis_server.url])
    assert result.exit_code == 0 and "no redis_stats namespace" in result.output


@pytest.mark.redis_server
def test_a_least_privilege_reader_runs_top_and_hears_why_it_cannot_list_others(own_redis_server, namespace):
    from tests.acl import READER, rules

    admin = redis.Redis.from_url(own_redis_server.url)
    admin.execute_command("ACL", "SETUSER", "reader", *rules(namespace, "rpw", READER, read_only=True))
    url = f"redis://reader:rpw@127.0.0.1:{own_redis_server.port}/0"
    result = invoke(["top", "--once", "--interval", "0.2", "--redis-url", url, "--namespace", namespace])
    assert result.exit_code == 3, result.output  # empty, and no SCAN for this user: says so
    assert "this Redis user may not list the others (noperm)" in result.output
    fill(own_redis_server.url, namespace, [0])
    result = invoke(["top", "--once", "--interval", "0.2", "--redis-url", url, "--namespace", namespace])
    assert result.exit_code == 0, result.output
    assert "namespace" in result.output and "rpw" not in result.output


def test_namespaces_are_found_on_every_cluster_master(namespace):
    from tests.servers import Cluster

    cluster = Cluster().start()
    try:
        names = [f"{namespace}-{i}" for i in range(12)]
        for ns in names:
            fill(cluster.url, ns, [0])
        from redis_stats.connection import make_client

        client = make_client(StatsConfig(url=cluster.url))
        assert len({client.get_node_from_key(f"rs:{{{ns}}}:meta").port for ns in names}) > 1
        result = invoke(["namespaces", "--redis-url", cluster.url])
    finally:
        cluster.close()
    assert result.exit_code == 0, result.output
    assert {ln.split(":")[0] for ln in result.output.splitlines()} >= set(names)


# --- 3. top that fits ---


@pytest.fixture
def two_snapshots(config, fake_client):
    sched = scheduler(running=123, waiting=45, kv=0.5)
    it = iteration(prompt=2_234_567, generation=1_234_567, ttft=[0.05] * 10, itl=[0.02] * 100)
    with snapshot_pair(config, fake_client, sched, it) as pair:
        yield pair


def rendered(table, width: int) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_top_at_80_columns_drops_whole_columns_and_never_cuts_a_number(two_snapshots):
    before, after = two_snapshots
    text = rendered(render(before, after, width=80), 80)
    assert "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    rows = [ln for ln in text.splitlines() if ln.startswith("│ 0") or ln.startswith("│ 1")]
    assert len(rows) == 2, text  # one line per engine: no wrapped rows
    seconds = after.time - before.time
    assert f"{1_234_567 / seconds:.1f}" in rows[0]
    assert "gen tok/s" in text and "age s" not in text and "TTFT p50" not in text


def test_top_at_200_columns_shows_every_column(two_snapshots):
    before, after = two_snapshots
    text = rendered(render(before, after, width=200), 200)
    assert all(column in text for column in COLUMNS)
    assert "…" not in text


def test_top_once_piped_is_plain_text_with_every_column_and_a_title(redis_server, namespace, python_env):
    fill(redis_server.url, namespace, [0])
    env = {**python_env, "REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    # A pipe fits COLUMNS too (80 when unset: tests/tools/test_printed_commands.py); 200 holds all.
    env["COLUMNS"] = "200"
    out = run_cli(["top", "--once", "--interval", "0.2"], env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"redis_stats — namespace {namespace!r} at {redis_server.url} — ")
    assert re.search(r" — \d\d:\d\d:\d\d — 1 engine$", lines[0])
    assert lines[1].split() == [w for c in COLUMNS for w in c.split()]
    assert "│" not in out.stdout and "…" not in out.stdout
    assert re.match(r"0\s+up\s+\d", lines[2])


# --- 4. the demo ---


def test_the_simulator_observes_one_inter_token_latency_per_generated_token():
    class Counting:
        tokens = itls = first = 0

        def record(self, sched, it, engine_idx=0):
            self.tokens += it.num_generation_tokens
            self.itls += len(it.inter_token_latencies_iter)
            self.first += len(it.time_to_first_tokens_iter)

    rec = Counting()
    sim = SimulatedApiServer(rec, 0, LoadProfile(), seed=3)  # type: ignore[arg-type]
    now = 0.0
    for _ in range(1000):
        now += 0.055
        sim.step(now)
    # Every generated token after a request's first has one ITL (vLLM observes them per token).
    assert rec.tokens > 5000
    assert rec.tokens - rec.first <= rec.itls <= rec.tokens
    # And the tokens come at the profile's rate: ~1/itl_s per running request.


def test_the_demos_load_is_one_or_two_hot_engines_whose_bounded_queues_drain():
    """The demo's 10 nodes x 2 API servers over three simulated minutes: only the hot engines
    queue, never past their bound, and each drains again; TTFT stays bounded. (Its load grew
    engines 5-9 from 997 to 3,457 waiting over three minutes, TTFT p99 159 s.)"""
    from redis_stats.tools.demo import node_profile
    from redis_stats.tools.simulate import FleetLoad

    class Recorder:
        def __init__(self) -> None:
            self.ttfts: list[float] = []

        def record(self, sched, it, engine_idx=0):
            self.ttfts += it.time_to_first_tokens_iter

        def record_admission_rejection(self, reason):
            pass

    load = FleetLoad(10)
    rec = Recorder()
    sims = [
        SimulatedApiServer(rec, node, node_profile(node, 2, 10), seed=node * 100 + api,  # type: ignore[arg-type]
                           kv_capacity_tokens=load.kv_capacity_tokens // 2)
        for node in range(10) for api in range(2)
    ]  # fmt: skip
    for sim in sims:
        sim._wall = -sim._last  # the same phase in every run: wall-clock time 0 is now
    waiting: dict[int, list[int]] = {node: [] for node in range(10)}
    t = sims[0]._last
    for _ in range(int(180 / 0.1)):
        t += 0.1
        for sim in sims:
            sim.step(t)
        for node in range(10):
            waiting[node].append(sum(s.waiting for s in sims if s.engine == node))
    # A queue: more waiting than the share's batch holds (a steady engine has brief blips only).
    queued = {node for node, w in waiting.items() if max(w) > 8}
    assert queued and queued <= set(load.hot()) and len(load.hot()) <= 2, (queued, load.hot())
    for node in queued:
        w = waiting[node]
        top = w.index(max(w))
        assert max(w) <= 2 * node_profile(node, 2, 10).max_waiting
        assert min(w[top:]) <= 1, (node, max(w), w[-20:])  # it drains after its peak
    assert max(max(w) for w in waiting.values()) >= 16  # the hot engines' queues show
    ttfts = sorted(rec.ttfts)
    assert ttfts[int(0.99 * len(ttfts))] < 30, ttfts[int(0.99 * len(ttfts))]


def test_the_demo_checks_its_port_before_starting_anything(python_env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        out = run_cli(["demo", "--port", str(port), "--duration", "5"], python_env)
    assert out.returncode == 1
    assert "started a private" not in out.stdout and "simulating" not in out.stdout
    assert time.monotonic() - start < 10
    # What happened and what to do, in one line; no "demo stopped ..." for a demo that started nothing.
    (line,) = out.stderr.strip().splitlines()
    assert f"port {port} on 127.0.0.1 is in use by another program, so the demo started nothing" in line
    assert 'DEMO_ARGS="--port 0"' in line and "--port 0" in line
    assert out.stdout == ""


@pytest.mark.redis_server
@pytest.mark.slow
def test_demo_lease_failover_down_line_and_restart(python_env):
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "demo", "--port", "0", "--nodes", "2", "--api-servers", "1",
         "--log-interval", "1", "--leader", "lease", "--restart-after", "13", "--duration", "40"],
        cwd=ROOT, env=python_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    stamps: list[float] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            stamps.append(time.monotonic())

    threading.Thread(target=read, daemon=True).start()

    def wait_for(pattern: str, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for i in range(seen, len(lines)):
                if re.search(pattern, lines[i]):
                    return i
            seen = len(lines)
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in:\n" + "\n".join(lines[-30:]))

    try:
        ready = wait_for(r"^periodic log lines", 30)
        assert any("export REDIS_STATS_URL='redis://127.0.0.1:" in ln for ln in lines[:ready])
        assert any(ln.strip().endswith("redis-stats top") for ln in lines[:ready])
        first = wait_for(r"Engine 000: Avg", 10)
        # The first line after about one interval (it was two: the first read had no baseline).
        assert stamps[first] - stamps[ready] < 2.5, stamps[first] - stamps[ready]
        holder = re.search(r"\[node(\d)/api0 pid=(\d+)\]", lines[first])
        node, pid = int(holder.group(1)), int(holder.group(2))
        os.kill(pid, signal.SIGKILL)  # the lease holder dies
        wait_for(
            rf"node {node} API server 0 \(pid {pid}\) exited with code -9; the others go on; "
            rf"engine {node} shows DOWN in 10 s, when the heartbeat of an API server killed without "
            r"its last flush \(kill -9\) is stale_after old; restarting it in 13 s",
            5,
        )
        takeover = wait_for(rf"\[node{1 - node}/api0 pid=\d+\] Engine 00{node}: DOWN, last heartbeat", 30)
        assert takeover > first
        wait_for(rf"restarted node {node} API server 0 \(pid \d+\)", 20)
        wait_for(rf"Engine 00{node}: Avg", 15)  # back up
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 0, "\n".join(lines[-20:])
    assert "every process it started has exited" in lines[-1]


@pytest.mark.redis_server
@pytest.mark.slow
def test_demo_says_a_cleanly_stopped_node_shows_down_at_once_and_it_does(python_env):
    """`kill <pid>` (SIGTERM) closes the node's writer: its engine is DOWN at once, not after
    stale_after (10 s), and the demo says so (it said "shows DOWN after 10 s")."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "demo", "--port", "0", "--nodes", "2", "--api-servers", "1",
         "--restart-after", "0", "--duration", "40"],
        cwd=ROOT, env=python_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(ln.rstrip("\n") for ln in proc.stdout), daemon=True).start()

    def wait_for(pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(lines):
                if m := re.search(pattern, line):
                    return m
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in:\n" + "\n".join(lines[-30:]))

    try:
        view = wait_for(r"Redis view of every engine: (http://\S+)/metrics", 30).group(1)
        pid = int(wait_for(r"node 1: kill (\d+) to stop it", 5).group(1))

        def up(engine: str) -> bool:
            doc = json.loads(urllib.request.urlopen(view + "/snapshot", timeout=10).read())
            return bool(doc["engines"].get(engine, {}).get("up"))

        deadline = time.monotonic() + 20
        while not up("1") and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        stopped = time.monotonic()
        wait_for(
            rf"node 1 API server 0 \(pid {pid}\) exited with code 0; the others go on; its writer "
            r"closed, so engine 1 shows DOWN now; not restarting it",
            10,
        )
        while up("1") and time.monotonic() - stopped < 10:
            time.sleep(0.1)
        assert not up("1") and time.monotonic() - stopped < 5  # long before stale_after (10 s)
        assert up("0")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 0, "\n".join(lines[-20:])


# --- 8. small things ---


def test_every_option_has_help_and_shows_its_default():
    for name, command in main.commands.items():
        for param in command.params:
            if not isinstance(param, type(command.params[0])) or param.name == "help":
                continue
            assert param.help, f"{name} {param.opts} has no help text"
            if not param.is_flag and param.required is False:
                shown = param.show_default not in (None, False) or param.default is not None
                assert shown, (name, param.opts)
    text = " ".join(invoke(["exporter", "--help"]).output.split())
    assert "(0: any free port). [default: 9400" in text
    assert "[default: 2.0" in invoke(["top", "--help"]).output
    assert "[default: (redis://127.0.0.1:6379/0)]" in text and "[default: (default)]" in text


@pytest.mark.redis_server
def test_gc_says_1_engine_not_1_engines(own_redis_server, namespace):
    # The writer's own stale_after as short as gc's: gc removes it only once silent for twice that.
    fill(own_redis_server.url, namespace, [0], stale_after=0.1, flush_interval=0.1, retention=0.2)
    time.sleep(0.3)
    url = own_redis_server.url
    fast = {"REDIS_STATS_STALE_AFTER": "0.1", "REDIS_STATS_FLUSH_INTERVAL": "0.1"}
    result = invoke(["gc", "--redis-url", url, "--namespace", namespace, "--retention", "0.2"], fast)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("removed 1 engine [0] and 1 writer (retention 0.2 s)")


def test_the_options_table_prints_without_a_runtime_warning(python_env):
    out = subprocess.run(
        [PYTHON, "-W", "error::RuntimeWarning", "-m", "redis_stats.tools.config_table"],
        cwd=ROOT, env=python_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "RuntimeWarning" not in out.stderr and "| `url` |" in out.stdout


def test_dockerignore_leaves_out_virtualenvs_and_build_output():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for pattern in (".venv*", "*.egg-info", "build", "dist"):
        assert pattern in ignored, pattern


@pytest.mark.redis_server
def test_the_demo_writes_the_engines_from_first_engine(python_env):
    # compose runs one node per host with --nodes 1 --first-engine R; node R writes engine R.
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "demo", "--port", "0", "--nodes", "1", "--api-servers", "1",
         "--first-engine", "3", "--duration", "4"],
        cwd=ROOT, env=python_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = None
    for line in proc.stdout:
        if line.startswith("simulating"):
            assert line.startswith("simulating 1 node x 1 API server (1 process, engines 3..3)"), line
        if m := re.search(r"Redis view of every engine: (http://\S+)/metrics", line):
            url = m.group(1)
            break
    assert url
    time.sleep(2)
    import json
    import urllib.request

    engines = set(json.loads(urllib.request.urlopen(url + "/snapshot", timeout=10).read())["engines"])
    proc.communicate(timeout=60)
    assert engines == {"3"} and proc.returncode == 0


def test_the_demo_prints_the_pids_of_each_node_to_kill(python_env):
    # README: "Kill the processes of one node (their pids are ...)": the log lines show only the
    # printer's pid (node 0, API server 0), so the demo lists every node's pids at start.
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "demo", "--port", "0", "--nodes", "2", "--api-servers", "2",
         "--duration", "4"],
        cwd=ROOT, env=python_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    listed: dict[int, list[int]] = {}
    for line in proc.stdout:
        if m := re.fullmatch(r"  node (\d+): kill (\d+) (\d+) to stop it\n", line):
            listed[int(m.group(1))] = [int(m.group(2)), int(m.group(3))]
        if "Redis view of every engine" in line:
            break
    try:
        assert sorted(listed) == [0, 1], listed
        for node, pids in listed.items():
            for api, pid in enumerate(pids):
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                assert b"redis_stats.tools.demo" in args and args[
                    args.index(b"redis_stats.tools.demo") + 2 :
                ][:2] == [str(node).encode(), str(api).encode()], args
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_shell_completion_as_documented(python_env):
    # docs/cli.md: eval "$(_REDIS_STATS_COMPLETE=bash_source redis-stats)"
    entry = "from redis_stats.tools.cli import main; main(prog_name='redis-stats')"
    source = subprocess.run(
        [PYTHON, "-c", entry], env={**python_env, "_REDIS_STATS_COMPLETE": "bash_source"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "complete -o nosort -F _redis_stats_completion redis-stats" in source.stdout
    env = {**python_env, "_REDIS_STATS_COMPLETE": "bash_complete"}
    env |= {"COMP_WORDS": "redis-stats na", "COMP_CWORD": "1"}
    words = subprocess.run([PYTHON, "-c", entry], env=env, capture_output=True, text=True, timeout=60)
    assert words.stdout.strip() == "plain,namespaces"
    assert "_REDIS_STATS_COMPLETE=bash_source redis-stats" in (ROOT / "docs" / "cli.md").read_text()
