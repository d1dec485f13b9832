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

__all__ = ["StatsReader"]


class StatsReader:
    """Reads every engine of one namespace (or the given *engines*) atomically.

    *catalog* is the code's own catalogue; metrics it does not define are rendered from the
    catalogue stored in Redis. Errors from Redis are raised to the caller (the collector turns
    them into self-metrics).
    """

    def __init__(
        self, config: StatsConfig | None = None, catalog: Catalog | None = None, *, client: Any = None
    ) -> None:
        self.config = config or StatsConfig.from_env()
        self.keys = Keys(self.config.namespace)
        self._client = client if client is not None else make_client(self.config)
        self._script = ReadOnlyScript(self._client, load_script("read"))
        self._decoder = SnapshotDecoder(catalog, stale_after=self.config.stale_after)

    def __repr__(self) -> str:
        return f"StatsReader(url={self.config.safe_url!r}, namespace={self.config.namespace!r})"

    def read_args(self, engines: Iterable[int] | None = None) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of ``read.lua`` (shared with the asyncio reader)."""
        keys = [self.keys.engines, self.keys.writers, self.keys.meta, self.keys.conflicts]
        args = [self.keys.prefix, self._decoder.meta_version]
        if engines is not None:
            args += [str(int(e)) for e in engines]
        return keys, args

    def snapshot(self, engines: Iterable[int] | None = None) -> Snapshot:
        """All engines (or only *engines*) at one instant, in one script call."""
        keys, args = self.read_args(engines)
        return self._decoder.decode(self._script(keys, args))

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
