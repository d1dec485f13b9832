"""What a writer's log says of its link to Redis: the outages of its flushes, a server refused.

A failed flush is counted (``flush_errors_total{kind}``) and its batch goes again next round
(:mod:`redis_stats._core.write.protocol`); the log says, per shard, when each outage of its
flushes started and when it ended (:class:`~redis_stats.outage.Outage`), and the end says what
became of what the writer kept meanwhile: confirmed exactly once, or (Redis had lost the
writer's keys: restarted empty, an older copy) its whole state goes with the next flush, so
nothing recorded meanwhile is lost either way. A server the capability check refuses is logged
once as an error, again only when what is missing changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from redis_stats.config import StatsConfig
from redis_stats.errors import StoreUnsupported
from redis_stats.outage import Outage

__all__ = ["FlushOutages"]

# What the end of a flush outage says: Redis applied what the writer kept, or found it had lost
# the writer's keys (restarted empty, an older copy), in which case nothing of that batch was
# applied and the next flush stores the whole state (absolute totals).
_RECOVERED = "what was kept meanwhile is confirmed, exactly once: nothing recorded during the outage was lost"
_REBUILT = (
    "Redis had lost this writer's keys (the warning above): its whole state goes with the next "
    "flush, so nothing recorded during the outage is lost"
)

log = logging.getLogger("redis_stats.writer")


class FlushOutages:
    """The outages of one writer's flushes to *config*'s Redis, per shard (made at its first
    failure), and the refusals of its server. *writer_id* names the writer in a shard (it
    changes there when gc removed it and it carries on under a new one)."""

    def __init__(self, config: StatsConfig, writer_id: Callable[[int], str]) -> None:
        self._config = config
        self._writer_id = writer_id
        self._outages: dict[int, Outage] = {}
        self._refusal = ""  # the last refusal logged: logged again only when it changes

    def _outage(self, shard: int) -> Outage:
        found = self._outages.get(shard)
        if found is None:
            config = self._config
            where = f" (shard {shard})" if config.shards > 1 else ""
            found = self._outages[shard] = Outage(
                lambda: f"flushes of writer {self._writer_id(shard)} to {config.safe_url}{where}",
                log,
                retry=(
                    f"retried every {config.flush_interval:g} s with the same batch; what is "
                    "recorded meanwhile waits in memory"
                ),
            )
        return found

    def failed(self, shard: int, kind: str, exc: BaseException) -> None:
        """A flush of *shard* got no answer (*kind*: :func:`~redis_stats.errors.error_kind`'s):
        the first failure of an outage is logged (a warning), the others at DEBUG."""
        log.debug(
            "flush to %s failed (%s: %s); will retry with the same batch", self._config.safe_url, kind, exc
        )
        self._outage(shard).failed(kind, str(exc))

    def answered(self, shard: int, *, rebuilt: bool) -> None:
        """Redis answered *shard*'s flush: the end of its outage, if one was going on, says what
        became of what the writer kept (applied, or, *rebuilt*, its whole state goes next:
        Redis had lost it)."""
        outage = self._outages.get(shard)
        if outage is not None:
            outage.succeeded(_REBUILT if rebuilt else _RECOVERED)

    def refused(self, writer_id: str, exc: StoreUnsupported) -> None:
        """The capability check refused the server: one error logged, again only when what is
        missing changes (at DEBUG while it does not)."""
        message = str(exc)
        log_fn = log.error if message != self._refusal else log.debug
        self._refusal = message
        log_fn("writer %s sends nothing: %s (checked again at every flush)", writer_id, message)

    def accepted(self) -> None:
        """The capability check passed: a refusal after this one is logged as an error again."""
        self._refusal = ""

    def forked(self) -> None:
        """In a child after fork(): the parent's outages are the parent's to end."""
        self._outages = {}
