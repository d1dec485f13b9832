"""The Redis key layout of one namespace, in one place (see docs/key-schema.md).

Every key of namespace NS starts with ``rs:{NS}:``. The braces are a Redis Cluster hash tag: all
keys of a namespace hash to one slot, so one script can touch all of them atomically, while many
namespaces spread over the cluster. The keys that hold data start with ``rs:{NS}:v<schema>:``, so
that processes of two redis_stats versions with different layouts can share a namespace during a
rolling upgrade without reading or overwriting each other's data; the lease keys (log leader, gc
lock), whose format every version shares, are right under ``rs:{NS}:``.

A namespace may be split into K **shards** (option ``shards``): engine ``e`` lives in shard
``e % K``. Shard 0 is the layout above, unchanged; shard ``s >= 1`` is a self-contained copy of
the data layout under its own hash tag ``NS#<s>.<salt>`` (``#`` is not allowed in a namespace, so
it can never be another namespace's tag), with the salt chosen so that the shards' slots are evenly
spaced around the slot ring from shard 0's: on a Cluster made with equal contiguous slot ranges
(``redis-cli --cluster create``), K = the number of masters puts one shard on each master.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

__all__ = [
    "MAX_LISTED_SHARDS",
    "SCHEMA_VERSION",
    "USAGE_FIXED",
    "Keys",
    "parse_shard_counts",
    "shard_of",
    "shard_slot",
    "shard_tag",
]

# Bumped when the layout or the field encoding changes incompatibly; stored in meta["schema"].
# 2: each writer's absolute values in chunks of the engine's hash (docs/key-schema.md, issue 15);
# 1: deltas merged into one field per series by the flush script, gauges in their own hash.
SCHEMA_VERSION = "2"


USAGE_FIXED = ("seq", "seen", "conf", "e", "t", "rank", "sum")
"""The usage ledger's keys of fixed names under ``<prefix>u:`` (docs/key-schema.md, "Usage")."""

# How many salts a shard's tag is chosen from (the one whose slot is nearest the shard's target):
# 4,096 tries land within ~2 slots of it, and cost ~1 ms per shard, once per process.
_SALTS = 4096


def shard_of(engine: int, shards: int) -> int:
    """The shard holding *engine* (its index as stored, after ``engine_offset``)."""
    return engine % shards


@lru_cache(maxsize=1024)
def shard_tag(namespace: str, shard: int, shards: int) -> str:
    """The hash tag of *shard* of a namespace split into *shards*: the namespace itself for
    shard 0 (the layout of an unsharded namespace), else ``<namespace>#<shard>.<salt>``.

    The salt is the first of ``0 .. 4095`` whose slot is nearest (around the ring) to shard 0's
    slot plus ``shard * 16384 / shards``: every process computes the same tag, and the shards'
    slots are spread evenly, so each lands on its own master of a Cluster whose masters hold
    equal contiguous slot ranges — but for a namespace whose slot is within a few slots of a
    range boundary (~1 name in 1,200 at K = 3): check with ``redis-stats inspect``.
    """
    if shard == 0:
        return namespace
    if not 0 < shard < shards:
        raise ValueError(f"shard {shard} of {shards}")
    n = REDIS_CLUSTER_HASH_SLOTS
    target = (key_slot(namespace.encode()) + shard * n // shards) % n
    best, best_distance = "", n
    for salt in range(_SALTS):
        tag = f"{namespace}#{shard}.{salt}"
        delta = abs(key_slot(tag.encode()) - target)
        distance = min(delta, n - delta)
        if distance < best_distance:
            best, best_distance = tag, distance
            if not distance:
                break
    return best


# At most this many shards (over every listed K but shard 0) are read, gc'd or inspected: a
# garbled ``shards`` field ("2,3,...,64" is 2,016 shards) must not turn every read into thousands
# of keys. Twice the largest K: room for a change between two large K.
MAX_LISTED_SHARDS = 128


def parse_shard_counts(text: object) -> set[int]:
    """The K values of shard 0's catalogue field ``shards`` (``"3"``, ``"2,3"``; see shards.lua):
    every K > 1 the namespace's writers used. Anything else in it is ignored (not an ASCII
    integer from 2 to 64), and so are the oldest K (shards.lua appends: the first listed) beyond
    :data:`MAX_LISTED_SHARDS` shards in all."""
    if not isinstance(text, str):
        return set()
    out: set[int] = set()
    room = MAX_LISTED_SHARDS
    for x in reversed(text.split(",")):
        # isdigit() alone takes "²" (which int() refuses) and other non-ASCII digits.
        k = int(x) if x.isascii() and x.isdigit() and len(x) <= 2 else 0
        if 1 < k <= 64 and k not in out and k - 1 <= room:
            out.add(k)
            room -= k - 1
    return out


def shard_slot(namespace: str, shard: int, shards: int) -> int:
    """The Cluster slot of every key of *shard* (CLUSTER KEYSLOT of any of them)."""
    return int(key_slot(shard_tag(namespace, shard, shards).encode()))


@dataclass(frozen=True)
class Keys:
    """Names of every key of one namespace (of one of its shards, with *tag*). The names of the
    fixed keys are made once, as attributes: every read and flush asks for them."""

    namespace: str
    tag: str = ""
    """The hash tag of the keys: the namespace (shard 0, or an unsharded namespace) when empty."""

    root: str = field(init=False, repr=False, compare=False)
    """``rs:{NS}:``, the start of every key of the namespace, of any schema version (and the ACL
    key pattern ``rs:{NS}:*``); ``rs:{NS#<s>.<salt>}:`` for shard ``s >= 1``."""
    prefix: str = field(init=False, repr=False, compare=False)
    """``rs:{NS}:v<schema>:``, the start of every key holding data of this schema version."""
    meta: str = field(init=False, repr=False, compare=False)
    """Hash: ``schema`` version, ``_v`` catalogue version, ``m:<metric>`` -> spec JSON."""
    engines: str = field(init=False, repr=False, compare=False)
    """Sorted set: engine index -> last heartbeat (server time, ms)."""
    writers: str = field(init=False, repr=False, compare=False)
    """Sorted set: writer id -> last heartbeat (server time, ms; negative once closed)."""
    seq: str = field(init=False, repr=False, compare=False)
    """Hash: writer id -> last applied flush sequence number."""
    claims: str = field(init=False, repr=False, compare=False)
    """Hash: engine -> ``<owner>|<ms>``, the instance that last claimed the engine."""
    conflicts: str = field(init=False, repr=False, compare=False)
    """Hash: engine -> ``<owner a>|<owner b>|<ms>``, when two live instances claimed it."""
    load: str = field(init=False, repr=False, compare=False)
    """Hash: ``<engine>|<writer>`` -> that writer's load entry for the engine (the router
    feed's fields; see redis_stats/load.py)."""
    leader: str = field(init=False, repr=False, compare=False)
    """String with a TTL: the holder of the log lease and its fencing token (shard 0's)."""
    leader_epoch: str = field(init=False, repr=False, compare=False)
    """Integer: the last fencing token handed out with the log lease."""
    gc_lock: str = field(init=False, repr=False, compare=False)
    """String with a TTL: the process currently collecting garbage."""
    bookings: str = field(init=False, repr=False, compare=False)
    """Hash: ``<request id>`` -> ``<engine>|<ends ms>|<router>``, a router's booking of a request
    on an engine of this shard not yet confirmed by the engine's front end (redis_stats.bookings)."""
    routers: str = field(init=False, repr=False, compare=False)
    """Zset: router id -> the end of its lease (server ms): its bookings count until then."""
    bridges: str = field(init=False, repr=False, compare=False)
    """Hash: ``<owner digest>|<writer id>`` -> a bridge writer's handover record (JSON: what
    the writers before it held of its source; redis_stats/integrations/bridge/handover.py)."""

    def __post_init__(self) -> None:
        root = f"rs:{{{self.tag or self.namespace}}}:"
        prefix = f"{root}v{SCHEMA_VERSION}:"
        names = {"root": root, "prefix": prefix, "leader": root + "leader"}
        names |= {"leader_epoch": root + "leader_epoch", "gc_lock": root + "gc"}
        kept: tuple[str, ...] = ("meta", "engines", "writers", "seq", "claims", "conflicts", "load")
        kept += ("bridges", "bookings", "routers")
        names |= {k: prefix + k for k in kept}
        for name, value in names.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    def all_shards(self, shard_counts: Iterable[int]) -> list[Keys]:
        """The keys of every shard of the namespace split with any K in *shard_counts*: shard 0
        (these keys) first, then shards 1..K-1 of each K (a K changed leaves data under the old
        tags), each shard once."""
        out = [self]
        for k in sorted(set(shard_counts) - {1}):
            out += [self.shard(s, k) for s in range(1, k)]
        # Two K may give a shard the same tag (shard 1 of K=47 and of K=48 of "ns-0": the salts
        # nearest two targets a few slots apart): those keys are one shard, read (and gc'd) once.
        return list(dict.fromkeys(out))

    def shard(self, shard: int, shards: int) -> Keys:
        """The keys of *shard* of this namespace split into *shards* (shard 0: these keys)."""
        return self if shard == 0 else Keys(self.namespace, shard_tag(self.namespace, shard, shards))

    def usage(self, name: str) -> str:
        """A key of the usage ledger (docs/usage.md): ``<prefix>u:<name>``."""
        return f"{self.prefix}u:{name}"

    def usage_fixed(self) -> list[str]:
        """The usage ledger's keys of fixed names (its bucket keys expire by themselves):
        KEYS[1..7] of ``usage.lua``, in that order."""
        return [self.usage(x) for x in USAGE_FIXED]

    def writer_stats(self, writer_id: str) -> str:
        """Hash: one writer's self-metrics (flushes, errors, drops, flush durations, ...)."""
        return f"{self.prefix}w:{writer_id}"

    def counters(self, engine: int | str) -> str:
        """Hash: the series of one engine: each writer's chunks (counters, histograms, gauges)
        and the base fields gc folded departed writers into."""
        return f"{self.prefix}e:{engine}:c"

    def base(self, engine: int | str) -> str:
        """Hash: the totals of one engine's departed writers, by series field (``<series>`` ->
        the total, folded in by gc; no writer writes it), apart from the writers' chunks so
        that a read of an engine's chunk fields alone (the load feed) never reads them."""
        return f"{self.prefix}e:{engine}:b"

    def gauges(self, engine: int | str) -> str:
        """Hash: gauges of one engine in schema 1 (schema 2 keeps them in the writers' chunks;
        gc still removes this key with its engine)."""
        return f"{self.prefix}e:{engine}:g"
