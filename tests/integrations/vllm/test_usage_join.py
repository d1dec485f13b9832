"""Usage per tenant at a vLLM API server (integrations/vllm/usage_join.py, usage_middleware.py),
without vLLM: the middleware in front of an app that behaves as vLLM's does where the join
depends on it (the engine id ``chatcmpl-<X-Request-Id>`` / ``cmpl-<id>-<i>``, n records per id,
an abort that pops the request from the output processor and never reaches the stat loggers).
The same paths through a real ``vllm serve``: tests/vllm/test_vllm_usage.py."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from redis_stats.config import ConfigError
from redis_stats.integrations.vllm.options import tenant_header, warn_mistyped_variables
from redis_stats.integrations.vllm.usage_join import UsageJoin
from redis_stats.integrations.vllm.usage_middleware import UsageMiddleware, register_join
from redis_stats.usage import Usage

MODEL = "base-model"
FIELDS = ("requests", "prompt_tokens", "cached_prompt_tokens", "generation_tokens")


class Sink:
    """A UsageRecorder's record(), kept: the usage as the ledger would sum it."""

    def __init__(self) -> None:
        self.records: list[Usage] = []

    def record(self, usage: Usage) -> None:
        self.records.append(usage)

    def totals(self, tenant: str | None = "any") -> dict[str, int]:
        sums: Counter[str] = Counter()
        for u in self.records:
            if tenant == "any" or u.tenant == tenant:
                for f in FIELDS:
                    sums[f] += getattr(u, f)
                if u.requests:
                    sums[u.outcome] += u.requests
        return dict(sums)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _join(**kw: Any) -> tuple[UsageJoin, Sink, Clock]:
    sink, clock = Sink(), Clock()
    return UsageJoin(sink, MODEL, tenant_header="x-tenant", clock=clock, **kw), sink, clock


def _fin(rid: str | None, reason: str = "stop", prompt: int = 10, cached: int = 0, gen: int = 5) -> Any:
    return SimpleNamespace(
        request_id=rid,
        finish_reason=reason,
        num_prompt_tokens=prompt,
        num_cached_tokens=cached,
        num_generation_tokens=gen,
    )


def test_n_records_under_one_id_count_one_request_and_one_prompt():
    join, sink, _ = _join()
    key = join.open("abc", "acme", None, expected=3)
    assert key == "abc"
    join.finished_stats(
        SimpleNamespace(
            finished_requests=[_fin("chatcmpl-abc", cached=4, gen=7), _fin("chatcmpl-abc", cached=10, gen=3)]
        )
    )
    join.finished_stats(SimpleNamespace(finished_requests=[_fin("chatcmpl-abc", "length", cached=10, gen=9)]))
    join.close(key, 200)
    # As vLLM's own usage object for the request: the prompt once, every choice's tokens.
    assert sink.totals("acme") == {
        "requests": 1,
        "prompt_tokens": 10,
        "cached_prompt_tokens": 4,
        "generation_tokens": 19,
        "stop": 1,
    }
    assert join.pending() == 0  # all three records came: the entry went at the close


def test_a_completion_of_several_prompts_counts_each_prompt_once_and_the_request_once():
    join, sink, _ = _join()
    key = join.open("r-1", "acme", "sql-lora", expected=4)  # 2 prompts x n=2
    for i, prompt in ((0, 10), (1, 20), (0, 10), (1, 20)):
        join.finished(f"cmpl-r-1-{i}", "stop", prompt, 0, 2)
    join.close(key, 200)
    assert sink.totals() == {
        "requests": 1,
        "prompt_tokens": 30,
        "cached_prompt_tokens": 0,
        "generation_tokens": 8,
        "stop": 1,
    }
    assert {u.adapter for u in sink.records} == {"sql-lora"}


def test_prefill_and_decode_legs_count_one_request_once():
    # Two API servers (two joins): the legs share the X-Request-Id and both report the full prompt.
    prefill, p_sink, _ = _join()
    decode, d_sink, _ = _join()
    p = prefill.open("pd-7", "acme", None, leg="prefill")
    d = decode.open("pd-7", "acme", None, leg="decode")
    prefill.finished("chatcmpl-pd-7", "length", 100, 64, 1)  # one generated token, 64 prefix-cache hits
    decode.finished("chatcmpl-pd-7", "stop", 100, 99, 30)  # "cached": the KV the prefill leg sent
    prefill.close(p, 200)
    decode.close(d, 200)
    both = Counter(p_sink.totals()) + Counter(d_sink.totals())
    assert dict(both) == {
        "requests": 1,
        "prompt_tokens": 100,
        "cached_prompt_tokens": 64,
        "generation_tokens": 30,
        "stop": 1,
    }


def test_records_nobody_joined_go_to_the_none_tenant_and_are_never_dropped():
    join, sink, _ = _join()
    join.finished("chatcmpl-unknown", "stop", 8, 0, 2)
    join.finished_stats(SimpleNamespace(finished_requests=[_fin(None)]))  # vLLM < 0.20: no id
    assert [u.tenant for u in sink.records] == [None, None]
    assert sink.totals(None)["requests"] == 2
    assert [u.names()[0] for u in sink.records] == ["(none)", "(none)"]


def test_a_failure_before_the_engine_is_one_error_request_under_the_base_model():
    join, sink, clock = _join()
    key = join.open("bad", "acme", "no-such-adapter")
    join.close(key, 404)
    assert sink.records == []  # records may still come: not counted before the grace
    clock.now += join.grace + 1
    join.sweep()
    assert sink.records == [
        Usage(tenant="acme", adapter=None, model=MODEL, prompt_tokens=0, generation_tokens=0, outcome="error")
    ]


def test_an_id_in_flight_twice_is_made_unique_and_each_joins_its_own_tenant():
    join, sink, _ = _join()
    a = join.open("same", "a", None)
    b = join.open("same", "b", None)
    assert a == "same" and b is not None and b != a
    join.finished(f"chatcmpl-{b}", "stop", 3, 0, 1)
    join.finished(f"chatcmpl-{a}", "stop", 5, 0, 2)
    assert sink.totals("a")["prompt_tokens"] == 5 and sink.totals("b")["prompt_tokens"] == 3


def test_the_table_is_bounded():
    join, sink, _ = _join(max_pending=2)
    assert join.open("1", "a", None) and join.open("2", "a", None)
    assert join.open("3", "a", None) is None
    join.finished("chatcmpl-3", "stop", 4, 0, 1)  # not joined: counted under (none)
    assert sink.records[0].tenant is None and sink.totals()["requests"] == 1


# --- the middleware in front of an app that behaves as vLLM's ---------------------------------


class FakeOutputProcessor:
    """vLLM's OutputProcessor where the join reads it: request_states (popped at a finish or an
    abort) and abort_requests(ids, internal) (a parent's abort aborting its children)."""

    def __init__(self) -> None:
        self.request_states: dict[str, Any] = {}
        self.parents: dict[str, list[str]] = {}

    def abort_requests(self, request_ids: Any, internal: bool) -> list[str]:
        done = []
        for rid in request_ids:
            if self.request_states.pop(rid, None) is not None:
                done.append(rid)
            elif rid in self.parents:
                done += self.abort_requests(self.parents.pop(rid), internal=True)
        return done


class FakeVllm:
    """An ASGI app as vLLM's chat endpoint: engine id chatcmpl-<X-Request-Id>, n children, tokens
    generated one a step; finished requests handed to the stat logger (join.finished_stats)."""

    def __init__(self, join: UsageJoin) -> None:
        self.processor = FakeOutputProcessor()
        self.state = SimpleNamespace(engine_client=SimpleNamespace(output_processor=self.processor))
        self.join = join
        self.seen_ids: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        if request.get("model") not in (MODEL, "lora-a"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        rid = "chatcmpl-" + dict(scope["headers"])[b"x-request-id"].decode()
        self.seen_ids.append(rid)
        n, steps = request.get("n", 1), request["max_tokens"]
        children = [f"{i}_{rid}-internal" for i in range(n)]
        self.processor.parents["parent-" + rid] = children
        for child in children:
            self.processor.request_states[child] = SimpleNamespace(
                external_req_id=rid,
                prompt_len=12,
                num_cached_tokens=2,
                stats=SimpleNamespace(num_generation_tokens=0),
            )
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            for _ in range(steps):
                await asyncio.sleep(0)
                for child in children:
                    self.processor.request_states[child].stats.num_generation_tokens += 1
                await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        except OSError:
            # AsyncLLM.generate: the client is gone -> abort (never a FinishedRequestStats)
            self.processor.abort_requests(["parent-" + rid], internal=True)
            raise
        finished = []
        for child in children:
            state = self.processor.request_states.pop(child)
            finished.append(_fin(rid, "length", 12, 2, state.stats.num_generation_tokens))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        self.join.finished_stats(
            SimpleNamespace(finished_requests=finished)
        )  # after the last byte, as vLLM may


async def _call(
    app: Any, body: dict[str, Any], headers: dict[str, str], *, drop_after: int | None = None
) -> int:
    """One POST /v1/chat/completions through *app*; the client leaves after *drop_after* chunks."""
    sent: list[dict[str, Any]] = []
    raw = json.dumps(body).encode()
    chunks = [raw[: len(raw) // 2], raw[len(raw) // 2 :]]  # a body in two messages

    async def receive() -> dict[str, Any]:
        if chunks:
            part = chunks.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(chunks)}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if drop_after is not None and message["type"] == "http.response.body" and len(sent) > drop_after:
            raise OSError("client gone")
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "app": app.inner,
    }
    try:
        await app(scope, receive, send)
    except OSError:
        return -1
    return int(sent[0]["status"])


def _stack(**kw: Any) -> tuple[UsageMiddleware, FakeVllm, Sink, UsageJoin, Clock]:
    join, sink, clock = _join(**kw)
    inner = FakeVllm(join)
    middleware = UsageMiddleware(inner, join)
    middleware.inner = inner  # type: ignore[attr-defined]
    return middleware, inner, sink, join, clock


def test_middleware_joins_the_tenant_header_and_the_adapter_to_the_engines_records():
    app, inner, sink, join, _ = _stack()
    body = {"model": "lora-a", "n": 2, "max_tokens": 4, "messages": []}
    assert asyncio.run(_call(app, body, {"X-Tenant": "acme", "x-request-id": "client-id"})) == 200
    assert inner.seen_ids == ["chatcmpl-client-id"]  # the client's id kept
    assert asyncio.run(_call(app, {**body, "model": MODEL, "n": 1}, {})) == 200  # no tenant, no id
    assert inner.seen_ids[1].startswith("chatcmpl-") and len(inner.seen_ids[1]) == 9 + 32  # one made up
    acme = [u for u in sink.records if u.tenant == "acme"]
    assert {u.adapter for u in acme} == {"lora-a"}
    assert sink.totals("acme") == {
        "requests": 1,
        "prompt_tokens": 12,
        "cached_prompt_tokens": 2,
        "generation_tokens": 8,
        "length": 1,
    }
    assert sink.totals(None) == {
        "requests": 1,
        "prompt_tokens": 12,
        "cached_prompt_tokens": 2,
        "generation_tokens": 4,
        "length": 1,
    }
    assert [u.names()[:2] for u in sink.records if u.tenant is None] == [("(none)", "(base)")]
    assert join.pending() == 0


def test_a_client_that_leaves_mid_stream_is_counted_as_aborted_with_what_was_generated():
    app, _, sink, join, clock = _stack()
    body = {"model": MODEL, "n": 2, "max_tokens": 50, "messages": []}
    assert asyncio.run(_call(app, body, {"x-tenant": "acme"}, drop_after=3)) == -1
    # 2 children x 4 steps generated when vLLM aborted (3 chunks delivered, the 4th the client
    # never took: generated all the same); no FinishedRequestStats ever comes.
    assert sink.totals("acme") == {
        "requests": 1,
        "prompt_tokens": 12,
        "cached_prompt_tokens": 2,
        "generation_tokens": 8,
        "abort": 1,
    }
    clock.now += join.grace + 1
    join.sweep()
    assert sink.totals("acme")["requests"] == 1 and join.pending() == 0  # nothing counted twice


def test_a_request_the_server_refuses_is_an_error_request_of_its_tenant():
    app, _, sink, join, clock = _stack()
    body = {"model": "no-such-model", "max_tokens": 2, "messages": []}
    assert asyncio.run(_call(app, body, {"x-tenant": "acme"})) == 404
    clock.now += join.grace + 1
    join.sweep()
    assert sink.totals("acme") == {
        "requests": 1,
        "prompt_tokens": 0,
        "cached_prompt_tokens": 0,
        "generation_tokens": 0,
        "error": 1,
    }
    assert sink.records[0].adapter is None  # a name the server did not accept is not kept


def test_without_a_join_the_middleware_passes_everything_through():
    register_join(None)
    inner_calls = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        inner_calls.append(scope)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    asyncio.run(UsageMiddleware(inner)(scope, None, None))  # type: ignore[arg-type]
    assert inner_calls == [scope]


def test_the_tenant_header_variable_is_checked_and_known():
    assert tenant_header({}) is None
    assert tenant_header({"REDIS_STATS_TENANT_HEADER": " X-Tenant-Id "}) == "x-tenant-id"
    with pytest.raises(ConfigError, match=r"REDIS_STATS_TENANT_HEADER=.x tenant..*not an HTTP header name"):
        tenant_header({"REDIS_STATS_TENANT_HEADER": "x tenant"})
    messages = warn_mistyped_variables({"REDIS_STATS_TENANT_HEADR": "x"}, emit=lambda m: None)
    assert any("did you mean REDIS_STATS_TENANT_HEADER" in m for m in messages)
    assert not warn_mistyped_variables({"REDIS_STATS_TENANT_HEADER": "x"}, emit=lambda m: None)


# --- attacks: hostile bodies and headers, a failing ledger, a late record ----------------------


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2, 3]",
        b'{"model": 123, "n": "3", "max_tokens": 2, "messages": []}',
        b'{"model": "base-model", "n": 1000000000, "max_tokens": 2}',
        b'{"model": "base-model", "max_tokens": 2, "kv_transfer_params": "x", "prompt": [[1, 2], [3]]}',
        b'{"model": "base-model", "max_tokens": 2, "n": null, "kv_transfer_params": {"do_remote_decode": 0}}',
    ],
)
def test_a_hostile_body_is_handed_on_unchanged_and_the_request_counted_once(body):
    join, sink, clock = _join()
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append(message["body"])
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body}

    async def send(message: Any) -> None:
        return None

    headers = [(b"x-tenant", "t\u00ff\x01".encode("latin-1") * 100)]
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
    asyncio.run(UsageMiddleware(app, join)(scope, receive, send))
    assert seen == [body]
    clock.now += join.grace + 1
    join.sweep()
    assert sink.totals() == {
        "requests": 1,
        "prompt_tokens": 0,
        "cached_prompt_tokens": 0,
        "generation_tokens": 0,
        "error": 1,
    }
    assert len(sink.records[0].names()[0].encode()) <= 128  # the ledger bounds the tenant


def test_a_failing_ledger_never_fails_a_request_nor_vllms_output_handler():
    class Broken:
        def record(self, usage: Usage) -> None:
            raise RuntimeError("ledger down")

    join = UsageJoin(Broken(), MODEL, tenant_header="x-tenant", grace=0.0)
    inner = FakeVllm(join)
    app = UsageMiddleware(inner, join)
    app.inner = inner  # type: ignore[attr-defined]
    body = {"model": MODEL, "max_tokens": 2, "messages": []}
    assert asyncio.run(_call(app, body, {"x-tenant": "acme"})) == 200  # the stat logger's call inside
    join.finished_stats(SimpleNamespace(finished_requests=[_fin("chatcmpl-x", prompt=2**60)]))
    join.finished_stats(object())
    assert join.totals.failures >= 1


def test_an_engine_record_later_than_the_grace_joins_its_request_without_a_second_one():
    join, sink, clock = _join()
    key = join.open("slow", "acme", None)
    join.close(key, 200)
    clock.now += join.grace + 1
    join.sweep()  # no record yet: counted as one request without tokens (and warned)
    join.finished("chatcmpl-slow", "stop", 9, 0, 4)
    assert sink.totals("acme") == {
        "requests": 1,
        "prompt_tokens": 9,
        "cached_prompt_tokens": 0,
        "generation_tokens": 4,
        "stop": 1,
    }


def test_a_request_refused_as_unauthenticated_adds_no_tenant():
    join, sink, clock = _join()
    for i, status in enumerate((401, 403, 429)):
        join.close(join.open(f"r{i}", f"made-up-{status}", None) or "", status)
    clock.now += join.grace + 1
    join.sweep()
    assert [(u.tenant, u.outcome) for u in sink.records] == [("made-up-429", "error")]


def test_paths_under_a_root_path_are_joined_and_others_passed_on():
    from redis_stats.integrations.vllm.usage_middleware import _joined_path

    assert _joined_path({"path": "/v1/completions"}) == "/v1/completions"
    assert _joined_path({"path": "/api/v1/chat/completions", "root_path": "/api"}) == "/v1/chat/completions"
    assert _joined_path({"path": "/v1/embeddings"}) is None
    assert _joined_path({"path": "/api/v1/completions"}) is None  # no root path declared
