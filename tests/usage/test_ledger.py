"""The usage ledger through a real server: what is recorded is read back exactly, by tenant,
adapter and model, all time and by UTC hour and day; a flush whose answer was lost is applied
once; names a client chose stay inside their field."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from redis_stats import StatsConfig, StatsWriter
from redis_stats.keys import Keys
from redis_stats.usage import Usage, UsageReader, UsageRecorder

pytestmark = pytest.mark.redis_server

T0 = 1_796_000_000 - 1_796_000_000 % 86400 + 10 * 3600  # a UTC day, 10:00


def _setup(url: str, namespace: str, shards: int = 1, now: list[float] | None = None):
    cfg = StatsConfig(url=url, namespace=namespace, shards=shards, flush_interval=0.05)
    clock = (lambda: now[0]) if now is not None else (lambda: T0 + 5.0)
    writer = StatsWriter(cfg, start=False)
    rec = UsageRecorder(writer, clock=clock)
    reader = UsageReader(cfg, clock=clock)
    return writer, rec, reader


def _use(
    tenant: str | None, model: str = "m", adapter: str | None = None, p: int = 10, g: int = 5, **kw: Any
) -> Usage:
    return Usage(tenant=tenant, adapter=adapter, model=model, prompt_tokens=p, generation_tokens=g, **kw)


@pytest.mark.parametrize("shards", [1, 3])
def test_recorded_usage_reads_back_exactly_by_tenant_adapter_and_model(redis_server, namespace, shards):
    writer, rec, reader = _setup(redis_server.url, namespace, shards)
    for i in range(50):
        rec.record(
            _use(f"t{i % 7}", adapter="lora-a" if i % 2 else None, p=i, g=2 * i, cached_prompt_tokens=i // 2)
        )
    rec.record(_use(None, outcome="abort"))
    assert writer.flush()
    acme = reader.tenant("t3")
    expected = [i for i in range(50) if i % 7 == 3]
    assert acme.total.get("requests") == len(expected)
    assert acme.total.get("prompt_tokens") == sum(expected)
    assert acme.total.get("generation_tokens") == 2 * sum(expected)
    assert acme.day == acme.total and acme.hour == acme.total
    assert reader.tenant(None).total.get("abort") == 1
    answer = reader.query(["adapter"])
    assert {r.names: r.totals.get("requests") for r in answer.rows} == {("(base)",): 26, ("lora-a",): 25}
    assert answer.total.get("prompt_tokens") == sum(range(50)) + 10
    by_tenant = reader.query(["tenant", "model"], sort="prompt_tokens", limit=2)
    assert by_tenant.count == 8 and [r.names for r in by_tenant.rows] == [("t0", "m"), ("t6", "m")]
    assert reader.query(since=T0 - 10 * 3600, until=T0 + 14 * 3600).total == answer.total  # the day bucket
    assert reader.query(since=T0, until=T0 + 3600).total == answer.total  # the hour bucket
    assert reader.query(since=T0 + 3600, until=T0 + 7200).count == 0
    top, other = reader.top(2)
    assert [t for t, _ in top] == ["t0", "t6"]
    assert sum((x for _, x in top), other) == answer.total
    writer.close()


class LosesAnswers:
    """A client whose script calls are applied but whose answers are lost (a timeout) *n* times."""

    def __init__(self, client: Any, n: int) -> None:
        self.client, self.n = client, n

    def execute_command(self, *args: Any, **kw: Any) -> Any:
        reply = self.client.execute_command(*args, **kw)
        if args[0] == "EVALSHA" and self.n > 0 and len(args) > 3 and str(args[3]).endswith("u:seq"):
            self.n -= 1
            raise redis.exceptions.TimeoutError("Timeout reading from socket")
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_flush_whose_answer_was_lost_is_applied_once(redis_server, namespace):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.05)
    real = redis.Redis.from_url(redis_server.url, decode_responses=True)
    writer = StatsWriter(cfg, start=False, client=LosesAnswers(real, 3))  # type: ignore[arg-type]
    confirmed: list[tuple[int, bool]] = []
    rec = UsageRecorder(writer, on_confirmed=lambda b, applied: confirmed.append((b.seq, applied)))
    rec.record(_use("acme", p=100, g=7))
    for _ in range(3):
        assert not writer.flush()  # applied, answer lost: kept and sent again
        rec.record(_use("acme", p=1, g=1))  # meanwhile: waits for the batch in flight
    assert writer.flush() and writer.flush()
    got = UsageReader(cfg).tenant("acme").total
    assert (got.get("requests"), got.get("prompt_tokens"), got.get("generation_tokens")) == (4, 103, 10)
    assert confirmed == [(1, False), (2, True)]
    assert rec.stats["errors:TimeoutError"] == 3
    writer.close()


HOSTILE = [
    "x" * 10_000,
    'a"b,c\nd\r\te',
    "rs:{other}:v2:u:t",
    "(none)",
    "\x00\udcff\u2028é😀",
    "'; DROP TABLE --",
    '{"tenant":"x"}',
]


def test_hostile_tenant_names_are_bounded_distinct_and_stay_in_their_namespace(redis_server, namespace):
    writer, rec, reader = _setup(redis_server.url, namespace)
    for name in HOSTILE:
        rec.record(_use(name, adapter=name, model=name))
    rec.record(_use(None))
    assert writer.flush()
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = client.keys("*")
    assert all(k.startswith(f"rs:{{{namespace}}}:") for k in keys if namespace in k)
    assert not any("other" in k for k in keys)
    rows = reader.query(["tenant", "adapter", "model"]).rows
    assert len(rows) == len(HOSTILE) + 1  # none merged with another, none with the (none) bucket
    for row in rows:
        assert all(len(n.encode()) <= 128 for n in row.names)
    assert reader.tenant(None).total.get("requests") == 1  # "(none)" sent by a client is not it
    assert reader.tenant("(none)").total.get("requests") == 1
    assert reader.tenant("x" * 10_000).total.get("requests") == 1
    json.dumps([r.names for r in rows])
    writer.close()


def test_a_writer_that_records_only_usage_flushes_quietly(redis_server, namespace, caplog):
    """A writer of no metrics (a gateway's, recording usage only) was found "behind" (no
    catalogue) by every other flush: a warning and a whole-state resend each time."""
    writer, rec, reader = _setup(redis_server.url, namespace)
    for _ in range(4):
        rec.record(_use("acme"))
        assert writer.flush()
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    assert sum(writer.stats.lost.values()) == 0
    assert reader.tenant("acme").total.get("requests") == 4
    writer.close()


def test_drop_namespace_removes_the_ledger_even_without_scan(redis_server, namespace):
    from redis_stats.ops.removal import _named_keys, remove_namespace

    writer, rec, _reader = _setup(redis_server.url, namespace)
    rec.record(_use("acme"))
    assert writer.flush()
    writer.close()
    keys = Keys(namespace)
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    named = set(_named_keys(client, keys, True))
    assert set(keys.usage_fixed()) <= named  # found by name: a user without SCAN removes them too
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)  # the writer closed: not live
    assert not remove_namespace(cfg).live_writers
    assert not client.keys(f"rs:{{{namespace}}}:*")


def test_a_close_that_gives_up_says_what_usage_it_lost(namespace, caplog):
    writer = StatsWriter(StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace), start=False)
    rec = UsageRecorder(writer)
    for _ in range(3):
        rec.record(_use("acme"))
    writer.flush()
    rec.record(_use("acme"))
    writer.close(timeout=0.3)
    assert "usage of 3 requests in 1 unconfirmed batches" in caplog.text
    assert "and of 1 more requests recorded since" in caplog.text


def test_redis_restarted_empty_is_told_and_the_next_batches_still_count_once(redis_server, namespace, caplog):
    writer, rec, reader = _setup(redis_server.url, namespace)
    rec.record(_use("acme", p=100))
    assert writer.flush()
    client = redis.Redis.from_url(redis_server.url)
    for key in client.scan_iter(match=f"rs:{{{namespace}}}:*"):
        client.delete(key)  # what a restart from nothing leaves of this namespace
    rec.record(_use("acme", p=7))
    assert writer.flush() and writer.flush()
    rec.record(_use("acme", p=1))
    assert writer.flush()
    assert rec.stats["behind"] == 1 and "had lost writer" in caplog.text
    assert reader.tenant("acme").total.get("prompt_tokens") == 8  # the lost batch is not resent


def test_a_key_of_the_wrong_type_stops_only_usage_and_says_which(redis_server, namespace, caplog):
    writer, rec, reader = _setup(redis_server.url, namespace)
    client = redis.Redis.from_url(redis_server.url)
    client.set(Keys(namespace).usage("t"), "not a hash")
    rec.record(_use("acme"))
    assert not writer.flush()
    assert rec.pending() and "is a string, not a hash; nothing was applied" in caplog.text
    assert reader.tenant("acme").total.get("requests") == 0  # read as nothing, never a failure
    assert reader.query(["model"]).total.get("requests") == 0  # nothing half applied
    client.delete(Keys(namespace).usage("t"))
    assert writer.flush() and reader.tenant("acme").total.get("requests") == 1  # kept, then applied once
    assert reader.query(["model"]).total.get("requests") == 1


def test_a_forked_child_records_its_own_usage_never_the_parents_again(redis_server, namespace):
    import os

    writer, rec, reader = _setup(redis_server.url, namespace)
    rec.record(_use("acme", p=100))  # pending in the parent at the fork
    pid = os.fork()
    if pid == 0:  # the child: a new writer, nothing pending
        code = 1
        try:
            rec.record(_use("acme", p=1))
            code = 0 if writer.flush() and rec.writer_id == writer.writer_id else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert writer.flush()
    total = reader.tenant("acme").total
    assert (total.get("requests"), total.get("prompt_tokens")) == (2, 101)
    writer.close()


def test_threads_recording_while_the_flusher_runs_lose_and_double_nothing(redis_server, namespace):
    import threading

    cfg = StatsConfig(url=redis_server.url, namespace=namespace, flush_interval=0.01)
    writer = StatsWriter(cfg)  # its flusher thread runs
    rec = UsageRecorder(writer)

    def work(k: int) -> None:
        for i in range(1500):
            rec.record(_use(f"t{i % 50}", p=k + 1, g=1))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    total = UsageReader(cfg).query().total
    assert total.get("requests") == 9_000 and total.get("prompt_tokens") == 1500 * sum(range(1, 7))
