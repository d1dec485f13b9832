"""The Lua scripts of redis_stats, kept as files (``flush.lua``, ``read.lua``, ``lease.lua``,
``gc.lua``), and how they are called."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

__all__ = ["ReadOnlyScript", "load_script"]


@cache
def load_script(name: str) -> str:
    """The source of ``<name>.lua`` shipped in this package."""
    return resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


class ReadOnlyScript:
    """Calls a script that only reads with ``EVALSHA_RO``.

    A read-only ACL user (``%R~rs:{NS}:*``) may not ``EVALSHA`` (its keys count as written) but may
    ``EVALSHA_RO``; it also routes to replicas where a client chooses to. Servers without it
    (Redis < 7, fakeredis) get ``EVALSHA``. ``NOSCRIPT`` loads the script and tries again.
    """

    def __init__(self, client: Any, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self.read_only = True

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        """Run the script once (one round trip, two after a server restart)."""
        for _ in range(3):
            command = "EVALSHA_RO" if self.read_only else "EVALSHA"
            try:
                return self.client.execute_command(command, self.sha, len(keys), *keys, *args)
            except NoScriptError:
                self.client.script_load(self.source)
            except ResponseError as exc:
                if self.read_only and "unknown command" in str(exc).lower():
                    self.read_only = False
                    continue
                raise
        return self.client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
