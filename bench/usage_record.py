"""Cost of recording one finished request's usage, on the serving hot path (memory only), against
prometheus_client's ``Counter.inc`` measured in the same run.

Timed per finished request, best of several rounds (the machine is shared):

- baseline ``Counter.inc()`` (one unlabelled counter: the cheapest metric call there is);
- ``Counter.labels(tenant).inc()`` x 4 (per-tenant counters in Prometheus: requests, prompt,
  cached, generation — what the ledger replaces; 1,000 tenants);
- ``UsageRecorder.record(usage)`` (a ``Usage`` already made);
- ``Usage(...)`` made and recorded (what any Python server's call costs);
- the vLLM join: ``UsageJoin.open`` + ``finished`` (a FinishedRequestStats) + ``close`` per request
  (the middleware's entry and the stat logger's record, without the ASGI plumbing);
- the LiteLLM callback's ``log_usage`` of one success event's payload;
- for scale, what vLLM's own Prometheus logger does per finished request (a Counter.inc and 11
  Histogram.observe: e2e, queue, prefill, inference, decode, preemptions, prompt, generation,
  max_tokens, computed prefill, time per output token);
- the UsageMiddleware around an ASGI app, per request (a 2 KB chat body read, parsed and handed
  on; the entry opened and closed), less the same app alone: N requests awaited in one loop.

Also the GC collections each variant causes (the host's count, gc.get_stats()).

Usage: python bench/usage_record.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio
import json
import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from redis_stats import StatsConfig, StatsWriter
from redis_stats.integrations.litellm.usage import usage_of_event
from redis_stats.integrations.vllm.usage_join import UsageJoin
from redis_stats.integrations.vllm.usage_middleware import UsageMiddleware
from redis_stats.usage import Usage, UsageRecorder

TENANTS = [f"tenant-{i}" for i in range(1000)]


def _gc_collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())


def variants() -> dict[str, object]:
    registry = CollectorRegistry()
    plain = Counter("requests", "finished requests", registry=registry)
    labelled = [
        Counter(name, name, ["tenant"], registry=registry)
        for name in ("tenant_requests", "tenant_prompt_tokens", "tenant_cached_tokens", "tenant_gen_tokens")
    ]
    writer = StatsWriter(StatsConfig(url="redis://127.0.0.1:1/0", namespace="bench"), start=False)
    recorder = UsageRecorder(writer)
    made = [
        Usage(
            tenant=t,
            adapter=None,
            model="llama",
            prompt_tokens=812,
            cached_prompt_tokens=512,
            generation_tokens=96,
        )
        for t in TENANTS
    ]
    join = UsageJoin(recorder, "llama", tenant_header="x-tenant-id")
    stats = [
        SimpleNamespace(
            finished_requests=[
                SimpleNamespace(
                    request_id=f"chatcmpl-req{i}",
                    finish_reason="stop",
                    num_prompt_tokens=812,
                    num_cached_tokens=512,
                    num_generation_tokens=96,
                )
            ]
        )
        for i in range(len(TENANTS))
    ]
    events = [
        (
            {
                "standard_logging_object": {
                    "model_group": "llama",
                    "prompt_tokens": 812,
                    "completion_tokens": 96,
                    "metadata": {"user_api_key_team_id": t, "user_api_key_hash": "h" + t},
                }
            },
            None,
        )
        for t in TENANTS
    ]
    state = {"i": 0}

    def nxt() -> int:
        i = state["i"] = (state["i"] + 1) % len(TENANTS)
        return i

    histograms = [Histogram(f"h{i}", "vLLM's per-request histograms", registry=registry) for i in range(11)]

    def counter_inc() -> None:
        plain.inc()

    def vllm_own() -> None:
        plain.inc()
        for h in histograms:
            h.observe(0.5)

    def labelled_inc() -> None:
        t = TENANTS[nxt()]
        labelled[0].labels(t).inc()
        labelled[1].labels(t).inc(812)
        labelled[2].labels(t).inc(512)
        labelled[3].labels(t).inc(96)

    def record_made() -> None:
        recorder.record(made[nxt()])

    def make_and_record() -> None:
        t = TENANTS[nxt()]
        recorder.record(
            Usage(
                tenant=t,
                adapter=None,
                model="llama",
                prompt_tokens=812,
                cached_prompt_tokens=512,
                generation_tokens=96,
                outcome="stop",
            )
        )

    def vllm_join() -> None:
        i = nxt()
        key = join.open(f"req{i}", TENANTS[i], None)
        join.finished_stats(stats[i])
        join.close(key or "", 200)

    def litellm_event() -> None:
        kwargs, response = events[nxt()]
        recorder.record(usage_of_event(kwargs, response, "team", "stop"))

    return {
        "Counter.inc() (baseline)": counter_inc,
        "Counter.labels(tenant).inc() x 4": labelled_inc,
        "UsageRecorder.record(usage)": record_made,
        "Usage(...) + record": make_and_record,
        "vLLM: UsageJoin open + finished + close": vllm_join,
        "(scale) vLLM's own Prometheus work per finished request": vllm_own,
        "LiteLLM: usage_of_event + record": litellm_event,
    }


async def _asgi_requests(app: object, n: int) -> float:
    """Seconds for *n* chat requests through *app*, awaited one after the other."""
    body = BODY
    headers = [(b"content-type", b"application/json"), (b"x-tenant-id", b"acme")]

    async def send(message: object) -> None:
        return None

    start = time.perf_counter()
    for _ in range(n):
        sent = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive(sent: list[dict[str, object]] = sent) -> dict[str, object]:
            return sent.pop() if sent else {"type": "http.disconnect"}

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
        await app(scope, receive, send)  # type: ignore[operator]
    return time.perf_counter() - start


BODY = json.dumps(
    {"model": "llama", "messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 64}
).encode()


def middleware_cost(n: int, rounds: int) -> tuple[float, float, float]:
    """(app alone, middleware + app, json.loads of the body) seconds per request, best of *rounds*."""

    async def app(scope: object, receive: object, send: object) -> None:
        message = await receive()  # type: ignore[operator]
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": message["body"][:10]})  # type: ignore[operator]

    writer = StatsWriter(StatsConfig(url="redis://127.0.0.1:1/0", namespace="bench"), start=False)
    join = UsageJoin(UsageRecorder(writer), "llama", tenant_header="x-tenant-id", grace=0.0)
    wrapped = UsageMiddleware(app, join)
    alone, joined, parse = [], [], []
    for _ in range(rounds):
        alone.append(asyncio.run(_asgi_requests(app, n)) / n)
        joined.append(asyncio.run(_asgi_requests(wrapped, n)) / n)
        parse.append(timeit.timeit(lambda: json.loads(BODY), number=n) / n)
    return min(alone), min(joined), min(parse)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    number, rounds = (20_000, 3) if args.quick else (50_000, 7)
    table = variants()
    times: dict[str, list[float]] = {name: [] for name in table}
    collections = dict.fromkeys(table, 0)
    for fn in table.values():
        fn()  # warm
    for _ in range(rounds):  # interleaved: each variant sees the same load on a shared machine
        for name, fn in table.items():
            before = _gc_collections()
            times[name].append(timeit.timeit(fn, number=number) / number)
            collections[name] += _gc_collections() - before
    results = {name: (min(times[name]), collections[name]) for name in table}
    base = results["Counter.inc() (baseline)"][0]
    print(
        f"per finished request, best of {rounds} interleaved rounds x {number:,} ({sys.version.split()[0]})"
    )
    print(f"| variant | ns per request | x Counter.inc | GC collections per {rounds * number:,} |")
    print("|---|---:|---:|---:|")
    for name, (sec, collections) in results.items():
        print(f"| {name} | {sec * 1e9:,.0f} | {sec / base:.1f} | {collections} |")
    alone, joined, parse = middleware_cost(number // 10, rounds)
    print(
        f"| UsageMiddleware per request (2 KB body), less the app alone | {(joined - alone) * 1e9:,.0f} "
        f"| {(joined - alone) / base:.1f} | |"
    )
    print(f"| (part of it) json.loads of that body | {parse * 1e9:,.0f} | {parse / base:.1f} | |")
    vllm_parse = vllm_request_parse(number // 10, rounds)
    if vllm_parse is not None:
        print(
            f"| (scale) vLLM parsing that body into its ChatCompletionRequest | {vllm_parse * 1e9:,.0f} "
            f"| {vllm_parse / base:.1f} | |"
        )


def vllm_request_parse(n: int, rounds: int) -> float | None:
    """Seconds vLLM's own request model takes to parse the body (None without vLLM)."""
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    except ImportError:
        return None
    return (
        min(timeit.repeat(lambda: ChatCompletionRequest.model_validate_json(BODY), number=n, repeat=rounds))
        / n
    )


if __name__ == "__main__":
    main()
