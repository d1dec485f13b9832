"""The one script runner, sync and asyncio, against a stub client: the same decisions for both."""

import asyncio

import pytest
from redis.exceptions import NoScriptError, ResponseError

from redis_stats._scripts import AsyncScript, Script


class Stub:
    """Answers with the scripted replies in turn (an exception is raised); records the calls."""

    def __init__(self, *replies):
        self.replies, self.calls = list(replies), []

    def execute_command(self, *args):
        self.calls.append(args[0])
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def script_load(self, source):
        self.calls.append("SCRIPT LOAD")


class AsyncStub(Stub):
    async def execute_command(self, *args):
        return Stub.execute_command(self, *args)

    async def script_load(self, source):
        Stub.script_load(self, source)


def run(kind, client, **kw):
    if kind == "async":
        return asyncio.run(AsyncScript(client, "return 1", **kw)(["k"], ["a"]))
    return Script(client, "return 1", **kw)(["k"], ["a"])


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_noscript_loads_the_source_and_calls_again(kind):
    client = (AsyncStub if kind == "async" else Stub)(NoScriptError("NOSCRIPT"), 7)
    assert run(kind, client) == 7
    assert client.calls == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_server_without_evalsha_ro_gets_evalsha(kind):
    client = (AsyncStub if kind == "async" else Stub)(ResponseError("unknown command 'EVALSHA_RO'"), 7)
    assert run(kind, client, read_only=True) == 7
    assert client.calls == ["EVALSHA_RO", "EVALSHA"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_any_other_error_is_raised_at_once(kind):
    client = (AsyncStub if kind == "async" else Stub)(ResponseError("WRONGTYPE"))
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        run(kind, client, read_only=True)
    assert client.calls == ["EVALSHA_RO"]
