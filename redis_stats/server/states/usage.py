"""What the usage views keep of one namespace: its ledger's reader (on the namespace's client)
and the collector of its top tenants for ``/metrics`` (docs/usage.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis_stats.usage.read import UsageReader
from redis_stats.usage.render import UsageCollector

if TYPE_CHECKING:
    from redis_stats.server.source import Source

__all__ = ["UsageState"]


class UsageState:
    """The usage ledger of *source*'s namespace, as its views read it."""

    def __init__(self, source: Source) -> None:
        self.reader = UsageReader(source.reader.config, client=source.reader.client)
        self.collector = UsageCollector(self.reader, source.options.usage_top, source.labels)

    def close(self) -> None:
        """Nothing runs in the background: nothing to stop."""
