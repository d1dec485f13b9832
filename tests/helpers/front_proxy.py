"""The shipped proxy configurations in front of vLLM's Rust front end, run by the real binaries.

``deploy/nginx/vllm-rs.conf`` (and ``deploy/haproxy/vllm-rs.cfg``) as an operator installs them,
with only the values the file says to set changed: the two upstream addresses, and the port it
listens on (a free loopback one here). Each proxy runs from a directory of its own (its
configuration, pid, logs and temporary files), in the foreground, and is stopped by its pid.

Where a binary is missing the tests that need it skip, saying how to install it; under CI
(``CI_REQUIRE_PROXIES=1``, set by ``.ci/run``; ``make test`` installs both packages) they fail
instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from redis_stats.tools.embedded import tied_to_me

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = ROOT / "deploy" / "nginx" / "vllm-rs.conf"
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "vllm-rs.cfg"

# The values an operator sets, as the shipped files write them (each must occur exactly once).
VLLM_RS = "127.0.0.1:8000"
VIEWS = "127.0.0.1:9400"
LISTEN = 8001


def need(binary: str) -> str:
    """*binary*'s path; without it the calling test skips, or fails under CI."""
    found = shutil.which(binary) or next(
        (p for p in (f"/usr/sbin/{binary}", f"/usr/local/sbin/{binary}") if os.access(p, os.X_OK)), None
    )
    if found is None:
        if os.environ.get("CI_REQUIRE_PROXIES") == "1":
            raise RuntimeError(f"CI_REQUIRE_PROXIES=1 but {binary} is not installed (.ci/install-proxies)")
        pytest.skip(f"no {binary} here (make test installs Debian's nginx and haproxy: .ci/install-proxies)")
    return found


def set_values(text: str, pairs: list[tuple[str, str]]) -> str:
    """*text* with each (old, new) of *pairs* replaced, each old found exactly once (a shipped file
    whose values moved fails here, not in some later assertion)."""
    for old, new in pairs:
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in the shipped configuration"
        text = text.replace(old, new)
    return text


def wait_listening(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(errors="replace") if log.exists() else ""
                raise AssertionError(
                    f"the proxy did not listen on {port} (exit {process.poll()}):\n{text}"
                ) from None
            time.sleep(0.02)


class FrontProxy:
    """One proxy process in front of *vllm_rs* and *views* (``host:port`` each), on *port* of
    127.0.0.1, from *workdir*."""

    kind = ""

    def __init__(self, workdir: Path, port: int, vllm_rs: str, views: str) -> None:
        self.workdir, self.port = workdir, port
        self.vllm_rs, self.views = vllm_rs, views
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "error.log"
        self.process: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> FrontProxy:
        with open(self.workdir / "stdout.log", "wb") as out:
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, preexec_fn=tied_to_me()
            )
        wait_listening(self.port, self.process, self.workdir / "stdout.log")
        return self

    def pids(self) -> list[int]:
        """The master's pid and its workers'."""
        assert self.process is not None
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        kids = [int(p) for p in children.read_text().split()] if children.exists() else []
        return [self.process.pid, *kids]

    def rss(self) -> int:
        """Resident memory of the master and its workers, in bytes."""
        total = 0
        for pid in self.pids():
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        return total

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in (self.log, self.workdir / "stdout.log") if p.exists()
        )

    def close(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Nginx(FrontProxy):
    """``deploy/nginx/vllm-rs.conf`` inside a minimal ``nginx.conf`` of this directory (the http
    block the file is written for, as Debian's and the nginx image's ``conf.d/`` include it)."""

    kind = "nginx"

    def __init__(self, workdir: Path, port: int, vllm_rs: str, views: str, *, workers: int = 1) -> None:
        super().__init__(workdir, port, vllm_rs, views)
        site = set_values(
            NGINX_CONF.read_text(),
            [
                (f"server {VLLM_RS};", f"server {vllm_rs};"),
                (f"server {VIEWS};", f"server {views};"),
                (f"listen {LISTEN};", f"listen 127.0.0.1:{port};"),
            ],
        )
        (workdir / "vllm-rs.conf").write_text(site)
        temp = {name: workdir / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
        for path in temp.values():
            path.mkdir(exist_ok=True)
        # nginx started as root runs its workers as "nobody", who cannot enter a test's 0700
        # directory: as root here, the workers stay root (the proxy listens on loopback only).
        user = "user root;\n" if os.geteuid() == 0 else ""
        (workdir / "nginx.conf").write_text(
            f"{user}worker_processes {workers};\npid {workdir}/nginx.pid;\n"
            f"error_log {self.log} notice;\n"
            "events { worker_connections 4096; }\n"
            "http {\n"
            f"    access_log {workdir}/access.log;\n"
            f"    client_body_temp_path {temp['body']};\n    proxy_temp_path {temp['proxy']};\n"
            f"    fastcgi_temp_path {temp['fastcgi']};\n    uwsgi_temp_path {temp['uwsgi']};\n"
            f"    scgi_temp_path {temp['scgi']};\n"
            f"    include {workdir}/vllm-rs.conf;\n"
            "}\n"
        )

    def polls(self) -> int:
        """``GET /get_load`` requests answered so far (its access log)."""
        log = self.workdir / "access.log"
        return log.read_text(errors="replace").count('"GET /get_load ') if log.exists() else 0

    def command(self) -> list[str]:
        nginx = need("nginx")
        conf = str(self.workdir / "nginx.conf")
        checked = subprocess.run(
            [nginx, "-t", "-p", str(self.workdir), "-c", conf], capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, f"nginx -t refused the shipped configuration:\n{checked.stderr}"
        return [nginx, "-p", str(self.workdir), "-c", conf, "-g", "daemon off;"]


class HAProxy(FrontProxy):
    """``deploy/haproxy/vllm-rs.cfg`` as it is, after a ``global`` section of this directory's."""

    kind = "haproxy"

    def __init__(self, workdir: Path, port: int, vllm_rs: str, views: str, *, threads: int = 0) -> None:
        super().__init__(workdir, port, vllm_rs, views)
        site = set_values(
            HAPROXY_CFG.read_text(),
            [
                (f"server vllm_rs {VLLM_RS}", f"server vllm_rs {vllm_rs}"),
                (f"server exporter {VIEWS}", f"server exporter {views}"),
                (f"bind :{LISTEN}", f"bind 127.0.0.1:{port}"),
            ],
        )
        (workdir / "vllm-rs.cfg").write_text(site)
        nbthread = f"    nbthread {threads}\n" if threads else ""  # 0: one per CPU, HAProxy's default
        (workdir / "global.cfg").write_text(
            f"global\n    maxconn 4096\n{nbthread}    pidfile {workdir}/haproxy.pid\n"
        )

    def command(self) -> list[str]:
        haproxy = need("haproxy")
        files = ["-f", str(self.workdir / "global.cfg"), "-f", str(self.workdir / "vllm-rs.cfg")]
        checked = subprocess.run([haproxy, "-c", *files], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, f"haproxy -c refused the shipped configuration:\n{checked.stdout}"
        return [haproxy, "-db", *files]


PROXIES = {"nginx": Nginx, "haproxy": HAProxy}
