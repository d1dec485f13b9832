"""`redis-stats inspect` on a sharded namespace: each shard is named by its place in each split
(K, s), not by its position in the list, and a slot no Cluster node serves is said, not a crash."""

from __future__ import annotations

from typing import Any

from redis.crc import key_slot
from redis.exceptions import SlotNotCoveredError

from redis_stats import StatsConfig, StatsWriter
from redis_stats.keys import Keys
from redis_stats.ops import inspection
from tests.conftest import sample_catalog


class _Node:
    host, port = "10.0.0.9", 7001


class _ClusterView:
    """The real client, seen as a Cluster whose node for one slot is missing."""

    def __init__(self, client: Any, unserved: str) -> None:
        self._client, self._unserved = client, unserved

    def get_node_from_key(self, key: str) -> _Node:
        # As redis-py's RedisCluster does for a slot no node serves (it returns None only for a
        # replica asked of a slot without one): the stand-in that returned None hid the crash.
        if key == self._unserved:
            raise SlotNotCoveredError(f'Slot "{key_slot(key.encode())}" is not covered by the cluster.')
        return _Node()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_inspect_names_each_shard_by_k_and_s_and_says_no_node(redis_server, namespace, monkeypatch):
    keys = Keys(namespace)
    writers = []
    for k in (2, 3):  # a K changed: shard 0 lists both
        cfg = StatsConfig(url=redis_server.url, namespace=namespace, shards=k)
        w = StatsWriter(cfg, sample_catalog(), engines=[0, 1, 2], start=False, role=f"k{k}")
        w.counter("tokens").labels(engine=2).inc(1)
        assert w.flush()
        writers.append(w)
    unserved = keys.shard(2, 3)
    real = inspection.make_client
    monkeypatch.setattr(inspection, "make_client", lambda c: _ClusterView(real(c), unserved.seq))
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    lines = list(inspection.inspect_namespace(cfg, sample_catalog()))
    text = "\n".join(lines)
    assert "  shards: 4 (K = 2, 3; engine e in shard e % K)" in lines, text
    by_label = {line.split(":", 1)[0].strip(): line for line in lines if line.startswith("    shard ")}
    assert set(by_label) == {"shard 0 (every K)", "shard 1 of K=2", "shard 1 of K=3", "shard 2 of K=3"}, text
    for label, (s, k) in {
        "shard 1 of K=2": (1, 2),
        "shard 1 of K=3": (1, 3),
        "shard 2 of K=3": (2, 3),
    }.items():
        assert f"keys {keys.shard(s, k).prefix}*" in by_label[label], text
    assert by_label["shard 2 of K=3"].endswith(", no node"), text
    assert by_label["shard 1 of K=3"].endswith(", on 10.0.0.9:7001"), text
    for w in writers:
        w._closed = True
