"""One home for errors, and the exact kind of every Redis failure, measured on real servers.

Each fault is made for real: a password the server refuses, an ACL user without the right, a
server over ``maxmemory`` with ``noeviction``, a replica. A writer flush and a collector read go
through the public path; :func:`error_kind` is also checked on the exceptions redis-py raises with
both of its reply parsers (hiredis and pure Python) and on an error a script returns itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator

import pytest
import redis
from redis._parsers import _HiredisParser, _RESP2Parser

import redis_stats
from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.errors import (
    ERROR_KINDS,
    CatalogError,
    ConfigError,
    NoServerBinary,
    RedisStatsError,
    ReplicationLag,
    error_kind,
)
from redis_stats.tools.embedded import EmbeddedRedis, binary_of_kind
from tests import acl
from tests.conftest import SERVER_KINDS, sample_catalog

PARSERS = [_RESP2Parser] + ([_HiredisParser] if _HiredisParser is not None else [])


def test_every_error_class_has_one_home_and_keeps_its_old_bases_and_import_paths():
    from redis_stats.catalog import CatalogError as from_catalog
    from redis_stats.config import ConfigError as from_config
    from redis_stats.tools.embedded import NoServerBinary as from_embedded
    from redis_stats.writer import ReplicationLag as from_writer
    from redis_stats.writer import error_kind as kind_from_writer

    assert (from_catalog, from_config, from_embedded, from_writer) == (
        CatalogError,
        ConfigError,
        NoServerBinary,
        ReplicationLag,
    )
    assert kind_from_writer is error_kind
    assert redis_stats.CatalogError is CatalogError and redis_stats.ConfigError is ConfigError
    assert redis_stats.RedisStatsError is RedisStatsError
    # Code that caught the old bases still catches them; RedisStatsError catches all four.
    for cls, old_base in (
        (ConfigError, ValueError),
        (CatalogError, ValueError),
        (ReplicationLag, redis.RedisError),
        (NoServerBinary, RuntimeError),
    ):
        assert issubclass(cls, RedisStatsError) and issubclass(cls, old_base)
    with pytest.raises(RedisStatsError):
        StatsConfig(flush_interval=-1)
    with pytest.raises(RedisStatsError):
        sample_catalog()["no_such_metric"]


class Faults:
    """Three private servers of one kind, each with a fault that stays.

    ``auth``: a password, and ACL users limited to the documented rules; ``full``: more data than
    its ``maxmemory``, with ``noeviction``; ``replica``: a read-only replica of ``master``.
    """

    def __init__(self, kind: str) -> None:
        binary = binary_of_kind(kind)
        if binary is None:
            pytest.skip(f"no {kind} server binary here")
        self.servers: list[EmbeddedRedis] = []
        try:
            self._set_up(binary)
        except BaseException:
            self.close()  # never leave a server running when the set-up fails
            raise

    def _set_up(self, binary: str) -> None:
        self.auth = self._start(binary)
        admin = redis.Redis(port=self.auth.port)
        admin.execute_command("ACL", "SETUSER", "stats-writer", *acl.rules("errs", "wpass", acl.WRITER))
        admin.execute_command(
            "ACL", "SETUSER", "stats-reader", *acl.rules("errs", "rpass", acl.READER, read_only=True)
        )
        admin.config_set("requirepass", "right")  # last: the default user needs it from now on
        admin.close()

        self.full = self._start(binary)
        admin = redis.Redis(port=self.full.port)
        for i in range(64):
            admin.set(f"fill:{i}", b"x" * 65536)  # 4 MiB
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1mb")
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("one-more", "x")
        admin.close()

        self.master = self._start(binary)
        self.replica = self._start(binary, ["--replicaof", "127.0.0.1", str(self.master.port)])

    def _start(self, binary: str, args: list[str] | None = None) -> EmbeddedRedis:
        srv = EmbeddedRedis(binary, extra_args=args or [])
        self.servers.append(srv)
        return srv.start()

    def close(self) -> None:
        for srv in reversed(self.servers):
            srv.close()


@pytest.fixture(scope="module", params=SERVER_KINDS)
def faults(request) -> Iterator[Faults]:
    made = Faults(request.param)
    yield made
    made.close()


def _url(srv: EmbeddedRedis, userinfo: str = "") -> str:
    return f"redis://{userinfo}{'@' if userinfo else ''}127.0.0.1:{srv.port}/0"


def flush_kinds(url: str, caplog: pytest.LogCaptureFixture, **options) -> dict[str, int]:
    """Kinds counted by one failed flush of a StatsWriter, checked against its warning."""
    config = StatsConfig(url=url, namespace="errs", **options)
    writer = StatsWriter(config, sample_catalog(), engines=[0], start=False)
    writer.counter("tokens").labels(engine=0).inc(3)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="redis_stats.writer"):
        assert not writer.flush()
    errors = dict(writer.stats.errors)
    writer._closed = True  # the fault stays: do not wait for a last flush at exit
    (kind,) = errors
    assert f"failed ({kind}: " in caplog.text
    return errors


def read_kinds(url: str, **options) -> dict[str, int]:
    """Kinds counted by a collector that scrapes once through each path."""
    config = StatsConfig(url=url, namespace="errs", **options)
    collector = RedisCollector(StatsReader(config, sample_catalog()))
    list(collector.collect())
    text = collector.render_text()
    errors = dict(collector.errors.counts())
    for kind, n in errors.items():
        assert f'redis_stats_read_errors_total{{kind="{kind}"}} {float(n)}' in text
    return errors


@pytest.mark.parametrize(
    "userinfo",
    [":wrong", "", "nobody:right", "stats-writer:wrong"],
    ids=["wrong-password", "no-password", "unknown-user", "acl-user-wrong-password"],
)
def test_a_refused_password_is_kind_auth(faults, userinfo, caplog):
    url = _url(faults.auth, userinfo)
    assert flush_kinds(url, caplog) == {"auth": 1}
    assert read_kinds(url) == {"auth": 2}


def test_an_acl_user_without_the_right_is_kind_noperm(faults, caplog):
    # The reader's rules cannot run the flush script; the writer's cannot read.
    assert flush_kinds(_url(faults.auth, "stats-reader:rpass"), caplog) == {"noperm": 1}
    assert read_kinds(_url(faults.auth, "stats-writer:wpass")) == {"noperm": 2}


def test_a_server_over_maxmemory_with_noeviction_is_kind_oom(faults, caplog):
    assert flush_kinds(faults.full.url, caplog) == {"oom": 1}
    # Reads may be made to work under OOM; when one fails, it must say why.
    assert set(read_kinds(faults.full.url)) <= {"oom"}


def test_a_read_only_replica_is_kind_readonly(faults, caplog):
    assert flush_kinds(faults.replica.url, caplog) == {"readonly": 1}


def test_the_asyncio_writer_counts_the_same_kinds(faults):
    from redis_stats.aio import AsyncStatsWriter

    async def kinds(url: str) -> dict[str, int]:
        writer = AsyncStatsWriter(StatsConfig(url=url, namespace="errs"), sample_catalog(), engines=[0])
        writer.counter("tokens").labels(engine=0).inc(3)
        assert not await writer.flush()
        await writer._client.aclose()
        return dict(writer.stats.errors)

    cases = {
        _url(faults.auth, ":wrong"): "auth",
        _url(faults.auth): "auth",
        _url(faults.auth, "stats-reader:rpass"): "noperm",
        faults.full.url: "oom",
        faults.replica.url: "readonly",
    }
    got = {url: asyncio.run(kinds(url)) for url in cases}
    assert got == {url: {kind: 1} for url, kind in cases.items()}


def test_a_stopped_server_is_kind_timeout_and_a_closed_port_kind_connection(caplog):
    srv = EmbeddedRedis().start()
    try:
        os.kill(srv.pid, signal.SIGSTOP)  # accepts connections (the kernel does), never answers
        try:
            assert flush_kinds(srv.url, caplog, socket_timeout_ms=200) == {"timeout": 1}
            assert read_kinds(srv.url, socket_timeout_ms=200) == {"timeout": 2}
        finally:
            os.kill(srv.pid, signal.SIGCONT)
        url = srv.url
    finally:
        srv.close()
    assert flush_kinds(url, caplog) == {"connection": 1}
    assert read_kinds(url) == {"connection": 2}


def _raised(fn) -> BaseException:
    with pytest.raises(redis.RedisError) as info:
        fn()
    return info.value


# A script that catches a failed write and returns its own error, the code behind a prefix: the
# class is then a plain ResponseError and only the text tells the kind.
_WRAPPED = "local r = redis.pcall('set', KEYS[1], '1'); return redis.error_reply('flush: ' .. r.err)"


def _script_noperm(admin: redis.Redis, writer: redis.Redis) -> None:
    """The writer user runs a script (its right) that runs DEL (not its right) on its own key."""
    sha = admin.script_load("return redis.call('del', KEYS[1])")
    writer.evalsha(sha, 1, "rs:{errs}:x")


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.__name__)
def test_error_kind_of_each_fault_with_each_reply_parser(faults, parser):
    server, full_server, replica = faults.auth, faults.full, faults.replica

    def client(srv: EmbeddedRedis, **kw) -> redis.Redis:
        return redis.Redis(connection_pool=redis.ConnectionPool(port=srv.port, parser_class=parser, **kw))

    def writer_of(srv: EmbeddedRedis) -> redis.Redis:
        return client(srv, username="stats-writer", password="wpass")

    cases = {
        "auth": [
            _raised(lambda: client(server, password="wrong").get("k")),
            _raised(lambda: client(server).get("k")),
            _raised(lambda: client(server, username="nobody", password="right").get("k")),
        ],
        "noperm": [
            _raised(lambda: client(server, username="stats-writer", password="wpass").get("other")),
            _raised(lambda: client(server, username="stats-reader", password="rpass").set("rs:{errs}:x", 1)),
            # In a script: Redis 7 and Valkey 9 word it differently (neither says NOPERM).
            _raised(lambda: _script_noperm(client(server, password="right"), writer_of(server))),
        ],
        "oom": [
            _raised(lambda: client(full_server).set("k", 1)),
            _raised(lambda: client(full_server).eval("return redis.call('set', KEYS[1], '1')", 1, "k")),
            _raised(lambda: client(full_server).eval(_WRAPPED, 1, "k")),
            _raised(lambda: client(full_server).pipeline().set("k", 1).get("k").execute()),
        ],
        "readonly": [
            _raised(lambda: client(replica).set("k", 1)),
            _raised(lambda: client(replica).eval("return redis.call('set', KEYS[1], '1')", 1, "k")),
            _raised(lambda: client(replica).eval(_WRAPPED, 1, "k")),
        ],
        "response": [_raised(lambda: client(replica).execute_command("NO-SUCH-COMMAND"))],
    }
    got = {kind: [error_kind(e) for e in excs] for kind, excs in cases.items()}
    assert got == {kind: [kind] * len(excs) for kind, excs in cases.items()}


def test_error_kind_of_what_is_not_a_redis_reply():
    assert error_kind(ReplicationLag("0 of 1 replicas")) == "replication"
    assert error_kind(TimeoutError()) == "timeout"  # asyncio.timeout raises the builtin one
    assert error_kind(ConnectionResetError()) == "connection"
    assert error_kind(KeyError("x")) == "other"
    assert set(ERROR_KINDS) >= {"auth", "noperm", "oom", "readonly", "timeout", "connection", "response"}
