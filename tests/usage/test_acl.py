"""The usage ledger under docs/acl.md's least-privilege users: the writer's rules plus its usage
line record, the reader's rules plus its usage line read (the budget check, a window, the top
tenants); without those lines each is refused, and says so."""

from __future__ import annotations

import pytest
import redis

from redis_stats import StatsConfig, StatsWriter
from redis_stats.usage import Usage, UsageReader, UsageRecorder
from tests import acl

pytestmark = pytest.mark.redis_server


def _user_url(url: str, user: str) -> str:
    return url.replace("redis://", f"redis://{user}:pw@")


def _users(url: str, namespace: str, usage: bool) -> tuple[str, str]:
    admin = redis.Redis.from_url(url)
    tag = "u" if usage else "p"
    writer = acl.WRITER + (" " + acl.USAGE_WRITER if usage else "")
    reader = acl.READER + (" " + acl.USAGE_READER if usage else "")
    admin.execute_command("ACL", "SETUSER", f"w{tag}{namespace}", *acl.rules(namespace, "pw", writer))
    read_rules = acl.rules(namespace, "pw", reader, read_only=True)
    admin.execute_command("ACL", "SETUSER", f"r{tag}{namespace}", *read_rules)
    return _user_url(url, f"w{tag}{namespace}"), _user_url(url, f"r{tag}{namespace}")


def test_the_documented_users_record_and_read_usage(redis_server, namespace):
    w_url, r_url = _users(redis_server.url, namespace, usage=True)
    writer = StatsWriter(StatsConfig(url=w_url, namespace=namespace), start=False)
    rec = UsageRecorder(writer)
    rec.record(Usage(tenant="acme", adapter=None, model="m", prompt_tokens=5, generation_tokens=2))
    assert writer.flush()
    reader = UsageReader(StatsConfig(url=r_url, namespace=namespace))
    assert reader.tenant("acme").total.get("prompt_tokens") == 5
    assert reader.query(since=0 + int(reader.now()) - 3600).total.get("requests") == 1
    assert [t for t, _ in reader.top(3)[0]] == ["acme"] and reader.tenant_count() == 1
    writer.close()


def test_without_the_usage_lines_recording_is_refused_and_kept(redis_server, namespace):
    w_url, _ = _users(redis_server.url, namespace, usage=False)
    writer = StatsWriter(StatsConfig(url=w_url, namespace=namespace), start=False)
    rec = UsageRecorder(writer)
    rec.record(Usage(tenant="acme", adapter=None, model="m", prompt_tokens=5, generation_tokens=2))
    assert not writer.flush()
    assert rec.pending() and any(k.startswith("errors:") for k in rec.stats)  # kept, counted
    writer._closed = True
