"""redis_stats for LiteLLM's proxy: exact usage per key, team or user across every proxy pod.

:mod:`~redis_stats.integrations.litellm.usage` reads one of LiteLLM's logging events into a
:class:`~redis_stats.usage.Usage` (no LiteLLM import); :mod:`~redis_stats.integrations.litellm.callback`
is the ``CustomLogger`` the proxy's ``config.yaml`` names (docs/usage.md, "LiteLLM")."""
