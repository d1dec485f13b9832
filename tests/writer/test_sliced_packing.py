"""A flush of many series leaves the client in slices (:class:`~redis_stats.writer.packing.SlicedPacker`):
the bytes redis-py would send, and every total exact through Redis."""

from __future__ import annotations

from tests.conftest import four_kinds_catalog


def test_sliced_packer_sends_the_bytes_redis_py_would():
    from redis.connection import HiredisRespSerializer

    from redis_stats.writer.packing import SlicedPacker

    big = ("EVALSHA", "f" * 40, 6, *(f"k{i}" for i in range(6)), *(f"v{i}é" for i in range(10_000)), 1.5, 7)
    for args in (big, ("SCRIPT LOAD", "return 1"), (b"SCRIPT LOAD", bytearray(b"x")), ("PING",)):
        sliced = b"".join(bytes(c) for c in SlicedPacker().pack(*args))
        assert sliced == b"".join(HiredisRespSerializer().pack(*args))


def test_a_flush_of_many_series_in_slices_is_exact(redis_server, namespace):
    from redis_stats import StatsConfig, StatsReader, StatsWriter

    cat = four_kinds_catalog()
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, max_series_per_metric=10_000)
    writer = StatsWriter(cfg, cat, engines=[0], start=False)
    for i in range(5000):  # ~80 chunk fields of ~1 KB: several slices
        writer.counter("c").labels(engine=0, i=str(i)).inc(i)
    assert writer.flush()
    writer.close()
    snap = StatsReader(cfg, cat).snapshot()
    assert sum(snap.engines[0].counters.values()) == sum(range(5000))
