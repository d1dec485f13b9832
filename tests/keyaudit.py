"""A check that every script touches only the keys it declares, on a real server.

``MONITOR`` logs each script call, then every command the script runs (``[0 lua] ...``); the
audit parses the log, asks the server for each inner command's keys (``COMMAND GETKEYS``) and
compares them with the KEYS of the call around it. Redis documents declared keys as the
contract of a script; Dragonfly refuses a script that breaks it ("script tried accessing
undeclared key"), kvrocks has a strict mode, managed stores rely on it.
"""

from __future__ import annotations

import re
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import redis

_LINE = re.compile(r"^\+?[0-9.]+ \[\d+ ([^\]]+)\] (.*)$")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b", '"': '"', "\\": "\\"}
SCRIPT_CALLS = {"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"}


def _args(text: str) -> list[str]:
    """The quoted arguments of one MONITOR line (as Redis writes them: sdscatrepr)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != '"':
            i += 1
            continue
        i += 1
        arg: list[str] = []
        while text[i] != '"':
            if text[i] == "\\":
                nxt = text[i + 1]
                if nxt == "x":
                    arg.append(chr(int(text[i + 2 : i + 4], 16)))
                    i += 4
                    continue
                arg.append(_ESCAPES.get(nxt, nxt))
                i += 2
                continue
            arg.append(text[i])
            i += 1
        out.append("".join(arg))
        i += 1
    return out


class KeyAudit:
    """MONITOR on one server while a scenario runs; :meth:`undeclared` lists every command a
    script ran on a key its call did not declare, and :attr:`scripts` counts the calls seen by
    script (its first line, e.g. ``-- redis_stats read: ...``, is looked up by SHA)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self._sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
        if parts.password:
            user = parts.username or "default"
            self._sock.sendall(f"AUTH {user} {parts.password}\r\n".encode())
        self._sock.sendall(b"MONITOR\r\n")
        self._lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buffer = b""
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            buffer += data
            *lines, buffer = buffer.split(b"\r\n")
            self._lines += [line.decode("utf-8", "replace") for line in lines]

    def close(self) -> list[tuple[str, list[str]]]:
        """Stop monitoring: every logged command as (client, args)."""
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        out = []
        for line in self._lines:
            found = _LINE.match(line)
            if found:
                out.append((found.group(1), _args(found.group(2))))
        return out

    @staticmethod
    def undeclared(url: str, logged: list[tuple[str, list[str]]]) -> tuple[list[str], dict[str, int]]:
        """The script commands of *logged* that touched undeclared keys (one line each), and the
        script calls counted by the script's first line."""
        client = redis.Redis.from_url(url, decode_responses=True)
        client.response_callbacks.pop("COMMAND", None)  # the raw reply: the keys
        names = _script_names(client)
        bad: list[str] = []
        calls: dict[str, int] = {}
        declared: set[str] | None = None
        keys_of: dict[tuple[str, ...], list[str]] = {}
        for who, args in logged:
            if not args:
                continue
            name = args[0].upper()
            if who != "lua":
                if name in SCRIPT_CALLS:
                    n = int(args[2])
                    declared = set(args[3 : 3 + n])
                    script = names.get(args[1], args[1][:40]) if "SHA" in name else args[1][:40]
                    calls[script] = calls.get(script, 0) + 1
                continue
            key = tuple(args)
            if key not in keys_of:
                keys_of[key] = _keys(client, args)
            extra = [k for k in keys_of[key] if declared is None or k not in declared]
            if extra:
                bad.append(f"{' '.join(args)[:160]} (undeclared: {extra[:3]})")
        client.close()
        return bad, calls


def _keys(client: Any, args: list[str]) -> list[str]:
    try:
        found = client.execute_command("COMMAND", "GETKEYS", *args)
    except redis.ResponseError:  # TIME and the like: no key
        return []
    return [k if isinstance(k, str) else k.decode() for k in found]


def _script_names(client: Any) -> dict[str, str]:
    """SHA -> first line of each of the package's scripts."""
    import hashlib

    from redis_stats._scripts import load_script

    out = {}
    for name in ("flush", "read", "gc", "lease", "shards", "drop", "book", "router_lease", "usage"):
        source = load_script(name)
        out[hashlib.sha1(source.encode()).hexdigest()] = name
    return out
