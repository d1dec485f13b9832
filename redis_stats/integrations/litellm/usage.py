"""One LiteLLM logging event as a :class:`~redis_stats.usage.Usage` (no LiteLLM import).

LiteLLM hands its callbacks ``kwargs["standard_logging_object"]`` (its ``StandardLoggingPayload``):
``prompt_tokens``, ``completion_tokens``, ``model_group`` (the name the client asked for) and
``model``, and in ``metadata`` the proxy's identities of the caller, ``user_api_key_hash``,
``user_api_key_alias``, ``user_api_key_team_id``, ``user_api_key_user_id``,
``user_api_key_org_id``, ``user_api_key_end_user_id``, with the provider's usage object in
``metadata.usage_object`` (cached prompt tokens in ``prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis_stats.config import ConfigError, EnvVar
from redis_stats.usage import Usage

__all__ = ["TENANT", "TENANT_FIELDS", "URL", "VARIABLES", "tenant_field", "usage_of_event"]

_CALLBACK = "the LiteLLM callback"

URL = EnvVar(
    "REDIS_STATS_URL",
    "",
    _CALLBACK,
    "the Redis URL; it also switches the callback on: unset, it records nothing (and says so once)",
)

TENANT_FIELDS = {
    "key": "user_api_key_hash",
    "key_alias": "user_api_key_alias",
    "team": "user_api_key_team_id",
    "user": "user_api_key_user_id",
    "org": "user_api_key_org_id",
    "project": "user_api_key_project_id",
    "end_user": "user_api_key_end_user_id",
}
"""Which of the proxy's identities is the tenant (``REDIS_STATS_LITELLM_TENANT``): the virtual
key (its hash, as LiteLLM keeps it), the key's alias, its team, its user, its organization, its
project, or the end user the request names (the fields of LiteLLM 1.110's
``StandardLoggingUserAPIKeyMetadata``)."""

TENANT = EnvVar(
    "REDIS_STATS_LITELLM_TENANT",
    "team",
    _CALLBACK,
    "which identity of LiteLLM's proxy is the tenant: "
    + ", ".join(f"`{k}` ({v})" for k, v in TENANT_FIELDS.items()),
)


VARIABLES = (URL, TENANT)
"""The callback's own variables (every other option through ``StatsConfig.from_env()``)."""


def tenant_field(environ: Mapping[str, str] | None = None) -> str:
    """The ``metadata`` field ``REDIS_STATS_LITELLM_TENANT`` names; :class:`ConfigError` naming
    the variable for another value."""
    raw = TENANT.get(environ).strip().lower()
    if raw not in TENANT_FIELDS:
        raise ConfigError(
            f"{TENANT.name}={raw!r} is not one of {', '.join(TENANT_FIELDS)}: the identity of "
            "LiteLLM's proxy that usage is counted under"
        )
    return TENANT_FIELDS[raw]


def _count(value: object) -> int:
    """A token count from LiteLLM's payload (an int >= 0 below 2**53; anything else 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**53:
        return 0
    return int(value)


def _name(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _cached(payload: Mapping[str, Any], response: Any) -> int:
    """Cached prompt tokens: the payload's ``metadata.usage_object``, else the response's usage."""
    usage: Any = (payload.get("metadata") or {}).get("usage_object")
    if usage is None:
        usage = getattr(response, "usage", None)
    details = (
        usage.get("prompt_tokens_details")
        if isinstance(usage, dict)
        else getattr(usage, "prompt_tokens_details", None)
    )
    cached = (
        details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    )
    return _count(cached)


def _finish(response: Any) -> str:
    """``length`` when the first choice was cut by its token limit, else ``stop``."""
    try:
        reason = response.choices[0].finish_reason
    except (AttributeError, IndexError, TypeError):
        return "stop"
    return "length" if reason == "length" else "stop"


def usage_of_event(kwargs: Mapping[str, Any], response: Any, field: str, outcome: str | None = None) -> Usage:
    """The usage of one LiteLLM event: *kwargs* as the callback gets them, *response* its
    ``response_obj``, *field* the identity that is the tenant (:data:`TENANT_FIELDS`' values),
    *outcome* ``error`` for a failure event (None: from the response's finish reason)."""
    payload = kwargs.get("standard_logging_object") or {}
    metadata = payload.get("metadata") or {}
    model = (
        _name(payload.get("model_group")) or _name(payload.get("model")) or _name(kwargs.get("model")) or ""
    )
    return Usage(
        tenant=_name(metadata.get(field)),
        adapter=None,
        model=model,
        prompt_tokens=_count(payload.get("prompt_tokens")),
        cached_prompt_tokens=_cached(payload, response),
        generation_tokens=_count(payload.get("completion_tokens")),
        outcome=outcome or _finish(response),
    )
