"""The Dragonfly lane: the suite's fakeredis tests under fakeredis' Dragonfly emulation.

``make test`` runs the tests that use the ``fake_server`` fixture (flushes, gc, reads, the shards,
bad data) a second time with ``FAKE_SERVER_TYPE=dragonfly`` and ``FAKEREDIS_LUA_VERSION=5.4``:
fakeredis then answers as Dragonfly does (Lua 5.4, whose numbers print differently; no
``redis.setresp``; its error wording; ``EVALSHA_RO`` unknown) — and, with :func:`strict_keys`,
it also keeps Dragonfly's rule that fakeredis leaves out: a script may touch only the keys its
call declares ("script tried accessing undeclared key", Dragonfly's default without
``--default_lua_flags=allow-undeclared-keys``). Every such access is refused as Dragonfly
refuses it, and recorded: the lane fails a test that made one, even when a script caught the
refusal with ``redis.pcall``.
"""

from __future__ import annotations

import os
from typing import Any

from fakeredis._commands import Key
from fakeredis._helpers import SimpleError
from fakeredis.commands_mixins import scripting_mixin

#: The server type the suite's fake servers are made with (the lane sets it).
SERVER_TYPE = os.environ.get("FAKE_SERVER_TYPE", "redis")

#: What scripts touched without declaring it (command, key), since the last :func:`take_undeclared`.
_undeclared: list[tuple[str, bytes]] = []

UNDECLARED = "script tried accessing undeclared key"


def _keys_of(sig: Any, args: list[bytes]) -> list[bytes]:
    """The arguments of a command that are keys, by fakeredis' own signature of it."""
    types = list(sig.fixed)
    if sig.repeat:
        types += [sig.repeat[i % len(sig.repeat)] for i in range(len(args) - len(types))]
    return [a for a, t in zip(args, types) if isinstance(t, Key)]


def strict_keys() -> None:
    """Make fakeredis refuse, in scripts, keys the call did not declare (as Dragonfly does)."""
    mixin = scripting_mixin.ScriptingCommandsMixin
    if getattr(mixin, "_strict_keys", False):
        return
    original = mixin._lua_redis_call

    def call(self: Any, lua_runtime: Any, expected_globals: set[Any], op: bytes, *args: Any) -> Any:
        cmd = scripting_mixin.decode_command_bytes(op)
        rest = [scripting_mixin._convert_redis_arg(a) for a in args]
        if cmd in scripting_mixin.COMMANDS_WITH_SUB and rest:
            cmd, rest = cmd + " " + scripting_mixin.decode_command_bytes(rest[0]), rest[1:]
        _func, sig = self._name_to_func(cmd)
        if sig is not None:
            declared = set(lua_runtime.globals().KEYS.values())
            for key in _keys_of(sig, rest):
                if key not in declared:
                    _undeclared.append((cmd, key))
                    raise SimpleError(f"{UNDECLARED} {key!r} ({cmd})")
        return original(self, lua_runtime, expected_globals, op, *args)

    mixin._lua_redis_call = call  # type: ignore[method-assign]
    mixin._strict_keys = True  # type: ignore[attr-defined]


def take_undeclared() -> list[tuple[str, bytes]]:
    """The undeclared accesses recorded since the last call (and forget them)."""
    found = list(_undeclared)
    _undeclared.clear()
    return found
