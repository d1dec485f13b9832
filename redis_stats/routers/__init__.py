"""The routers' documents: what each router reads of an endpoint's or a pool's load.

Pure functions of one read of the load feed (:class:`redis_stats.load.LoadView`, or an endpoint's
:class:`~redis_stats.load.EngineLoad` entries), (HTTP status, document) or text out, so that the
exporter's views (:mod:`redis_stats.server.views`) and the vLLM middleware on vLLM's own port
(:mod:`redis_stats.integrations.vllm.get_load`) serve the same answers:

- :mod:`~redis_stats.routers.get_load`: ``/get_load``, as vllm-router and sglang-router poll it;
- :mod:`~redis_stats.routers.smg`: ``/v1/loads`` and ``/loads``, SGLang's model gateway's;
- :mod:`~redis_stats.routers.pool`: ``/pool``, the pool averages llm-d-router's multi-cluster
  extractor reads.

Nothing here reads Redis or knows HTTP beyond the status it answers.
"""
