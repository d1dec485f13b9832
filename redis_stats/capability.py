"""What a server can do, checked when a process first talks to it: scripts, atomic, and the
commands the store needs.

Every store redis_stats runs on speaks Redis' protocol, but not all of them can hold the store:
Valkey 9.1 may run with its Lua module unloaded (``EVAL`` answers "Could not find scripting
engine 'lua'"); Garnet runs scripts only with ``--lua``, and atomically only with
``--lua-transaction-mode``, which it does not report. A writer there would retry for ever, and a
reader would show an empty namespace as if nothing were there. So a writer, a reader and every
command check the server first and refuse one that cannot hold the store, with one
:class:`~redis_stats.errors.StoreUnsupported` that names the server, what is missing and how to
fix it.

The check is :func:`check_steps` (sans I/O: ``HELLO``, a probe script, ``COMMAND INFO``), carried
out blocking by :func:`check_store` and awaited by :func:`acheck_store`. Each step that only asks
(``HELLO``, ``COMMAND INFO``) is skipped when the server or the ACL user refuses it: the check
refuses a server only on what the server said, never on what it would not say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis.utils
from redis.exceptions import NoPermissionError, RedisClusterException, RedisError, ResponseError

from redis_stats._core.steps import Steps, arun, run
from redis_stats._scripts import AsyncScript, Script
from redis_stats.config import StatsConfig
from redis_stats.connection import is_cluster
from redis_stats.errors import SCRIPTING_MISSING, StoreUnsupported
from redis_stats.keys import Keys

__all__ = [
    "CHECK_STEPS",
    "PROBE",
    "ServerInfo",
    "acheck_step",
    "acheck_store",
    "check_step",
    "check_steps",
    "check_store",
    "server_info",
]

#: The probe script: it touches nothing. Given the namespace's catalogue key, so that on a
#: Cluster it runs on the node that holds the namespace, and an ACL user's key rules allow it.
PROBE = "return 1"

# What each role sends itself or runs in its scripts (docs/redis-servers.md, "Redis-compatible
# stores"); WAIT only with wait_replicas.
_READER_COMMANDS = (
    "MULTI",
    "EXEC",
    "TIME",
    "HGET",
    "HGETALL",
    "HKEYS",
    "ZRANGE",
    "ZSCORE",
    "EVALSHA",
    "SCRIPT",
)
_WRITER_COMMANDS = (
    "EVALSHA",
    "SCRIPT",
    "TIME",
    "EXISTS",
    "TYPE",
    "HGET",
    "HSET",
    "HDEL",
    "HEXISTS",
    "HINCRBY",
    "HINCRBYFLOAT",
    "ZADD",
    "ZRANGE",
)

_NAMES = {"redis": "Redis", "valkey": "Valkey", "garnet": "Garnet", "dragonfly": "Dragonfly"}

_LUA_FIX = {
    "valkey": "load Valkey's Lua module (`loadmodule` in valkey.conf, or `MODULE LOAD <path>`; a "
    "server that ran `MODULE UNLOAD lua` has it again once restarted)",
    "garnet": "start Garnet with --lua --lua-transaction-mode, then set REDIS_STATS_ATOMIC_SCRIPTS=1",
}
_NO_LUA = {
    "valkey": "its Lua scripting module is not loaded (EVALSHA: \"Could not find scripting engine 'lua'\")",
    "garnet": "Lua scripting is off (Garnet was started without --lua)",
}
_GARNET_FIX = (
    "start Garnet with --lua --lua-transaction-mode (without that mode a script is run as separate "
    "commands: a reader sees a flush half applied, a failed one is not rolled back), then set "
    "REDIS_STATS_ATOMIC_SCRIPTS=1 to say so: Garnet does not report its mode"
)


@dataclass(frozen=True)
class ServerInfo:
    """What a server said of itself in ``HELLO``: its *kind* (``redis``, ``valkey``, ``garnet``,
    ``dragonfly``, another server's own name, or ``unknown`` when it would not say), its
    *version*, and the *modules* it listed (None: not listed)."""

    kind: str = "unknown"
    version: str = ""
    modules: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        """``Valkey 9.1.2``, ``Garnet 1.0.84``, ... or ``the server`` when it did not say."""
        if self.kind == "unknown":
            return "the server"
        return f"{_NAMES.get(self.kind, self.kind)} {self.version}".strip()

    def version_at_least(self, *wanted: int) -> bool:
        """Whether :attr:`version` is at least *wanted* (False when it is not a version)."""
        found = [int(n) for n in re.findall(r"\d+", self.version)[: len(wanted)]]
        return len(found) == len(wanted) and tuple(found) >= wanted


def _pairs(reply: Any) -> dict[str, Any]:
    if isinstance(reply, dict):
        return {str(k): v for k, v in reply.items()}
    if isinstance(reply, (list, tuple)):
        return {str(k): v for k, v in zip(reply[0::2], reply[1::2])}
    return {}


def _module_names(modules: Any) -> tuple[str, ...] | None:
    if not isinstance(modules, (list, tuple)):
        return None
    return tuple(str(_pairs(m).get("name", "")) for m in modules)


def server_info(hello: Any) -> ServerInfo:
    """The :class:`ServerInfo` of a ``HELLO`` reply (RESP2's flat list or RESP3's map; anything
    else, e.g. None for a server that refused ``HELLO``: ``unknown``).

    Garnet, Dragonfly and kvrocks all answer ``server: redis``, with the Redis version they
    follow; Garnet and Dragonfly add a field of their own, which is what tells them apart."""
    fields = _pairs(hello)
    if not fields:
        return ServerInfo()
    modules = _module_names(fields.get("modules"))
    for kind in ("garnet", "dragonfly"):
        if f"{kind}_version" in fields:
            return ServerInfo(kind, str(fields[f"{kind}_version"]), modules)
    kind = str(fields.get("server") or "unknown").lower()
    return ServerInfo(kind, str(fields.get("version", "")), modules)


def _where(info: ServerInfo, config: StatsConfig) -> str:
    return f"{info.name} at {config.safe_url}"


def _refused_by_what_it_said(info: ServerInfo, config: StatsConfig) -> StoreUnsupported | None:
    """A refusal decided by ``HELLO`` alone: Garnet not vouched for, Valkey >= 9.1 listing its
    modules without Lua (told before the probe: a user without the right to run the probe,
    NOPERM, is then still refused rather than shown an empty view)."""
    if info.kind == "garnet" and not config.atomic_scripts:
        return StoreUnsupported(
            _where(info, config),
            "Garnet runs scripts atomically only in its Lua transaction mode",
            _GARNET_FIX,
        )
    if info.kind == "valkey" and info.modules is not None and info.version_at_least(9, 1):
        if "lua" not in info.modules:
            return _no_scripting(info, config)
    return None


def _no_scripting(info: ServerInfo, config: StatsConfig) -> StoreUnsupported:
    fix = _LUA_FIX.get(
        info.kind,
        "use a server that runs Lua scripts (EVALSHA, SCRIPT LOAD): docs/redis-servers.md, "
        '"Redis-compatible stores"',
    )
    return StoreUnsupported(
        _where(info, config), _NO_LUA.get(info.kind, "it runs no Lua scripts (EVALSHA)"), fix
    )


def _wanted(config: StatsConfig, writes: bool) -> tuple[str, ...]:
    if not writes:
        return _READER_COMMANDS
    return (*_WRITER_COMMANDS, "WAIT") if config.wait_replicas else _WRITER_COMMANDS


def missing_commands(reply: Any, wanted: Iterable[str], known: str) -> list[str]:
    """The commands of *wanted* that a ``COMMAND INFO`` *reply* does not know. A reply that does
    not know *known* either (a command the server just ran: fakeredis answers nothing for every
    command) tells nothing: then none."""
    if not isinstance(reply, (list, tuple)):
        return []
    names = list(wanted)
    found = {str(e[0]).upper() for e in reply if isinstance(e, (list, tuple)) and e}
    if known not in found:
        return []
    return [n for n in names if n not in found]


def _missing_fix(missing: list[str], config: StatsConfig) -> str:
    if "WAIT" in missing and config.wait_replicas:
        return "unset REDIS_STATS_WAIT_REPLICAS (this server cannot wait for replicas), or use one that can"
    return 'use a server with these commands: docs/redis-servers.md, "Redis-compatible stores"'


def check_steps(config: StatsConfig, *, writes: bool) -> Steps[ServerInfo]:
    """The check as steps (:mod:`redis_stats._core.steps`): ``("hello", None)``,
    ``("probe", read_only)`` (the probe script, ``EVALSHA_RO`` for a reader), ``("commands",
    names)`` (``COMMAND INFO``). Ends with the :class:`ServerInfo`, or raises
    :class:`StoreUnsupported`; a failure to reach the server is raised as it came (the caller
    counts it and checks again next time)."""
    try:
        hello = yield ("hello", None)
    except ResponseError:  # a server before HELLO (Redis < 6), or a proxy that refuses it
        hello = None
    info = server_info(hello)
    refused = _refused_by_what_it_said(info, config)
    if refused is not None:
        raise refused
    try:
        yield ("probe", not writes)
    except NoPermissionError:
        pass  # the ACL user's matter, not the server's: the store's own calls say NOPERM
    except ResponseError as exc:
        if not re.search(SCRIPTING_MISSING, str(exc)):
            raise
        raise _no_scripting(info, config) from None
    wanted = _wanted(config, writes)
    try:
        reply = yield ("commands", wanted)
    except (RedisError, RedisClusterException):  # COMMAND refused (ACL, a proxy): not a verdict
        return info
    missing = missing_commands(reply, wanted, "EVALSHA")
    if missing:
        raise StoreUnsupported(
            _where(info, config), f"it lacks {', '.join(missing)}", _missing_fix(missing, config)
        )
    return info


def _hello_args(client: Any) -> tuple[Any, ...]:
    """``HELLO`` with the protocol the client's connections speak: without one, Dragonfly
    switches the connection to RESP2 (Redis keeps it as it is), and a RESP3 client would then
    misread every reply. The protocol is the one a new connection of the client's pool would
    have (made, not connected: no I/O); a Cluster client's is in its node manager's settings."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        protocol = getattr(pool.connection_class(**pool.connection_kwargs), "protocol", None)
    else:
        manager = getattr(client, "nodes_manager", None)
        protocol = (getattr(manager, "connection_kwargs", None) or {}).get("protocol")
    # redis-py 5 made RESP2 connections by default, 8 RESP3: the installed one's default.
    default: int = getattr(redis.utils, "DEFAULT_RESP_VERSION", 2)
    return ("HELLO", int(protocol) if protocol else default)


def _route(client: Any) -> dict[str, Any]:
    """On a Cluster, a command without keys goes to one node (any: they run the same server)."""
    return {"target_nodes": "random"} if is_cluster(client) else {}


def check_step(client: Any, config: StatsConfig, what: str, arg: Any) -> Any:
    """Carry out one step of :func:`check_steps` on *client* (blocking): for a procedure that
    runs the check among its own steps (a read, a flush round)."""
    if what == "hello":
        return client.execute_command(*_hello_args(client), **_route(client))
    if what == "probe":
        return Script(client, PROBE, read_only=arg)([Keys(config.namespace).meta], [])
    return client.execute_command("COMMAND INFO", *arg, **_route(client))


async def acheck_step(client: Any, config: StatsConfig, what: str, arg: Any) -> Any:
    """:func:`check_step` on a ``redis.asyncio`` client."""
    if what == "hello":
        return await client.execute_command(*_hello_args(client), **_route(client))
    if what == "probe":
        return await AsyncScript(client, PROBE, read_only=arg)([Keys(config.namespace).meta], [])
    return await client.execute_command("COMMAND INFO", *arg, **_route(client))


#: The steps :func:`check_steps` yields: a procedure that runs the check among its own steps
#: hands these to :func:`check_step` / :func:`acheck_step`.
CHECK_STEPS = frozenset({"hello", "probe", "commands"})


def check_store(client: Any, config: StatsConfig, *, writes: bool) -> ServerInfo:
    """Check the server *client* talks to (blocking): its :class:`ServerInfo`, or
    :class:`StoreUnsupported` raised. *writes*: the checker writes (a writer, gc), so its probe
    is ``EVALSHA`` and the commands are a writer's; else ``EVALSHA_RO`` and a reader's."""
    return run(check_steps(config, writes=writes), lambda what, arg: check_step(client, config, what, arg))


async def acheck_store(client: Any, config: StatsConfig, *, writes: bool) -> ServerInfo:
    """:func:`check_store` on a ``redis.asyncio`` client."""

    async def carry_out(what: str, arg: Any) -> Any:
        return await acheck_step(client, config, what, arg)

    return await arun(check_steps(config, writes=writes), carry_out)
