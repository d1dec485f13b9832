"""The LiteLLM callback (redis_stats.integrations.litellm) against the real litellm from PyPI
(`make test-litellm` installs it in .venv-litellm): litellm.acompletion(mock_response=...) runs
LiteLLM's own logging and callbacks without a provider. Several processes ("pods") record into one
store; the ledger equals, per team, what LiteLLM told each caller it used."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from redis_stats import StatsConfig, StatsWriter
from redis_stats.config import ConfigError
from redis_stats.integrations.litellm.usage import tenant_field
from redis_stats.usage import UsageReader, UsageRecorder

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the cost map
litellm = pytest.importorskip("litellm")
RedisUsageLogger = pytest.importorskip("redis_stats.integrations.litellm.callback").RedisUsageLogger

pytestmark = [pytest.mark.litellm, pytest.mark.redis_server]

ROOT = Path(__file__).resolve().parents[3]


def _logger(
    url: str, namespace: str, field: str = "user_api_key_team_id"
) -> tuple[RedisUsageLogger, StatsWriter]:
    writer = StatsWriter(StatsConfig(url=url, namespace=namespace, flush_interval=0.1), start=False)
    return RedisUsageLogger(field=field, recorder=UsageRecorder(writer)), writer


async def _wait_recorded(logger: RedisUsageLogger, n: int) -> None:
    deadline = time.monotonic() + 30
    while logger.recorded < n and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def test_success_and_failure_events_are_recorded_under_the_team(redis_server, namespace):
    logger, writer = _logger(redis_server.url, namespace)
    litellm.callbacks = [logger]

    async def run() -> tuple[object, object]:
        ok = await litellm.acompletion(
            model="openai/gpt-4o-mini",
            messages=[{"role": "user", "content": "how many tokens is this?"}],
            mock_response="a few",
            metadata={"user_api_key_team_id": "team-a"},
        )
        with pytest.raises(Exception):  # noqa: B017 - whichever error LiteLLM maps it to
            await litellm.acompletion(
                model="openai/gpt-4o-mini",
                messages=[{"role": "user", "content": "fail"}],
                mock_response=Exception("provider down"),
                metadata={"user_api_key_team_id": "team-a"},
            )
        nobody = await litellm.acompletion(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "who?"}], mock_response="nobody"
        )
        await _wait_recorded(logger, 3)
        return ok, nobody

    try:
        ok, nobody = asyncio.run(run())
    finally:
        litellm.callbacks = []
    assert logger.recorded == 3 and logger.failures == 0
    assert writer.flush()
    reader = UsageReader(StatsConfig(url=redis_server.url, namespace=namespace))
    team = reader.tenant("team-a").total
    assert team.get("requests") == 2 and team.get("stop") == 1 and team.get("error") == 1
    assert team.get("prompt_tokens") >= ok.usage.prompt_tokens  # the failure adds what LiteLLM counted
    assert team.get("generation_tokens") == ok.usage.completion_tokens
    none = reader.tenant(None).total  # no team: the (none) bucket, never dropped
    assert none.get("requests") == 1 and none.get("generation_tokens") == nobody.usage.completion_tokens
    rows = reader.query(["model"]).rows
    assert [r.names for r in rows] == [("gpt-4o-mini",)] or [r.names for r in rows] == [
        ("openai/gpt-4o-mini",)
    ]
    writer.close()


def test_three_pods_into_one_store_exactly(redis_server, namespace, python_env):
    env = {
        **python_env,
        "PYTHONPATH": os.pathsep.join([str(ROOT), python_env.get("PYTHONPATH", "")]),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "REDIS_STATS_URL": redis_server.url,
        "REDIS_STATS_NAMESPACE": namespace,
        "REDIS_STATS_FLUSH_INTERVAL": "0.2",
        "REDIS_STATS_LITELLM_TENANT": "team",
    }
    n = 40
    pods = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.litellm_pod", str(pod), str(n)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pod in range(3)
    ]
    expected: dict[str, Counter[str]] = {}
    for pod in pods:
        out, err = pod.communicate(timeout=300)
        assert pod.returncode == 0, err[-3000:]
        answer = json.loads(out.strip().splitlines()[-1])
        assert answer["recorded"] == n, answer
        for team, used in answer["used"].items():
            expected.setdefault(team, Counter()).update(used)
    reader = UsageReader(StatsConfig(url=redis_server.url, namespace=namespace))
    for team, used in expected.items():
        got = reader.tenant(team).total
        assert {k: got.get(k) for k in used} == dict(used), team
    assert reader.query().total.get("requests") == 3 * n


def test_the_tenant_variable_names_one_identity():
    assert tenant_field({}) == "user_api_key_team_id"
    assert tenant_field({"REDIS_STATS_LITELLM_TENANT": "key"}) == "user_api_key_hash"
    with pytest.raises(ConfigError, match="REDIS_STATS_LITELLM_TENANT='tenant' is not one of"):
        tenant_field({"REDIS_STATS_LITELLM_TENANT": "tenant"})
    assert RedisUsageLogger(environ={}).recorder is None  # no REDIS_STATS_URL: records nothing


def test_the_proxy_finds_the_callback_its_config_names(tmp_path):
    """`litellm_settings: callbacks: redis_stats.integrations.litellm.callback.usage_callback`, as
    the proxy resolves it (beside a config.yaml that has no such file next to it)."""
    from litellm.proxy.types_utils.utils import get_instance_fn

    from redis_stats.integrations.litellm import callback

    found = get_instance_fn(
        "redis_stats.integrations.litellm.callback.usage_callback", str(tmp_path / "config.yaml")
    )
    assert found is callback.usage_callback and isinstance(
        found, litellm.integrations.custom_logger.CustomLogger
    )
