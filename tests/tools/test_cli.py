"""The redis-stats command: help and version, the demo end to end, top, the exporter's JSON."""

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from redis_stats import StatsReader, StatsWriter, __version__
from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog
from redis_stats.server import Exporter
from redis_stats.tools.cli import main
from redis_stats.tools.top import COLUMNS, render
from tests.conftest import PYTHON, ROOT
from tests.vllm_shapes import finished, iteration, scheduler


@pytest.mark.parametrize("command", [[], ["demo"], ["simulate"], ["exporter"], ["top"], ["inspect"], ["gc"]])
def test_every_command_has_help(command):
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_bad_engines_option_is_a_clear_error():
    result = CliRunner().invoke(
        main, ["exporter", "--redis-url", "redis://127.0.0.1:1/0", "--engines", "0,x"]
    )
    assert result.exit_code != 0
    assert "comma-separated list of engine indexes" in result.output


@pytest.mark.parametrize("engines", ["0,x", "0,-1", "1.5"])
def test_a_bad_engines_option_names_the_option_and_is_a_usage_error(engines, monkeypatch):
    # Before: "Invalid value: '0,x' ..." named no option, and "0,-1" was taken (no engine -1 exists)
    # and the exporter started (its serve_forever is stubbed so that the bug fails, not hangs).
    from redis_stats.server import Exporter

    monkeypatch.setattr(Exporter, "serve_forever", lambda self: self.close())
    args = ["exporter", "--redis-url", "redis://127.0.0.1:1/0", "--port", "0", "--engines", engines]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for --engines: {engines!r} is not a comma-separated list of engine indexes (" in (
        result.output
    )


def scrape_families(url: str) -> dict:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.mark.redis_server
@pytest.mark.slow
def test_demo_runs_serves_every_engine_logs_once_and_cleans_up(python_env):
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "demo", "--duration", "14", "--port", "0", "--log-interval", "2"],
        cwd=ROOT,
        env=python_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    url = data_dir = None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if m := re.search(r"\(data in (\S+)\)", line):
            data_dir = Path(m.group(1))
        if m := re.search(r"Redis view of every engine: (http://\S+)/metrics", line):
            url = m.group(1)
            break
    assert url and data_dir and data_dir.exists(), lines
    time.sleep(3)
    first = scrape_families(url + "/metrics")
    time.sleep(3)
    second = scrape_families(url + "/metrics")
    snapshot = json.loads(urllib.request.urlopen(url + "/snapshot", timeout=10).read())
    rest, _ = proc.communicate(timeout=60)
    lines += rest.splitlines()
    assert proc.returncode == 0, "\n".join(lines[-20:])

    def tokens(fams):
        return {s.labels["engine"]: s.value for s in fams["vllm:generation_tokens"].samples}

    assert set(tokens(first)) == {"0", "1"}
    assert all(tokens(second)[e] > tokens(first)[e] for e in ("0", "1")), (tokens(first), tokens(second))
    assert set(snapshot["engines"]) == {"0", "1"}
    # The docs' `jq '.fleet.summary'` (docs/snapshot.md) on the demo's view: its vLLM figures (the
    # demo's exporter was built without them, and the key was absent).
    assert snapshot["fleet"]["summary"]["requests_running"] is not None, snapshot["fleet"]
    printed = [ln for ln in lines if "Engine 000: Avg prompt throughput" in ln]
    assert len(printed) >= 3
    printers = {re.search(r"pid=(\d+)", ln).group(1) for ln in printed}
    assert len(printers) == 1, printers
    assert any("2 Engines Aggregated" in ln for ln in lines)
    # Nothing left behind: no node process, no server, no temp dir.
    assert not data_dir.exists()
    for pid in printers:
        assert not Path(f"/proc/{pid}").exists()
    out = subprocess.run(["pgrep", "-f", f"redis-server.*{data_dir}"], capture_output=True, text=True)
    assert out.stdout.strip() == ""
    assert "every process it started has exited" in lines[-1]


@pytest.fixture
def fleet(config, fake_client):
    cat = vllm_catalog()
    writer = StatsWriter(config, cat, engines=[0, 1], client=fake_client(), start=False)
    recorder = VllmRecorder(writer, "m", [0, 1])
    yield writer, recorder, StatsReader(config, cat, client=fake_client())
    writer._closed = True


def test_top_renders_throughput_requests_kv_and_percentiles(fleet):
    writer, recorder, reader = fleet
    writer.flush()
    before = reader.snapshot()
    time.sleep(0.5)
    recorder.record(
        scheduler(running=7, waiting=2, kv=0.5),
        iteration(prompt=100, generation=50, ttft=[0.05] * 10, itl=[0.02] * 100),
        engine_idx=0,
    )
    recorder.record(scheduler(running=3, kv=0.25), iteration(generation=10), engine_idx=1)
    writer.flush()
    after = reader.snapshot()
    console = Console(record=True, width=200)
    console.print(render(before, after))
    text = console.export_text()
    for column in COLUMNS:
        assert column in text
    seconds = after.time - before.time
    row0 = next(line for line in text.splitlines() if line.strip().startswith("│ 0") or line.startswith("0 "))
    assert f"{100 / seconds:.1f}" in row0 and f"{50 / seconds:.1f}" in row0
    assert " 7 " in row0 and " 50.0 " in row0
    # All 10 TTFTs were 50 ms, in the (0.04, 0.06] bucket: p50 interpolates to 50 ms, written in
    # seconds as the live page writes it.
    assert " 0.05 s " in row0
    total = next(line for line in text.splitlines() if "total" in line)
    assert " 10 " in total and "37.5" in total


def test_exporter_json_agrees_with_its_prometheus_view(fleet):
    writer, recorder, reader = fleet
    recorder.record(
        scheduler(running=4, waiting=1, kv=0.3),
        iteration(prompt=20, generation=5, ttft=[0.1, 0.2], done=[finished("stop")]),
        engine_idx=1,
    )
    writer.flush()
    exporter = Exporter(reader, port=0).start()
    try:
        doc = json.loads(urllib.request.urlopen(exporter.url + "/snapshot", timeout=10).read())
        fams = scrape_families(exporter.url + "/metrics")
        health = json.loads(urllib.request.urlopen(exporter.url + "/healthz", timeout=10).read())
    finally:
        exporter.close()
    assert health == {"status": "ok", "engines": 2, "engines_up": 2}
    engine = doc["engines"]["1"]
    assert engine["up"] is True
    gauges = {name: series[0]["value"] for name, series in engine["gauges"].items()}
    prom_gauge = {s.labels["engine"]: s.value for s in fams["vllm:num_requests_running"].samples}
    assert gauges["vllm:num_requests_running"] == prom_gauge["1"] == 4
    counters = {
        (name, tuple(sorted(c["labels"].items()))): c["value"]
        for name, cs in engine["counters"].items()
        for c in cs
    }
    for s in fams["vllm:request_success"].samples:
        if s.labels["engine"] == "1":
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "engine"))
            assert counters[("vllm:request_success", labels)] == s.value
    (ttft,) = (h["value"] for h in engine["histograms"]["vllm:time_to_first_token_seconds"])
    prom = {
        s.labels["le"]: s.value
        for s in fams["vllm:time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["engine"] == "1"
    }
    assert {("+Inf" if le == "+Inf" else float(le)): c for le, c in prom.items()} == {
        (b if b == "+Inf" else float(b)): c for b, c in ttft["buckets"]
    }
    assert ttft["count"] == 2 and 0.1 <= ttft["p50"] <= 0.25


def test_healthz_is_503_when_redis_is_down(namespace):
    from redis_stats import StatsConfig

    reader = StatsReader(StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace, connect_timeout_ms=50))
    exporter = Exporter(reader, port=0).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(exporter.url + "/healthz", timeout=10)
        assert err.value.code == 503
        assert json.loads(err.value.read())["error"] == "connection"
    finally:
        exporter.close()


def test_gc_and_inspect_commands(redis_server, namespace):
    from redis_stats import StatsConfig

    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0, 3], start=False)
    assert w.flush()
    env = {"REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    result = CliRunner().invoke(main, ["inspect"], env=env)
    assert result.exit_code == 0, result.output
    assert "engines: 2" in result.output and "engine 3: up" in result.output
    assert w.writer_id in result.output
    result = CliRunner().invoke(main, ["gc", "--dry-run", "--retention", "3600"], env=env)
    assert "would remove 0 engines" in result.output
    w._closed = True


def test_gc_that_cannot_collect_the_namespace_exits_1(redis_server, namespace):
    """A key of the wrong type (or a right the user lacks) where gc works: gc.lua fails. Before
    shards that raised, and `redis-stats gc` exited 1 as docs/cli.md says for a refused command;
    since each shard's failure is collected into GcResult.failed the command printed it and
    exited 0, so a cron job never learnt that nothing was collected."""
    import time

    import redis

    from redis_stats import StatsConfig
    from redis_stats.keys import Keys

    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    w = StatsWriter(cfg, vllm_catalog(), engines=[0], start=False)
    assert w.flush() and w.close()
    r = redis.Redis.from_url(redis_server.url)
    r.delete(Keys(namespace).seq)
    r.set(Keys(namespace).seq, "not a hash")
    time.sleep(0.25)
    env = {"REDIS_STATS_URL": redis_server.url, "REDIS_STATS_NAMESPACE": namespace}
    env |= {"REDIS_STATS_STALE_AFTER": "0.1", "REDIS_STATS_FLUSH_INTERVAL": "0.1"}
    result = CliRunner().invoke(main, ["gc", "--retention", "0.2"], env=env)
    assert result.exit_code == 1, result.output
    assert f"not collected: keys {Keys(namespace).prefix}*" in result.output
    assert "WRONGTYPE" in result.output


@pytest.mark.parametrize("command", [["exporter"], ["demo", "--duration", "1"]])
@pytest.mark.parametrize("host", ["nosuch.invalid", "192.0.2.1"])
def test_an_address_that_cannot_be_served_points_at_host_not_the_port(command, host):
    # Before: "is another exporter (or the demo) running? Pick another --port, or --port 0" for an
    # address that is no name or no interface of this host, even with --port 0 already given.
    result = CliRunner().invoke(
        main, [*command, "--redis-url", "redis://127.0.0.1:1/0", "--host", host, "--port", "0"]
    )
    assert result.exit_code == 1, result.output
    assert f"on {host}:0:" in result.output
    assert "check --host: it must be an address of this host" in result.output
    assert "another exporter" not in result.output and "port taken" not in result.output
    assert "simulating" not in result.output  # the demo checks the address before starting anything


def test_a_server_binary_variable_naming_no_program_is_said_so(tmp_path):
    # Before: the demo's Popen raised FileNotFoundError, reported as "cannot serve on 127.0.0.1:0:
    # No such file or directory / is the port taken?".
    missing = tmp_path / "redis-server"
    env = {"REDIS_STATS_SERVER_BINARY": str(missing)}
    result = CliRunner().invoke(main, ["demo", "--port", "0", "--duration", "1"], env=env)
    assert result.exit_code == 1, result.output
    assert f"REDIS_STATS_SERVER_BINARY={missing} is not an executable file" in result.output
    assert "cannot serve" not in result.output and "simulating" not in result.output


def test_gc_refuses_a_retention_that_would_remove_live_data_naming_both_values():
    env = {"REDIS_STATS_URL": "redis://127.0.0.1:1/0", "REDIS_STATS_STALE_AFTER": "30"}
    result = CliRunner().invoke(main, ["gc", "--retention", "10"], env=env)
    assert result.exit_code == 2, result.output
    assert "retention=10 is shorter than 2 x max(stale_after=30, flush_interval=1) = 60 s" in result.output
    assert "make retention at least 60 s" in result.output


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_the_exporter_stops_cleanly_on_ctrl_c_and_sigterm(sig, tmp_path):
    """Ctrl-C, and SIGTERM (how Kubernetes stops a pod), close the exporter and exit 0, each time,
    with Redis down and after it served every endpoint. (SIGTERM killed it unclosed before; after
    SIGINT an exporter under a loaded test run kept serving about 1 time in 10, which CI hit.)"""
    import os
    import signal

    from redis_stats.tools.embedded import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    env.update(REDIS_STATS_URL=f"redis://127.0.0.1:{free_port()}/0", REDIS_STATS_NAMESPACE="stops")
    for _ in range(3):
        proc = subprocess.Popen(
            [PYTHON, "-m", "redis_stats", "exporter", "--port", "0", "--gc-interval", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A test run started in the background of a shell inherits SIGINT ignored: undo it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            match = re.search(r"on (http://[\d.]+:\d+)/metrics", line)
            assert match, line
            for path in ("/metrics", "/snapshot", "/load", "/"):
                try:
                    urllib.request.urlopen(match.group(1) + path, timeout=5).read()
                except OSError:
                    pass  # Redis is down: some answer 503; what matters is what follows
            proc.send_signal(getattr(signal, sig))
            _out, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert "Traceback" not in err


def test_the_demo_on_a_port_in_use_says_only_that_and_starts_nothing():
    """Before: "cannot serve on 127.0.0.1:P: Address already in use / is the port taken? ..." and
    then "demo stopped: every process it started has exited" although it had started nothing."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["demo", "--port", str(port), "--duration", "1"])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (
        f"Error: port {port} on 127.0.0.1 is in use by another program, so the demo started nothing: "
        'give another --port, or --port 0 for a free one (make demo DEMO_ARGS="--port 0")'
    )
