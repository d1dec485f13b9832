"""Who a writer is: its id (:func:`new_writer_id`), and the checks of what it is given at
construction (its role, owner and id, and the engines it heartbeats), refused there with a
:class:`~redis_stats.config.ConfigError` rather than by every flush."""

from __future__ import annotations

import operator
import os
import secrets
import socket

from redis_stats.config import ConfigError

__all__ = ["check_engines", "check_identity", "new_writer_id"]


def check_identity(what: str, value: object) -> None:
    """A writer's *role*, *owner* or id goes to Redis as UTF-8 with every flush: refuse at
    construction what could never be sent (one bad value would stop every flush)."""
    if not isinstance(value, str):
        raise ConfigError(f"{what}={value!r} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{what}={value!r} cannot be encoded as UTF-8 ({exc.reason} at index {exc.start}); "
            "pass text without lone surrogates"
        ) from None


def check_engines(engines: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The engines a writer heartbeats, as ints >= 0; refused at construction otherwise.

    Every flush heartbeats them: a value Redis cannot take as an engine (``-1``) would have every
    flush of the writer refused, and ``1.5`` or ``True`` would silently heartbeat engine 1. The
    same rule as ``labels(engine=...)``; int-like types (numpy integers) are taken by value.
    """
    given = list(engines)
    out = []
    for engine in given:
        try:
            value = None if isinstance(engine, bool) else operator.index(engine)
        except TypeError:
            value = None
        if value is None or value < 0:
            raise ConfigError(
                f"engines={given!r}: engine {engine!r} is not an integer >= 0; "
                "pass each engine index this process serves as an int"
            )
        out.append(value)
    return tuple(out)


def new_writer_id(role: str = "") -> str:
    """A writer id unique per process incarnation: ``host:pid[:role]:random``."""
    parts = [socket.gethostname(), str(os.getpid())]
    if role:
        parts.append(role)
    parts.append(secrets.token_hex(3))
    return ":".join(parts)
