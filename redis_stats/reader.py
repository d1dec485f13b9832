"""StatsReader: one round trip to Redis returns a consistent :class:`~redis_stats.snapshot.Snapshot`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .catalog import Catalog
from .config import StatsConfig
from .connection import make_client
from .keys import Keys
from .scripts import ReadOnlyScript, load_script
from .snapshot import Snapshot, SnapshotDecoder

__all__ = ["ReaderCore", "StatsReader"]


class ReaderCore:
    """A reader without its I/O: the arguments of ``read.lua`` and the decoding of its reply
    (shared by :class:`StatsReader` and :class:`redis_stats.aio.AsyncStatsReader`).

    *catalog* is the code's own catalogue; metrics it does not define are rendered from the
    catalogue stored in Redis.
    """

    def __init__(self, config: StatsConfig | None = None, catalog: Catalog | None = None) -> None:
        self.config = config or StatsConfig.from_env()
        self.keys = Keys(self.config.namespace)
        self._decoder = SnapshotDecoder(catalog, stale_after=self.config.stale_after)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.config.safe_url!r}, namespace={self.config.namespace!r})"

    def read_args(self, engines: Iterable[int] | None = None) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of ``read.lua``: every engine, or only *engines*."""
        keys = [self.keys.engines, self.keys.writers, self.keys.meta, self.keys.conflicts]
        args = [self.keys.prefix, self._decoder.meta_version]
        if engines is not None:
            args += [str(int(e)) for e in engines]
        return keys, args

    def decode(self, reply: Any) -> Snapshot:
        """The snapshot in a reply of ``read.lua``."""
        return self._decoder.decode(reply)


class StatsReader(ReaderCore):
    """Reads every engine of one namespace (or the given *engines*) atomically, in one round trip.

    Errors from Redis are raised to the caller (the collector turns them into self-metrics).
    """

    def __init__(
        self, config: StatsConfig | None = None, catalog: Catalog | None = None, *, client: Any = None
    ) -> None:
        super().__init__(config, catalog)
        self._client = client if client is not None else make_client(self.config)
        self._script = ReadOnlyScript(self._client, load_script("read"))

    def snapshot(self, engines: Iterable[int] | None = None) -> Snapshot:
        """All engines (or only *engines*) at one instant, in one script call."""
        return self.decode(self._script(*self.read_args(engines)))

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
