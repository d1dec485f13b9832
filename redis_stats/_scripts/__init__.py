"""The Lua scripts of redis_stats, kept as files (``flush.lua``, ``read.lua``, ``lease.lua``,
``gc.lua``, each loaded after the shared helpers of ``common.lua``), and the one runner that calls
them, for ``redis`` and ``redis.asyncio`` clients."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError, ResponseError


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


@cache
def load_script(name: str) -> str:
    """The source of ``<name>.lua`` shipped in this package, after ``common.lua`` (the helpers
    the scripts share: one copy in the package, still one source and one SHA per script);
    ``load_script("common")`` is that prelude alone."""
    return _read(name) if name == "common" else _read("common") + _read(name)


class Script:
    """A script called by its SHA on *client*: ``EVALSHA``, or ``EVALSHA_RO`` when *read_only*.

    ``NOSCRIPT`` (a restarted or flushed server) loads the source and calls again. A read-only
    ACL user (``%R~rs:{NS}:*``) may not ``EVALSHA`` (its keys count as written) but may
    ``EVALSHA_RO``, which also routes to replicas where a client chooses to; a server without it
    (Redis < 7, fakeredis) gets ``EVALSHA`` from then on. The decisions live here; :meth:`__call__`
    and :class:`AsyncScript` only wait differently (no reach into redis-py's ``Script``).
    """

    def __init__(self, client: Any, source: str, *, read_only: bool = False) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self.read_only = read_only

    def command(self, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
        """The command of one attempt (``EVALSHA_RO`` while the server is not known to lack it)."""
        return ("EVALSHA_RO" if self.read_only else "EVALSHA", self.sha, len(keys), *keys, *args)

    def retry_after(self, exc: ResponseError) -> bool:
        """Whether *exc* asks for another attempt: True to load the source first, False to retry
        with plain ``EVALSHA``; raises *exc* otherwise."""
        if isinstance(exc, NoScriptError):
            return True
        if self.read_only and "unknown command" in str(exc).lower():
            self.read_only = False
            return False
        raise exc

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        """Run the script once (one round trip, two after a server restart)."""
        for _ in range(3):
            try:
                return self.client.execute_command(*self.command(keys, args))
            except ResponseError as exc:
                if self.retry_after(exc):
                    self.client.script_load(self.source)
        return self.client.execute_command(*self.command(keys, args))


class AsyncScript(Script):
    """:class:`Script` on a ``redis.asyncio`` client (same decisions, awaited)."""

    async def __call__(self, keys: list[str], args: list[Any]) -> Any:
        """Run the script once (one round trip, two after a server restart)."""
        for _ in range(3):
            try:
                return await self.client.execute_command(*self.command(keys, args))
            except ResponseError as exc:
                if self.retry_after(exc):
                    await self.client.script_load(self.source)
        return await self.client.execute_command(*self.command(keys, args))


class ReadOnlyScript(Script):
    """A :class:`Script` that only reads (``EVALSHA_RO``)."""

    def __init__(self, client: Any, source: str) -> None:
        super().__init__(client, source, read_only=True)
