"""The load feed (``/load``, ``StatsReader.load``, redis_stats/load.py): what a router reads, how
fresh, how cheap, and that it agrees with ``/snapshot`` about who is up."""

from __future__ import annotations

import gzip
import http.client
import json
import sys
import threading
import time
from importlib.resources import files

import jsonschema
import pytest
import redis

from redis_stats import Catalog, StatsConfig, StatsReader, StatsWriter
from redis_stats.aio import AsyncStatsReader
from redis_stats.keys import Keys
from redis_stats.load import LoadMap, LoadSource, decode_entry
from redis_stats.ops.retention import collect_garbage
from redis_stats.reader import EngineSlice
from redis_stats.server import Exporter
from tests.conftest import ROOT, scripted_client
from tests.probes import until
from tests.server import states

pytestmark = pytest.mark.redis_server

SCHEMA = json.loads((files("redis_stats") / "schemas" / "load.schema.json").read_text())

LOAD = LoadMap(
    requests_running=LoadSource("running"),
    requests_waiting=LoadSource("waiting"),
    kv_cache_usage=LoadSource("kv"),
    kv_cache_capacity_tokens=LoadSource("cache_info", ("blocks", "block_size")),
    prompt_tokens_per_second=LoadSource("prompt"),
    generation_tokens_per_second=LoadSource("gen"),
)


def catalog() -> Catalog:
    cat = Catalog()
    cat.gauge("running", "Requests running.", labels=["model"])
    cat.gauge("waiting", "Requests waiting.", labels=["model"])
    cat.gauge("kv", "KV usage.", labels=["model"])
    cat.gauge("cache_info", "Cache config.", labels=["blocks", "block_size"])
    cat.counter("prompt", "Prompt tokens.", labels=["model"])
    cat.counter("gen", "Generation tokens.", labels=["model"])
    # a big catalogue the feed must not read: many series per engine
    cat.counter("other", "Something else.", labels=["k"])
    return cat


def record(writer: StatsWriter, engine: int, running: float, waiting: float, kv: float) -> None:
    writer.metric("running").labels(engine, model="m").set(running)
    writer.metric("waiting").labels(engine, model="m").set(waiting)
    writer.metric("kv").labels(engine, model="m").set(kv)
    writer.metric("cache_info").labels(engine, blocks="1000", block_size="16").set(1)


@pytest.fixture
def cfg(redis_server, namespace) -> StatsConfig:
    return StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.1, stale_after=5.0)


def test_each_engine_and_the_fleet_as_the_writers_recorded_them(cfg):
    a = StatsWriter(cfg, catalog(), engines=[0, 1, 2], start=False, role="a", load=LOAD)
    b = StatsWriter(cfg, catalog(), engines=[0], start=False, role="b", load=LOAD)
    before_bind = time.monotonic()
    record(a, 0, 5, 1, 0.25)  # a's rates of engine 0 count from here (its first series of it)
    after_bind = time.monotonic()
    record(a, 1, 7, 3, 0.5)
    record(a, 2, 1, 0, 0.75)
    time.sleep(0.01)
    record(b, 0, 6, 2, 0.30)  # newer: mostrecent wins over a's values of engine 0
    gen_a, gen_b = a.metric("gen").labels(0, model="m"), b.metric("gen").labels(0, model="m")
    for _ in range(5):
        gen_a.inc(100)
        gen_b.inc(50)
        time.sleep(0.02)
    for k in range(200):
        a.metric("other").labels(0, k=str(k)).inc(1)
    before_flush = time.monotonic()
    assert a.flush()
    after_flush = time.monotonic()
    slowest_a, fastest_a = 500 / (after_flush - before_bind), 500 / (before_flush - after_bind)
    only_a = StatsReader(cfg).load().engines[0].generation_tokens_per_second
    assert slowest_a <= only_a <= fastest_a
    # (a gauge's stamp is in the server's clock once the writer's first flush was answered:
    # the second entry of each writer carries it, and the newer value wins)
    assert b.flush() and a.flush() and b.flush()
    view = StatsReader(cfg).load()
    e0, e1 = view.engines[0], view.engines[1]
    assert (e0.requests_running, e0.requests_waiting, e0.kv_cache_usage) == (6, 2, 0.30)
    assert (e1.requests_running, e1.requests_waiting, e1.kv_cache_usage) == (7, 3, 0.5)
    assert e0.kv_cache_capacity_tokens == 16_000
    assert e0.writers == 2 and e1.writers == 1
    # the two writers' rates (as each stored it) add up
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    stored = client.hgetall(a.keys.load)
    client.close()
    rates = [decode_entry(stored[f"0|{w.writer_id}"]).values[5] for w in (a, b)]
    assert all(r > 250 / (time.monotonic() - before_bind) for r in rates)
    assert e0.generation_tokens_per_second == sum(rates)
    assert e1.generation_tokens_per_second is None  # no counter of engine 1 was bound
    fleet = view.fleet()
    assert fleet["engines"] == fleet["engines_up"] == 3
    assert fleet["requests_running"] == {"sum": 14, "mean": 4.667, "max": 7, "engines": 3}
    assert fleet["kv_cache_usage"]["max"] == 0.75
    doc = view.to_dict(namespace=cfg.namespace)
    jsonschema.validate(doc, SCHEMA)
    assert doc["schema_version"] == 1
    for w in (a, b):
        w.close()


def test_the_feed_never_reads_the_engines_series(cfg):
    w = StatsWriter(cfg, catalog(), engines=[0], start=False, load=LOAD)
    record(w, 0, 1, 1, 0.1)
    for k in range(2000):
        w.metric("other").labels(0, k=f"series-{k:05d}").inc(k)
    assert w.flush()
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    stored = sum(len(k) + len(v) for k, v in client.hgetall(Keys(cfg.namespace).counters(0)).items())
    assert stored > 40_000
    for scripted in (False, True):  # the transaction read, and read.lua (a Cluster, over maxmemory)
        reader = StatsReader(cfg, client=scripted_client(cfg.url) if scripted else None)
        reader.load()  # planned, as a running feed is

        def sent() -> int:
            return int(client.info("stats")["total_net_output_bytes"])

        first, second = sent(), sent()  # what one INFO reply costs, to take away
        view = reader.load()
        size = sent() - second - (second - first)
        assert view.engines[0].requests_running == 1
        assert size * 10 < stored, (scripted, size, stored)  # the field names, never the values
    client.close()
    w.close()


def test_the_feed_reads_no_more_once_gc_folded_a_departed_writer(cfg):
    """gc folds a departed writer's totals into base fields: into the engine's hash itself, the
    load feed's read of its field names read every series name of it (16x the bytes at vLLM's
    catalogue after one restart); in the engine's base hash, the feed never reads them."""
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    short = cfg.replace(retention=2.0, stale_after=0.5, flush_interval=0.1)
    old = StatsWriter(short, catalog(), engines=[0], start=False, role="old", load=LOAD)
    new = StatsWriter(short, catalog(), engines=[0], start=False, role="new", load=LOAD)
    for w in (old, new):
        record(w, 0, 1, 1, 0.1)
        for k in range(500):
            w.metric("other").labels(0, k=f"series-{k:05d}").inc(k)
        assert w.flush()
    reader = StatsReader(cfg)
    reader.load()

    def read_bytes() -> int:
        first = int(client.info("stats")["total_net_output_bytes"])
        second = int(client.info("stats")["total_net_output_bytes"])
        reader.load()
        return int(client.info("stats")["total_net_output_bytes"]) - second - (second - first)

    before = read_bytes()
    old._closed = True  # gone: gc folds it once past the retention
    time.sleep(2.2)
    assert new.flush()
    assert old.writer_id in collect_garbage(short, client=client).writers
    assert StatsReader(cfg, catalog()).snapshot().engines[0].counter("other", "series-00499") == 2 * 499
    replanned = read_bytes()  # the read after a writer left reads twice: its plan named two
    after = read_bytes()
    assert after < before + 200, (before, replanned, after)  # one writer's chunks fewer, no base field names
    client.close()
    new.close()


def test_load_and_snapshot_agree_about_who_is_up(cfg):
    live = StatsWriter(cfg, catalog(), engines=[0], start=False, role="live", load=LOAD)
    closing = StatsWriter(cfg, catalog(), engines=[1], start=False, role="closing", load=LOAD)
    short = StatsConfig(url=cfg.url, namespace=cfg.namespace, flush_interval=0.05, stale_after=0.2)
    silent = StatsWriter(short, catalog(), engines=[2], start=False, role="silent", load=LOAD)
    for e, w in ((0, live), (1, closing), (2, silent)):
        record(w, e, e + 1, 0, 0.5)
        assert w.flush()
    closing.close()  # cleanly: down at once, its entries gone
    time.sleep(0.4)  # the silent writer's own stale_after (0.2 s) has passed; live's 5 s not
    reader = StatsReader(cfg, catalog())
    view, snap = reader.load(), reader.snapshot()
    assert {e: v.up for e, v in view.engines.items()} == {e: s.up for e, s in snap.engines.items()}
    assert [view.engines[e].up for e in (0, 1, 2)] == [True, False, False]
    assert view.engines[0].requests_running == 1
    assert view.engines[1].requests_running is None and view.engines[2].requests_running is None
    assert view.fleet()["requests_running"]["sum"] == 1
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    assert not any(f.endswith(closing.writer_id) for f in client.hkeys(reader.keys.load))
    client.close()
    live.close()
    silent._closed = True


def test_gc_deletes_the_entries_of_writers_it_removes_and_of_writers_gone(cfg):
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    w = StatsWriter(cfg, catalog(), engines=[0], start=False, load=LOAD)
    paused = StatsWriter(cfg, catalog(), engines=[1], start=False, load=LOAD)
    record(w, 0, 1, 0, 0.1)
    record(paused, 1, 2, 0, 0.1)
    assert w.flush() and paused.flush()
    keys = w.keys
    for n in range(6):  # entries of writers gc removed before (not in the writers zset any more)
        client.hset(keys.load, f"{n}|gone-{n}", "1,1,2,0,1,1,1,1,1,1")
    client.zadd(keys.writers, {paused.writer_id: 1})  # silent since 1970: past any retention
    result = collect_garbage(cfg)
    assert result.writers == [paused.writer_id]
    assert client.hkeys(keys.load) == [f"0|{w.writer_id}"]
    assert StatsReader(cfg).load().engines[0].requests_running == 1
    client.close()
    w.close()
    paused._closed = True


def test_the_load_entries_travel_in_the_flush_one_script_call_per_flush(cfg):
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    w = StatsWriter(cfg, catalog(), engines=[0], start=False, load=LOAD)
    record(w, 0, 1, 0, 0.1)
    assert w.flush()  # the script is loaded now
    client.config_resetstat()
    for running in range(2, 7):
        record(w, 0, running, 0, 0.1)
        assert w.flush()
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] == 5
    assert StatsReader(cfg).load().engines[0].requests_running == 6
    client.close()
    w.close()


def test_a_writer_of_5000_engines_stores_and_deletes_every_entry(cfg):
    # More entries than one unpack() takes (8,000 values): the script stores (and deletes) them in parts.
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    w = StatsWriter(cfg, catalog(), engines=list(range(5000)), start=False, load=LOAD)
    for e in range(5000):
        record(w, e, e, 0, 0.1)
    assert w.flush() and not w.stats.errors
    view = StatsReader(cfg).load()
    assert [view.engines[e].requests_running for e in (0, 777, 4999)] == [0, 777, 4999]
    assert client.hlen(w.keys.load) == 5000
    assert w.close()
    assert client.hlen(w.keys.load) == 0
    client.close()


def test_a_bad_entry_or_a_wrong_typed_load_hash_costs_itself_only(cfg):
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    w = StatsWriter(cfg, catalog(), engines=[0, 1], start=False, load=LOAD)
    record(w, 0, 4, 0, 0.1)
    record(w, 1, 5, 0, 0.1)
    assert w.flush()
    client.hset(w.keys.load, f"1|{w.writer_id}", "garbage")
    client.hset(w.keys.load, "x|y", "9|1|0|mmmm||||||")
    view = StatsReader(cfg).load()
    assert view.engines[0].requests_running == 4
    assert view.engines[1].requests_running is None
    assert view.skipped == {"bad_entry": 2}
    client.delete(w.keys.load)
    client.set(w.keys.load, "a string")
    view = StatsReader(cfg).load()
    assert view.skipped == {"wrong_type": 1} and view.engines[0].up
    assert w.flush()  # the flush is not refused for the load hash; the load call is, and counted
    assert w.stats.errors.get("load_response", 0) >= 1
    client.delete(w.keys.load)
    client.close()
    w.close()


def _get(port: int, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        resp = conn.getresponse()
        return resp.status, dict(resp.headers), resp.read()
    finally:
        conn.close()


def test_http_etag_304_gzip_and_slices(cfg):
    w = StatsWriter(cfg, catalog(), engines=[0, 1, 2, 3], start=False, load=LOAD)
    for e in range(4):
        record(w, e, e, 0, 0.1)
    assert w.flush()
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05).start()
    try:
        status, headers, body = _get(exporter.port, "/load", Accept_Encoding="gzip")
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        doc = json.loads(gzip.decompress(body))
        jsonschema.validate(doc, SCHEMA)
        etag = headers["ETag"]
        assert etag.startswith('W/"')
        time.sleep(0.2)  # refreshes ran; nothing changed
        status, headers, body = _get(exporter.port, "/load", If_None_Match=etag)
        assert status == 304 and body == b"" and headers["ETag"] == etag
        assert float(headers["X-Load-Refreshed"]) > doc["time"]
        record(w, 2, 9, 4, 0.9)
        assert w.flush()
        time.sleep(0.2)
        status, headers, body = _get(exporter.port, "/load", If_None_Match=etag)
        assert status == 200 and headers["ETag"] != etag
        assert json.loads(body)["engines"]["2"]["requests_waiting"] == 4
        status, _, body = _get(exporter.port, "/load?slice=1/2")
        assert status == 200 and sorted(json.loads(body)["engines"]) == ["1", "3"]
        assert _get(exporter.port, "/load?slice=2/2")[0] == 400
    finally:
        exporter.close()
        w.close()


def test_requests_never_wait_for_redis(cfg):
    # One refresher reads; a request is answered from the body it built, even while Redis hangs.
    w = StatsWriter(cfg, catalog(), engines=[0], start=False, load=LOAD)
    record(w, 0, 1, 0, 0.1)
    assert w.flush()
    reader = StatsReader(cfg)
    exporter = Exporter(reader, port=0, load_refresh=0.05).start()
    try:
        assert _get(exporter.port, "/load")[0] == 200
        reads = []
        real = reader.load

        def slow(*args, **kwargs):
            reads.append(1)
            time.sleep(0.5)
            return real(*args, **kwargs)

        reader.load = slow  # type: ignore[method-assign]
        time.sleep(0.1)
        took = []
        for _ in range(20):
            t0 = time.perf_counter()
            assert _get(exporter.port, "/load")[0] == 200
            took.append(time.perf_counter() - t0)
        assert max(took) < 0.1, took
        assert len(reads) <= 3  # one refresher, not a read per request
    finally:
        exporter.close()
        w.close()


def test_the_asyncio_reader_reads_the_same_feed(cfg):
    import asyncio

    w = StatsWriter(cfg, catalog(), engines=[0, 1], start=False, load=LOAD)
    record(w, 0, 3, 1, 0.2)
    record(w, 1, 2, 0, 0.4)
    assert w.flush()

    async def read():
        reader = AsyncStatsReader(cfg)
        try:
            return await reader.load(), await reader.load(EngineSlice(1, 2))
        finally:
            await reader.aclose()

    view, part = asyncio.run(read())

    def values(doc):  # but the ages, which move between the two reads
        return {e: {k: v for k, v in d.items() if k != "age_seconds"} for e, d in doc["engines"].items()}

    assert values(view.to_dict()) == values(StatsReader(cfg).load().to_dict())
    assert view.engines[0].requests_running == 3
    assert list(part.engines) == [1]
    w.close()


def test_the_load_interval_stores_the_load_between_flushes(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=2.0, load_interval=0.05)
    w = StatsWriter(cfg, catalog(), engines=[0], load=LOAD)
    try:
        record(w, 0, 1, 0, 0.1)
        assert w.flush()
        reader = StatsReader(cfg)
        record(w, 0, 8, 5, 0.6)
        deadline = time.monotonic() + 1.0  # well before the next flush (2 s)
        while time.monotonic() < deadline and reader.load().engines[0].requests_waiting != 5:
            time.sleep(0.02)
        assert reader.load().engines[0].requests_waiting == 5
        assert w.stats.flushes == 1, "only load.lua between two flushes"
    finally:
        w.close()


def test_the_router_example_picks_the_least_loaded_fresh_engine(cfg):
    sys.path.insert(0, str(ROOT / "docs" / "examples"))
    try:
        import load_router
    finally:
        sys.path.pop(0)
    w = StatsWriter(cfg, catalog(), engines=[0, 1, 2], start=False, load=LOAD)
    record(w, 0, 5, 3, 0.2)
    record(w, 1, 5, 1, 0.9)
    record(w, 2, 5, 1, 0.4)
    assert w.flush()
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05).start()
    try:
        client = load_router.LoadClient(exporter.url)
        doc = client.poll()
        assert load_router.pick(doc, client.refreshed) == 2  # fewest waiting, then lowest KV
        client.poll()
        assert client.not_modified == 1
        record(w, 2, 5, 6, 0.4)
        assert w.flush()
        time.sleep(0.2)
        assert load_router.pick(client.poll(), client.refreshed) == 1
        # an engine whose data is older than the router's limit is not picked
        assert load_router.pick(client.doc, client.refreshed + 60, stale=2.0) is None
    finally:
        exporter.close()
        w.close()


def test_concurrent_requests_see_whole_bodies(cfg):
    w = StatsWriter(cfg, catalog(), engines=list(range(8)), start=False, load=LOAD)
    for e in range(8):
        record(w, e, e, 0, 0.1)
    assert w.flush()
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.01).start()
    bad: list[object] = []

    def poll():
        for _ in range(30):
            status, _, body = _get(exporter.port, "/load")
            doc = json.loads(body)
            if status != 200 or len(doc["engines"]) != 8:
                bad.append((status, doc))

    try:
        threads = [threading.Thread(target=poll) for _ in range(6)]
        for t in threads:
            t.start()
        for e in range(30):
            record(w, e % 8, e, e % 3, 0.1)
            w.flush()
        for t in threads:
            t.join()
        assert not bad
    finally:
        exporter.close()
        w.close()


def test_the_documented_acl_rules_carry_the_feed_and_older_writer_rules_only_lose_it(namespace):
    from redis_stats.tools.embedded import EmbeddedRedis
    from tests import acl

    server = EmbeddedRedis().start()
    try:
        admin = redis.Redis(port=server.port, decode_responses=True)
        old = acl.WRITER.replace(" +hdel", "")
        for user, commands, read_only in (
            ("w", acl.WRITER, False),
            ("old", old, False),
            ("r", acl.READER, True),
        ):
            admin.execute_command(
                "ACL", "SETUSER", user, *acl.rules(namespace, "pw", commands, read_only=read_only)
            )
        url = f"redis://{{}}:pw@127.0.0.1:{server.port}/0"
        w = StatsWriter(
            StatsConfig(url=url.format("w"), namespace=namespace),
            catalog(),
            engines=[0],
            start=False,
            load=LOAD,
        )
        o = StatsWriter(
            StatsConfig(url=url.format("old"), namespace=namespace),
            catalog(),
            engines=[1],
            start=False,
            load=LOAD,
        )
        record(w, 0, 3, 0, 0.1)
        record(o, 1, 4, 0, 0.1)
        for _ in range(3):
            assert w.flush() and o.flush()
        assert not any(k.startswith("load_") for k in [*w.stats.errors, *o.stats.errors])
        reader = StatsReader(StatsConfig(url=url.format("r"), namespace=namespace))
        view = reader.load()
        assert view.engines[0].requests_running == 3 and view.engines[1].requests_running == 4
        # The older rules lack HDEL: the closing writer's entries stay (counted), never counted
        # by a reader (the writer closed: its engine is down at once)
        o.close()
        assert o.stats.errors["load_noperm"] == 1  # a script's NOPERM, however the server words it
        view = reader.load()
        assert not view.engines[1].up and view.engines[1].requests_running is None
        assert view.engines[0].requests_running == 3
        admin.close()
        w.close()
    finally:
        server.close()


@pytest.mark.slow
def test_on_a_cluster_with_three_shards_one_round_trip_per_shard(namespace):
    # The load entries in each shard's flush, and load_read.lua on each
    # shard's node (the Cluster's read path), with the liveness rule's per-shard writers.
    from tests.servers import Cluster

    cluster = Cluster().start()
    try:
        cfg = StatsConfig(url=cluster.url, namespace=namespace, shards=3, flush_interval=0.1)
        writers = [
            StatsWriter(cfg, catalog(), engines=[e], start=False, role=f"api{e}", load=LOAD) for e in range(6)
        ]
        for e, w in enumerate(writers):
            record(w, e, e + 1, e, 0.1 * e)
            assert w.flush() and w.flush()
            assert not any(k.startswith("load_") for k in w.stats.errors), w.stats.errors
        view = StatsReader(cfg).load()
        assert {e: v.requests_running for e, v in view.engines.items()} == {e: e + 1 for e in range(6)}
        assert all(v.up for v in view.engines.values())
        writers[4].close()
        view = StatsReader(cfg).load()
        assert not view.engines[4].up and view.engines[5].up
        for w in writers[:4] + writers[5:]:
            w.close()
    finally:
        cluster.close()


# -- a view that cannot be refreshed says so; a refresher nobody asks for stops (issues 32, 35) ----


def test_a_refresh_that_raises_answers_503_with_why_and_the_refresher_goes_on(cfg, monkeypatch):
    # Two finite values once overflowed the fleet sum in the refresh, outside its try: the thread
    # died and /load served its last body as 200 for ever. Any exception of a refresh now answers
    # 503 saying why, is counted, and the next good refresh brings the 200 back.
    from redis_stats.load import LoadView

    w = StatsWriter(cfg, catalog(), engines=[0], start=False, load=LOAD)
    record(w, 0, 1, 0, 0.1)
    assert w.flush()
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05, self_metrics=True).start()
    real = LoadView.to_dict
    try:
        status, _, body = _get(exporter.port, "/load")
        assert status == 200
        line = 'redis_stats_background_errors_total{kind="OverflowError",thread="load"} '

        def overflows() -> float:
            text = _get(exporter.port, "/metrics")[2].decode()
            return sum(float(x[len(line) :]) for x in text.splitlines() if x.startswith(line))

        before = overflows()

        def overflowing(self, **kwargs):
            raise OverflowError("math range error")

        monkeypatch.setattr(LoadView, "to_dict", overflowing)
        record(w, 0, 2, 0, 0.1)  # a new value: the refresh builds a new body, and fails
        assert w.flush()
        assert until(lambda: _get(exporter.port, "/load")[0] == 503)
        status, headers, body = _get(exporter.port, "/load")
        assert status == 503 and "ETag" not in headers
        assert json.loads(body) == {"feed": "unknown", "error": "other", "detail": "math range error"}
        assert overflows() > before  # counted, and shown in the exporter's own metrics
        monkeypatch.setattr(LoadView, "to_dict", real)
        assert until(lambda: _get(exporter.port, "/load")[0] == 200)
        assert json.loads(_get(exporter.port, "/load")[2])["engines"]["0"]["requests_running"] == 2
    finally:
        monkeypatch.setattr(LoadView, "to_dict", real)
        exporter.close()
        w.close()


def test_a_refresh_stuck_on_redis_answers_503_with_its_age_then_recovers(cfg):
    w = StatsWriter(cfg, catalog(), engines=[0], start=False, load=LOAD)
    record(w, 0, 1, 0, 0.1)
    assert w.flush()
    reader = StatsReader(cfg)
    exporter = Exporter(reader, port=0, load_refresh=0.05).start()
    feed = states.load_feed(exporter)
    feed.max_age = 0.5  # (the default: 10 refreshes, at least 2 s)
    real, release = reader.load, threading.Event()
    try:
        assert _get(exporter.port, "/load")[0] == 200

        def stuck(*args, **kwargs):
            release.wait(10)
            return real(*args, **kwargs)

        reader.load = stuck  # type: ignore[method-assign]
        time.sleep(0.3)
        assert _get(exporter.port, "/load")[0] == 200  # younger than max_age: served
        assert until(lambda: _get(exporter.port, "/load")[0] == 503, timeout=3)
        status, headers, body = _get(exporter.port, "/load", If_None_Match="*")
        doc = json.loads(body)
        assert status == 503 and doc["error"] == "stale" and doc["age_seconds"] > 0.5, doc
        assert "ETag" not in headers  # never a 304 that keeps a router on the old body
        reader.load = real  # type: ignore[method-assign]
        release.set()
        assert until(lambda: _get(exporter.port, "/load")[0] == 200)
    finally:
        release.set()
        exporter.close()
        w.close()


def _calls(client: redis.Redis) -> int:
    """Commands the server ran (but INFO, which counts these)."""
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def test_a_refresher_nobody_asks_stops_and_the_next_request_waits_for_a_fresh_read(
    own_redis_server, namespace
):
    # A view's refresher used to read the whole fleet's load every 0.25 s for as long as the
    # process lived, once anything had asked it once (every vLLM pod's view is one).
    cfg = StatsConfig(url=own_redis_server.url, namespace=namespace, flush_interval=0.1, stale_after=5.0)
    w = StatsWriter(cfg, catalog(), engines=[0], start=False, load=LOAD)
    record(w, 0, 1, 0, 0.1)
    assert w.flush()
    client = redis.Redis.from_url(cfg.url, decode_responses=True)
    exporter = Exporter(StatsReader(cfg), port=0, load_refresh=0.05).start()
    feed = states.load_feed(exporter)
    feed.idle = 0.5  # (the default: 60 s)
    try:
        first = json.loads(_get(exporter.port, "/load")[2])
        start = _calls(client)
        time.sleep(0.3)
        assert _calls(client) - start >= 3  # asked: it refreshes every 0.05 s
        time.sleep(0.5 + 0.2)  # nobody asks for longer than idle
        idle = _calls(client)
        time.sleep(0.5)
        assert _calls(client) == idle  # no read at all
        assert not feed.running
        record(w, 0, 4, 0, 0.1)
        assert w.flush()
        status, _, body = _get(exporter.port, "/load")
        again = json.loads(body)
        # the first request after idling waited for one fresh read
        assert status == 200 and again["engines"]["0"]["requests_running"] == 4
        assert again["time"] > first["time"] + 0.5
        assert feed.running
        time.sleep(0.3)
        assert _calls(client) - idle >= 4  # and the refresher runs again
    finally:
        exporter.close()
        client.close()
        w.close()


def test_sums_past_the_float_range_are_written_as_the_largest_float(cfg):
    """Issue 32: two engines at 1.7e308 (a value set() takes) overflowed math.fsum in the fleet
    sum, and StatsReader.load().to_dict() raised OverflowError (the /load refresher died of it).
    A sum past the float range is +inf, written as the largest float of its sign (the schema
    promises a number); the mean and the max of finite values stay exact; the rest is untouched."""
    big = 1.7e308
    a = StatsWriter(cfg, catalog(), engines=[0, 1, 2], start=False, role="a", load=LOAD)
    record(a, 0, big, -big, 0.25)
    record(a, 1, big, -big, 0.5)
    record(a, 2, 3, 1, 0.75)
    assert a.flush()
    view = StatsReader(cfg).load()
    doc = view.to_dict(namespace=cfg.namespace)
    jsonschema.validate(doc, SCHEMA)
    json.loads(json.dumps(doc, allow_nan=False))  # strict JSON, as /load sends it
    fleet = doc["fleet"]
    running, waiting = fleet["requests_running"], fleet["requests_waiting"]
    assert (running["sum"], running["max"], running["engines"]) == (sys.float_info.max, big, 3)
    assert running["mean"] == pytest.approx(big / 3 * 2, rel=1e-12)
    assert (waiting["sum"], waiting["max"]) == (-sys.float_info.max, 1)
    assert waiting["mean"] == pytest.approx(-big / 3 * 2, rel=1e-12)
    assert fleet["kv_cache_usage"] == {"sum": 1.5, "mean": 0.5, "max": 0.75, "engines": 3}
    assert doc["engines"]["0"]["requests_running"] == big and doc["engines"]["2"]["requests_running"] == 3
    a.close()
