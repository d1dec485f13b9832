"""No secret in any output: a distinctive password is planted in every URL form redis_stats
accepts (and in the malformed forms it refuses), then every surface is scanned: log records,
exception messages, repr/str of the objects, every HTTP endpoint, the CLI's output, and the
command lines of the demo's child processes.

A leak is any 4-character piece of the secret: a mask that shows half a password fails too.
"""

from __future__ import annotations

import gzip
import logging
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.config import ConfigError, mask_url, redact, url_problem
from redis_stats.connection import make_client
from redis_stats.keys import Keys
from redis_stats.server import Exporter
from redis_stats.tools.cli import main
from redis_stats.tools.embedded import EmbeddedRedis, free_port
from tests.conftest import PYTHON, ROOT, sample_catalog

# Alphanumeric pieces separated by every character that troubles URL parsing.
PIECES = ["Zq9x", "Kw7y", "Pm3v", "Ht8u", "Lr2s", "Nb6c", "Jd5e"]
ODD = "Zq9x/Kw7y?Pm3v#Ht8u@Lr2s:Nb6c%Jd5e"  # / ? # @ : % all unencoded
PLAIN = "Zq9xKw7yPm3v"
ENC = quote(ODD, safe="")


def leaked(text: str) -> list[str]:
    return [p for p in PIECES if p in text]


def assert_clean(surfaces: dict[str, str]) -> None:
    found = {name: leaked(text) for name, text in surfaces.items() if leaked(text)}
    assert not found, f"the secret shows in: {found}"


def forms(port: int, sock: str = "/tmp/redis_stats-no-such.sock") -> dict[str, str]:
    """Every URL form that carries a credential (all accepted by StatsConfig)."""
    h = f"127.0.0.1:{port}"
    return {
        "userinfo": f"redis://statsuser:{PLAIN}@{h}/0",
        "password-only": f"redis://:{PLAIN}@{h}/0",
        "legacy-secret@": f"redis://{PLAIN}@{h}/0",
        "query-password": f"redis://{h}/0?password={PLAIN}",
        "query-user-and-password": f"redis://{h}/0?username=statsuser&password={PLAIN}",
        "odd-encoded": f"redis://statsuser:{ENC}@{h}/0",
        "odd-@-and-:-raw": f"redis://statsuser:Zq9x@Kw7y:Pm3v@{h}/0",
        "query-odd-encoded": f"redis://{h}/0?password={ENC}",
        "rediss": f"rediss://statsuser:{PLAIN}@{h}/0?ssl_cert_reqs=none",
        "rediss-query": f"rediss://{h}/0?ssl_cert_reqs=none&password={PLAIN}",
        "sentinel-userinfo": f"redis+sentinel://statsuser:{PLAIN}@{h},127.0.0.1:1/mymaster/0",
        "sentinel_password": f"redis+sentinel://{h}/mymaster?sentinel_password={PLAIN}",
        "sentinel-both-odd": (
            f"redis+sentinel://statsuser:{ENC}@{h}/mymaster/0?sentinel_username=s&sentinel_password={ENC}"
        ),
        "cluster": f"redis+cluster://statsuser:{PLAIN}@{h},127.0.0.1:1",
        "cluster-query": f"redis+cluster://{h}?password={PLAIN}",
        "unix": f"unix://statsuser:{PLAIN}@{sock}?db=0",
        "unix-query": f"unix://{sock}?db=0&password={PLAIN}",
        "token-param": f"redis://{h}/0?auth_token={PLAIN}&client_secret={PLAIN}",
    }


# Malformed: a password with a raw / ? # (or & in a query value), or in the port's place. Each is
# refused by StatsConfig with a message that names the problem and quotes no piece of the secret.
MALFORMED = {
    "raw-odd": f"redis://statsuser:{ODD}@127.0.0.1:1/0",
    "raw-slash": "redis://statsuser:Zq9x/Kw7y@127.0.0.1:1/0",
    "raw-slash-digits": "redis://statsuser:12/Zq9x@127.0.0.1:1/0",
    "raw-question": "redis://statsuser:Zq9x?Kw7y@127.0.0.1:1/0",
    "raw-hash": "redis://statsuser:Zq9x#Kw7y@127.0.0.1:1/0",
    "raw-hash-in-query": "redis://127.0.0.1:1/0?password=Zq9x#Kw7y",
    "raw-amp-in-query": "redis://127.0.0.1:1/0?password=Zq9x&Kw7y",
    "raw-at-in-query": "redis+sentinel://127.0.0.1:1/m?sentinel_password=Zq9x@Kw7y",
    "password-as-port": "redis://127.0.0.1:Zq9xKw7y/0",
    "sentinel-raw-slash": "redis+sentinel://u:Zq9x/Kw7y@127.0.0.1:1/mymaster",
    "cluster-raw-hash": "redis+cluster://u:Zq9x#Kw7y@127.0.0.1:1",
    "no-scheme": "statsuser:Zq9xKw7y@127.0.0.1:1",
    "bad-scheme": "http://statsuser:Zq9xKw7y@127.0.0.1:1",
}


def http_surfaces(exporter: Exporter) -> dict[str, str]:
    """Every endpoint of a running exporter (GET and HEAD, plain, gzip and OpenMetrics)."""
    out = {}
    variants = {
        "": {},
        " gzip": {"Accept-Encoding": "gzip"},
        " openmetrics": {"Accept": "application/openmetrics-text; version=1.0.0"},
    }
    for path in ("/metrics", "/snapshot", "/healthz", "/no-such-path"):
        for method in ("GET", "HEAD"):
            for name, headers in variants.items():
                req = urllib.request.Request(exporter.url + path, method=method, headers=headers)
                try:
                    resp = urllib.request.urlopen(req, timeout=30)
                except urllib.error.HTTPError as err:
                    resp = err
                body = resp.read()
                if resp.headers.get("Content-Encoding") == "gzip" and body:
                    body = gzip.decompress(body)
                out[f"{method} {path}{name}"] = f"{resp.status} {dict(resp.headers)}\n{body.decode()}"
    return out


def in_process_surfaces(url: str, namespace: str) -> dict[str, str]:
    """Config, writer, reader, collector and exporter built from *url*, with Redis as it is.

    Every exception raised on the way is a surface too (a Cluster client, for one, connects
    when it is built).
    """
    cfg = StatsConfig(url=url, namespace=namespace, connect_timeout_ms=200, socket_timeout_ms=500)
    out = {"repr(config)": repr(cfg), "str(config)": str(cfg), "safe_url": cfg.safe_url}

    def attempt(name, fn):
        try:
            return fn()
        except Exception as exc:
            out[name + " raised"] = f"{type(exc).__name__}: {exc!r} {exc} {exc.__cause__!r}"
            return None

    attempt("make_client().ping()", lambda: make_client(cfg).ping())
    writer = attempt("StatsWriter()", lambda: StatsWriter(cfg, sample_catalog(), engines=[0], start=False))
    if writer is not None:
        writer.counter("tokens").labels(engine=0).inc(3)
        attempt("flush", writer.flush)
        out["writer"] = f"{writer!r} {writer} {writer.stats}"
        writer._closed = True
    reader = attempt("StatsReader()", lambda: StatsReader(cfg, sample_catalog()))
    if reader is None:
        return out
    out["reader"] = f"{reader!r} {reader}"
    attempt("reader.snapshot()", reader.snapshot)
    collector = RedisCollector(reader)
    out["render_text"] = collector.render_text()
    out["collect"] = repr(list(collector.collect()))
    exporter = Exporter(reader, port=0).start()
    try:
        out["exporter"] = f"{exporter!r} {exporter.url}"
        out.update(http_surfaces(exporter))
    finally:
        exporter.close()
    return out


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_url_is_refused_without_quoting_the_secret(name):
    url = MALFORMED[name]
    with pytest.raises(ConfigError) as err:
        StatsConfig(url=url)
    message = str(err.value)
    assert_clean({"error": message, "mask": mask_url(url)})
    assert "not a usable Redis URL" in message
    # The CLI turns it into a usage error that is just as clean.
    result = CliRunner().invoke(main, ["inspect"], env={"REDIS_STATS_URL": url})
    assert result.exit_code == 2
    assert_clean({"cli": result.output})


@pytest.mark.parametrize("name", list(forms(1)))
def test_mask_hides_every_credential_and_keeps_the_rest(name):
    url = forms(6390)[name]
    masked = mask_url(url)
    assert_clean({"mask": masked})
    assert "***" in masked
    assert masked.startswith(url.split("://")[0] + "://")
    assert "6390" in masked or "unix" in name  # hosts and ports stay readable
    assert url_problem(url) is None


@settings(max_examples=500, deadline=None)
@given(st.text(min_size=1))
def test_mask_never_raises_and_never_shows_a_password(password):
    # Any password, raw in the user part and encoded in the query: the mask is exact.
    url = f"redis://u:{password}@hostname:6379/0?db=0&password={quote(password, safe='')}"
    if any(c in password for c in "/?#"):
        # The user part cannot be told from the path: nothing but the scheme is shown, and the
        # URL is refused.
        assert mask_url(url) == "redis://<not shown: '@' after the host part>"
        assert url_problem(url) is not None
    else:
        assert mask_url(url) == "redis://u:***@hostname:6379/0?db=0&password=***"
        assert url_problem(url) is None
        if "*" not in password:
            assert password not in redact(f"x {password} y {quote(password, safe='')}", url)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary(), st.integers(), st.none()))
def test_mask_and_checks_never_raise(value):
    assert isinstance(mask_url(value), str)
    assert url_problem(value) is None or isinstance(url_problem(value), str)
    if isinstance(value, str):
        assert isinstance(redact("text", value), str)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(forms(1)))
def test_no_surface_shows_the_secret_when_redis_is_unreachable(name, namespace, caplog):
    url = forms(free_port())[name]
    with caplog.at_level(logging.DEBUG):
        surfaces = in_process_surfaces(url, namespace)
    surfaces["log"] = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records) + caplog.text
    assert_clean(surfaces)
    # The scan looked at real error paths: the failures were there to be seen.
    assert any(key.endswith("raised") for key in surfaces)
    if "GET /healthz" in surfaces:
        assert surfaces["GET /healthz"].startswith("503")
        assert surfaces["GET /no-such-path"].startswith("404")


@pytest.fixture(scope="module")
def acl_redis():
    """A server where user `statsuser` has the odd password (and the plain one for ?password=)."""
    server = EmbeddedRedis().start()
    admin = redis.Redis(port=server.port, decode_responses=True)
    admin.execute_command("ACL", "SETUSER", "statsuser", "on", f">{ODD}", f">{PLAIN}", "~*", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")  # a missing password cannot pass
    yield server
    server.close()


def reachable_forms(port: int) -> dict[str, str]:
    h = f"127.0.0.1:{port}"
    return {
        "userinfo": f"redis://statsuser:{PLAIN}@{h}/0",
        "odd-encoded": f"redis://statsuser:{ENC}@{h}/0",
        "query": f"redis://{h}/0?username=statsuser&password={ENC}",
        "wrong-password": f"redis://statsuser:{PLAIN}Zq9x@{h}/0",
    }


@pytest.mark.redis_server
@pytest.mark.slow
@pytest.mark.parametrize("name", ["userinfo", "odd-encoded", "query", "wrong-password"])
def test_no_surface_shows_the_secret_when_redis_answers(name, acl_redis, namespace, caplog):
    url = reachable_forms(acl_redis.port)[name]
    with caplog.at_level(logging.DEBUG):
        surfaces = in_process_surfaces(url, namespace)
    surfaces["log"] = caplog.text
    assert_clean(surfaces)
    if name == "wrong-password":
        assert "503" in surfaces["GET /healthz"]
    else:
        # The encoded odd password really authenticates: the data made it through.
        assert "200" in surfaces["GET /healthz"]
        assert re.search(r'^tokens_total\{engine="0"\} 3', surfaces["GET /metrics"], re.M)


def run_cli(args: list[str], env: dict[str, str], timeout: float = 60) -> str:
    proc = subprocess.run(
        [PYTHON, "-m", "redis_stats", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def exporter_process(env: dict[str, str], args: list[str]) -> tuple[str, dict[str, str]]:
    """Start `redis-stats exporter`, read its start line, scrape every endpoint, stop it."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "redis_stats", "exporter", "--port", "0", "--gc-interval", "0", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"on (http://[\d.]+:\d+)/metrics", line)
        assert match, line + proc.stderr.read()

        class Live:
            url = match.group(1)

        bodies = http_surfaces(Live)  # type: ignore[arg-type]
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    return line, {"stdout": line + out, "stderr": err, **bodies}


@pytest.mark.redis_server
@pytest.mark.slow
def test_cli_commands_never_print_the_secret(acl_redis, namespace, python_env, tmp_path):
    good = reachable_forms(acl_redis.port)["odd-encoded"]
    down = f"redis://statsuser:{ENC}@127.0.0.1:{free_port()}/0?password={PLAIN}"
    # Something in the namespace: inspect, top and gc answer an empty one with exit code 3.
    config = StatsConfig(url=good, namespace=namespace)
    writer = StatsWriter(config, sample_catalog(), engines=[0], start=False)
    writer.counter("tokens").labels(engine=0).inc()
    assert writer.flush()
    writer.close()
    surfaces: dict[str, str] = {}
    for label, url in (("up", good), ("down", down)):
        url_file = tmp_path / f"{label}.url"
        url_file.write_text(url + "\n")
        env = {
            **python_env,
            "REDIS_STATS_NAMESPACE": namespace,
            "REDIS_STATS_CONNECT_TIMEOUT_MS": "200",
        }
        for how, extra_env, url_args in (
            ("env", {"REDIS_STATS_URL": url}, []),
            ("file", {}, ["--redis-url-file", str(url_file)]),
        ):
            e = {**env, **extra_env}
            for cmd in (["inspect"], ["top", "--once", "--interval", "0.2"], ["gc", "--dry-run"]):
                surfaces[f"{label} {how} {cmd[0]}"] = run_cli([*cmd, *url_args], e)
                # The same through click's runner (in-process: what tests and embedders see).
                runner = CliRunner().invoke(
                    main,
                    [*cmd, *url_args],
                    env=extra_env
                    | {"REDIS_STATS_NAMESPACE": namespace, "REDIS_STATS_CONNECT_TIMEOUT_MS": "200"},
                )
                surfaces[f"{label} {how} {cmd[0]} (CliRunner)"] = f"{runner.exit_code} {runner.output}"
            line, exp = exporter_process(e, url_args)
            surfaces.update({f"{label} {how} exporter {k}": v for k, v in exp.items()})
            assert "***" in line
        # Given on the command line the password is in `ps`, but the command does not echo it.
        surfaces[f"{label} argv inspect"] = run_cli(["inspect", "--redis-url", url], env)
    assert_clean(surfaces)
    # The scan saw real output: a working inspect, and a clean one-line failure without a traceback.
    assert "engines:" in surfaces["up file inspect"] and "rc=0" in surfaces["up file inspect"]
    assert "reading redis://statsuser:***@" in surfaces["down file inspect"]
    assert "Traceback" not in surfaces["down file inspect"]
    assert "rc=1" in surfaces["down env gc"]


def test_url_file_option(tmp_path, namespace):
    url_file = tmp_path / "url"
    url_file.write_text(f"  redis://u:{PLAIN}@127.0.0.1:1/0\n\n")
    for cmd in (["inspect"], ["gc"], ["top", "--once"], ["exporter"], ["demo"]):
        # Both on a command line: refused (which one would win is not obvious).
        result = CliRunner().invoke(
            main, [*cmd, "--redis-url", "redis://127.0.0.1:1/0", "--redis-url-file", str(url_file)]
        )
        assert result.exit_code == 2 and "not both" in result.output, (cmd, result.output)
        missing = CliRunner().invoke(main, [*cmd, "--redis-url-file", str(tmp_path / "nope")])
        assert missing.exit_code == 2 and "cannot read" in missing.output
    empty = tmp_path / "empty"
    empty.write_text("\n")
    result = CliRunner().invoke(main, ["inspect", "--redis-url-file", str(empty)])
    assert result.exit_code == 2 and "is empty" in result.output
    # The file wins over REDIS_STATS_URL; its content is stripped.
    result = CliRunner().invoke(
        main,
        ["gc", "--dry-run", "--redis-url-file", str(url_file)],
        env={"REDIS_STATS_URL": "redis://127.0.0.1:2/0", "REDIS_STATS_CONNECT_TIMEOUT_MS": "100"},
    )
    assert result.exit_code == 1
    assert "reading redis://u:***@127.0.0.1:1/0 failed (connection" in result.output
    assert_clean({"gc": result.output})


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


@pytest.mark.redis_server
@pytest.mark.slow
@pytest.mark.parametrize("how", ["file", "argv"])
def test_demo_children_get_the_url_by_environment(how, acl_redis, python_env, tmp_path):
    url = reachable_forms(acl_redis.port)["odd-encoded"]
    url_file = tmp_path / "url"
    url_file.write_text(url)
    given = ["--redis-url-file", str(url_file)] if how == "file" else ["--redis-url", url]
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "redis_stats",
            "demo",
            "--port",
            "0",
            "--nodes",
            "2",
            "--api-servers",
            "1",
            "--duration",
            "30",
            "--log-interval",
            "1",
            "--namespace",
            f"secrets-{how}",
            *given,
        ],
        cwd=ROOT,
        env=python_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cmdlines: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(cmdlines) < 2:
            for kid in children_of(proc.pid):
                try:
                    raw = Path(f"/proc/{kid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"redis_stats.tools.demo" in raw:
                    cmdlines[str(kid)] = raw.replace(b"\0", b" ").decode()
            time.sleep(0.2)
        assert len(cmdlines) == 2, cmdlines
        # The children authenticate (the URL reached them): they write, and node 0 logs.
        time.sleep(3)
        assert redis.Redis(port=acl_redis.port, username="statsuser", password=ODD).exists(
            Keys(f"secrets-{how}").engines
        )
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Engines Aggregated" in out or "Engine 000" in out
    assert_clean({**cmdlines, "demo output": out})
    for cmdline in cmdlines.values():
        assert "redis://" not in cmdline


def test_redact_replaces_raw_and_decoded_forms():
    url = f"redis://u:{ENC}@h:1/0?sentinel_password={PLAIN}&db=0"
    text = f"auth {ODD} failed, then {ENC} and {PLAIN}; db=0 host h"
    cleaned = redact(text, url)
    assert_clean({"redacted": cleaned})
    assert "db=0 host h" in cleaned


@pytest.mark.parametrize("cmd", [["inspect"], ["gc"], ["top", "--once", "--interval", "0.2"]])
def test_a_redis_failure_in_the_cli_is_one_clean_line(cmd):
    # An unreachable Cluster fails the command's first read: one line, exit code 1, masked URL,
    # no traceback. (The exporter starts anyway and serves redis_stats_up 0, as for any URL:
    # tests/connection/test_attack_cluster_down.py.)
    url = f"redis+cluster://statsuser:{PLAIN}@127.0.0.1:{free_port()}"
    env = {"REDIS_STATS_URL": url, "REDIS_STATS_CONNECT_TIMEOUT_MS": "100"}
    result = CliRunner().invoke(main, cmd, env=env)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: reading redis+cluster://statsuser:***@127.0.0.1:")
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert_clean({"cli": result.output})


@pytest.mark.parametrize("name", [*forms(6390), *MALFORMED])
def test_the_redis_address_a_page_header_shows_has_no_secret_and_no_user(name):
    from redis_stats.server.states.sampler import redis_address

    url = {**forms(6390), **MALFORMED}[name]
    shown = redis_address(url)
    assert_clean({name: shown})
    assert "statsuser" not in shown and "***" not in shown and "?" not in shown, shown
    if name in forms(6390) and not name.startswith("unix"):
        assert "127.0.0.1:6390" in shown, shown  # still says where it reads
