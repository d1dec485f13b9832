"""What one finished request used (:class:`Usage`), and how a name a client sent becomes a tenant,
adapter or model name the ledger can keep (:func:`clean_name`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

from redis_stats.usage.layout import OUTCOMES

__all__ = ["MAX_NAME_BYTES", "NO_ADAPTER", "NO_TENANT", "OTHER", "Usage", "clean_name"]

MAX_NAME_BYTES = 128
"""The most UTF-8 bytes of a stored tenant, adapter or model name. A longer name is kept as its
first 96 bytes, ``~`` and 16 hex digits of its SHA-256: bounded, and still one name per name."""

NO_TENANT = "(none)"
"""The bucket of requests that named no tenant (counted, never dropped)."""

NO_ADAPTER = "(base)"
"""The adapter of requests served by the base model (no LoRA adapter)."""

OTHER = "(other)"
"""What every tenant but the top ones adds up to, in ``/metrics``."""


@lru_cache(maxsize=65536)
def clean_name(name: str | None, missing: str = NO_TENANT) -> str:
    """The stored form of a name a client may have chosen (any text): *missing* for None or "";
    characters UTF-8 cannot carry (lone surrogates) as ``\\udcXX`` escapes; a name starting with
    ``(`` gets one more ``(`` in front, so no client can name the reserved buckets (``(none)``,
    ``(base)``, ``(other)``) and two names stay two; at most :data:`MAX_NAME_BYTES` bytes."""
    if name is None or name == "":
        return missing
    if not isinstance(name, str):
        raise TypeError(f"a tenant, adapter or model name must be a str or None, not {type(name).__name__}")
    raw = name.encode("utf-8", "backslashreplace")
    if raw.startswith(b"("):
        raw = b"(" + raw
    if len(raw) > MAX_NAME_BYTES:
        digest = hashlib.sha256(raw).hexdigest()[:16]
        raw = raw[:96].decode("utf-8", "ignore").encode() + b"~" + digest.encode()
    return raw.decode("utf-8")


def _count(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2**53:
        raise ValueError(f"Usage.{what}={value!r}: must be an int from 0 to 2**53 - 1")
    return value


@dataclass(frozen=True, kw_only=True)
class Usage:
    """What one finished request used (or *requests* finished requests of one tenant, adapter,
    model and outcome together), every field given by keyword. A request with no tenant is
    counted under ``(none)``, one served by the base model under adapter ``(base)``. Checked
    when made: a count that is not an int from 0 to 2**53 - 1, or an *outcome* not in
    :data:`~redis_stats.usage.layout.OUTCOMES`, raises ``ValueError`` naming it."""

    tenant: str | None
    adapter: str | None
    model: str
    requests: int = 1
    prompt_tokens: int
    cached_prompt_tokens: int = 0
    generation_tokens: int
    outcome: str = "stop"

    def __post_init__(self) -> None:
        counts = (self.prompt_tokens, self.generation_tokens, self.cached_prompt_tokens, self.requests)
        if all(type(x) is int and 0 <= x < 2**53 for x in counts) and self.outcome in OUTCOMES:
            if isinstance(self.model, str):
                return  # the common case, checked in one pass (this runs per finished request)
        for what in ("prompt_tokens", "generation_tokens", "cached_prompt_tokens", "requests"):
            _count(what, getattr(self, what))
        if self.outcome not in OUTCOMES:
            raise ValueError(f"Usage.outcome={self.outcome!r}: must be one of {', '.join(OUTCOMES)}")
        if not isinstance(self.model, str):
            raise ValueError(f"Usage.model={self.model!r}: must be a str")

    def values(self) -> list[int]:
        """The eight numbers stored for it (:data:`~redis_stats.usage.layout.FIELDS`)."""
        outcome = [self.requests if o == self.outcome else 0 for o in OUTCOMES]
        return [
            self.requests,
            self.prompt_tokens,
            self.cached_prompt_tokens,
            self.generation_tokens,
            *outcome,
        ]

    def names(self) -> tuple[str, str, str]:
        """(tenant, adapter, model) as stored (:func:`clean_name`)."""
        return (
            clean_name(self.tenant),
            clean_name(self.adapter, NO_ADAPTER),
            clean_name(self.model, "(unknown)"),
        )
