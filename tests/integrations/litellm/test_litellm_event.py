"""One LiteLLM event as usage (integrations/litellm/usage.py), without LiteLLM: the payload shapes
its StandardLoggingPayload has, and what is not trusted in them."""

from types import SimpleNamespace

from redis_stats.integrations.litellm.usage import usage_of_event

TEAM = "user_api_key_team_id"


def _kwargs(**payload):
    return {"standard_logging_object": payload}


def test_cached_tokens_come_from_the_usage_object_or_the_response():
    kwargs = _kwargs(
        model_group="llama",
        prompt_tokens=100,
        completion_tokens=7,
        metadata={TEAM: "t", "usage_object": {"prompt_tokens_details": {"cached_tokens": 64}}},
    )
    used = usage_of_event(kwargs, None, TEAM)
    assert (
        used.tenant,
        used.model,
        used.prompt_tokens,
        used.cached_prompt_tokens,
        used.generation_tokens,
    ) == (
        "t",
        "llama",
        100,
        64,
        7,
    )
    response = SimpleNamespace(
        usage=SimpleNamespace(prompt_tokens_details=SimpleNamespace(cached_tokens=32)),
        choices=[SimpleNamespace(finish_reason="length")],
    )
    used = usage_of_event(_kwargs(model="m", prompt_tokens=5, metadata={}), response, TEAM)
    assert (used.cached_prompt_tokens, used.outcome, used.tenant, used.model) == (32, "length", None, "m")


def test_hostile_or_missing_values_count_as_nothing_rather_than_fail():
    kwargs = _kwargs(prompt_tokens=-5, completion_tokens=float("nan"), metadata={TEAM: 12})
    used = usage_of_event(kwargs, object(), TEAM, "error")
    assert (used.prompt_tokens, used.generation_tokens, used.tenant, used.outcome) == (0, 0, None, "error")
    assert usage_of_event({}, None, TEAM).requests == 1  # no payload at all: still one request
