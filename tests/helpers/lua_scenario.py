"""One run of every script's number paths on fakeredis, under the Lua runtime its environment
chose (``FAKEREDIS_LUA_VERSION``, read when fakeredis is imported), printed as one JSON document
(every key of the namespace, a snapshot read with ``read.lua`` and with the transaction, the
``/metrics`` text) with the server's clock taken out: two runs under Lua 5.1 and 5.4 must print
the same (tests/scripts/test_lua_versions.py).

With ``FAKE_SERVER_TYPE=dragonfly`` the fake server answers as Dragonfly does, refusing keys a
script did not declare (tests/dragonfly.py); the document then also lists every such access
(``undeclared``, none expected) and what the guard answers a script that reads a key it did
not declare (``guard``: it must refuse it, or the lane proves nothing).

Usage: FAKEREDIS_LUA_VERSION=5.4 [FAKE_SERVER_TYPE=dragonfly] python -m tests.helpers.lua_scenario
"""

from __future__ import annotations

import json
import re
from typing import Any

import fakeredis

from redis_stats import RedisCollector, StatsConfig, StatsReader, StatsWriter
from redis_stats.keys import Keys
from redis_stats.ops.retention import collect_garbage
from tests import dragonfly
from tests.conftest import sample_catalog

# A server time in ms a script wrote (13 digits: T), or a gauge stamp the writer wrote in Python
# (with decimals: T.f); a script that printed a time as a float ("...345.0") shows as T.f.
_CLOCK = re.compile(r"(?<![\d.])1\d{12}(\.\d+)?(?!\d)")


class _Scripted(fakeredis.FakeRedis):
    """Taken for a Cluster's client by readers: every read is ``read.lua``."""

    def get_node_from_key(self, key: str, replica: bool = False) -> None:
        return None


def _dump(client: Any, keys: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(keys):
        kind = client.type(key)
        if kind == "hash":  # without the flush durations a writer measured (they vary by run)
            out[key] = {f: v for f, v in sorted(client.hgetall(key).items()) if not f.startswith("dur")}
        elif kind == "zset":
            out[key] = [m for m, _score in client.zrange(key, 0, -1, withscores=True)]
        else:
            out[key] = client.get(key)
    return out


def main() -> None:
    server = fakeredis.FakeServer(server_type=dragonfly.SERVER_TYPE)
    if dragonfly.SERVER_TYPE == "dragonfly":
        dragonfly.strict_keys()

    def client(cls: type = fakeredis.FakeRedis) -> Any:
        return cls(server=server, decode_responses=True)

    ns = "lua"
    cfg = StatsConfig(url="redis://127.0.0.1:1/0", namespace=ns, max_series_per_metric=100_000)
    cat = sample_catalog()
    a = StatsWriter(cfg, cat, engines=[0, 1], writer_id="node:1:a", owner="o1", client=client(), start=False)
    b = StatsWriter(cfg, cat, engines=[1], writer_id="node:2:b", client=client(), start=False)
    c = StatsWriter(cfg, cat, engines=[1], writer_id="node:3:c", client=client(), start=False)
    for w, n in ((a, 1), (b, 2), (c, 3)):
        w.counter("tokens").labels(engine=1).inc(2**53 + n)
        w.counter("requests").labels(engine=1, reason="stop").inc(3 * n)
        w.histogram("latency_seconds").labels(engine=1).observe(0.3 * n)
        w.histogram("latency_seconds").labels(engine=1).observe(7.0)
        w.gauge("inflight").labels(engine=1).set(1.5 * n)
        w.gauge("peak").labels(engine=1).set(n)
        assert w.flush()
    for e in range(200):  # a flush in parts: 200 engines x 30 series
        for i in range(30):
            a.counter("requests").labels(engine=e, reason=f"r{i}").inc(e + i + 0.5 * (i % 2))
    assert a.flush() and not a.pending()
    # b goes silent for longer than the retention: gc folds its totals into the base fields
    # (HINCRBY, and a histogram added bucket by bucket with string.format).
    raw = client()
    keys = Keys(ns)
    now_ms = int(raw.time()[0]) * 1000
    raw.zadd(keys.writers, {"node:2:b": now_ms - 3 * 86_400_000})
    b._closed = True
    gc = collect_garbage(cfg, client=client())
    # Then c: its totals added to the base fields b left (a float sum with %.17g, counts with %d).
    raw.zadd(keys.writers, {"node:3:c": now_ms - 3 * 86_400_000})
    c._closed = True
    gc2 = collect_garbage(cfg, client=client())
    a.counter("tokens").labels(engine=1).inc(1)
    assert a.flush()
    scripted = StatsReader(cfg, cat, client=client(_Scripted)).snapshot().to_dict()["engines"]
    plain_reader = StatsReader(cfg, cat, client=client())
    plain = plain_reader.snapshot().to_dict()["engines"]
    text = RedisCollector(plain_reader).render_text()
    text = text.decode() if isinstance(text, bytes) else text
    a.close()
    doc = {
        "keys": _dump(raw, raw.keys(f"rs:{{{ns}}}:*")),
        "gc": [[r.engines, r.writers, r.folded, r.unfolded, r.failed] for r in (gc, gc2)],
        "scripted": _series(scripted),
        "plain": _series(plain),
        # The series, not the self-metrics (durations, ages: they vary by run).
        "text": [line for line in text.splitlines() if not line.startswith(("redis_stats_", "# "))],
    }
    if dragonfly.SERVER_TYPE == "dragonfly":
        doc["undeclared"] = [[cmd, key.decode()] for cmd, key in dragonfly.take_undeclared()]
        try:
            raw.eval("return redis.call('HGET', KEYS[1] .. 'x', 'f')", 1, keys.meta)
            doc["guard"] = "not refused"
        except Exception as exc:
            doc["guard"] = str(exc)
    print(json.dumps(_clockless(doc), sort_keys=True, default=str, indent=0))


def _series(engines: dict[str, Any]) -> dict[str, Any]:
    """Each engine's series of a snapshot document (not its heartbeat and age)."""
    return {
        e: {k: v for k, v in doc.items() if k not in ("age_seconds", "heartbeat")}
        for e, doc in engines.items()
    }


def _clockless(x: Any) -> Any:
    """*x* with every server time (ms) in its texts replaced by T."""
    if isinstance(x, str):
        return _CLOCK.sub(lambda m: "T.f" if m.group(1) else "T", x)
    if isinstance(x, dict):
        return {k: _clockless(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clockless(v) for v in x]
    return x


if __name__ == "__main__":
    main()
