"""What a previous bridge process stored for the same source: the totals a new one continues from.

A bridge process that restarts while its source keeps running would otherwise store the source's
whole totals again beside those its previous writer left in the store (closed, or dead and not
yet collected), and the view's counters would jump by them. So before its first record, a
bridge looks for the newest writer of the namespace with the same owner (``bridge <masked
URL>``) and reads that writer's chunks of the source's engines: its counters and histograms
are the base the new writer starts from (it records only what came since). A source whose
counters are below that base restarted meanwhile: no base then, as for any restart.
"""

from __future__ import annotations

from typing import Any

from redis_stats._core import fields
from redis_stats.catalog import COUNTER, HISTOGRAM
from redis_stats.config import StatsConfig
from redis_stats.keys import Keys, shard_of

from .body import Body

__all__ = ["Predecessor", "find_predecessor"]

Series = tuple[str, int, tuple[str, ...]]


class Predecessor:
    """The newest earlier writer of this source: its id, and its totals by series
    (``(name, engine before the offset, label values)``: a counter's number, a histogram's
    ``(sum, per-bucket counts)``)."""

    def __init__(self, writer_id: str) -> None:
        self.writer_id = writer_id
        self.counters: dict[Series, int | float] = {}
        self.hists: dict[Series, tuple[float, list[int]]] = {}

    def below(self, body: Body) -> str | None:
        """Why *body* cannot continue these totals (a counter or bucket below them), or None."""
        for name, fam in body.families.items():
            for (engine, values), value in fam.series.items():
                key = (name, engine, values)
                if fam.spec.kind == COUNTER and value < self.counters.get(key, 0):
                    return f"counter {name!r} is below what writer {self.writer_id} stored"
                if fam.spec.kind == HISTOGRAM and key in self.hists:
                    if any(n < o for n, o in zip(value[1], self.hists[key][1])):
                        return f"histogram {name!r} is below what writer {self.writer_id} stored"
        return None


def _text(x: Any) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def find_predecessor(client: Any, config: StatsConfig, owner: str, body: Body) -> Predecessor | None:
    """The newest writer of *owner* in the namespace other than a live one of this process, with
    its totals of *body*'s engines; None when there is none. Redis errors are raised."""
    offset, k = config.engine_offset, config.shards
    engines = sorted(body.engines())
    root = Keys(config.namespace)
    home = root.shard(min((shard_of(e + offset, k) for e in engines), default=0), k)
    writer_id = _newest_writer(client, home, owner)
    if writer_id is None:
        return None
    found = Predecessor(writer_id)
    kinds = {name: fam.spec.kind for name, fam in body.families.items()}
    for engine in engines:
        keys = root.shard(shard_of(engine + offset, k), k)
        stored = {_text(f): _text(v) for f, v in client.hgetall(keys.counters(engine + offset)).items()}
        for names_text, values_text in _chunks_of(stored, writer_id):
            _read_chunk(found, kinds, engine, names_text.split("\n"), values_text.split("\n"))
    return found


def _newest_writer(client: Any, home: Keys, owner: str) -> str | None:
    """The bridge writer of *owner* with the newest heartbeat score, or None."""
    best: tuple[float, str] | None = None
    for raw_id, score in client.zrange(home.writers, 0, -1, withscores=True):
        wid = _text(raw_id)
        if ":bridge:" not in wid:
            continue
        if _text(client.hget(home.writer_stats(wid), "owner") or "") != owner:
            continue
        if best is None or abs(score) > best[0]:
            best = (abs(score), wid)
    return None if best is None else best[1]


def _chunks_of(stored: dict[str, str], writer_id: str) -> list[tuple[str, str]]:
    """The (names, values) texts of *writer_id*'s chunks among an engine's counter fields."""
    prefix = fields.chunk_field(writer_id, 0)[: -len("0")]
    chunks = []
    for field, values_text in stored.items():
        if not field.startswith(prefix) or field.endswith(fields.NAMES_SUFFIX):
            continue
        names_text = stored.get(field + fields.NAMES_SUFFIX)
        if names_text is not None:
            chunks.append((names_text, values_text))
    return chunks


def _read_chunk(
    found: Predecessor, kinds: dict[str, str], engine: int, names: list[str], values: list[str]
) -> None:
    if len(names) != len(values):
        return  # not a chunk this version wrote: nothing to continue from
    for name_field, text in zip(names, values):
        try:
            parts = fields.decode(name_field)
            kind = kinds.get(parts[0])
            if kind == COUNTER:
                number = float(text)
                found.counters[(parts[0], engine, tuple(parts[1:]))] = (
                    int(number) if number.is_integer() else number
                )
            elif kind == HISTOGRAM:
                numbers = text.split(" ")
                cumulative = [int(n) for n in numbers[1:]]
                counts = [b - a for a, b in zip([0, *cumulative], cumulative)]
                found.hists[(parts[0], engine, tuple(parts[1:-1]))] = (float(numbers[0]), counts)
        except (ValueError, IndexError):
            continue  # one bad line costs that series only
