"""vLLM-shaped stats objects (the attributes vLLM's SchedulerStats/IterationStats carry)."""

import time
from contextlib import contextmanager
from types import SimpleNamespace


def scheduler(running=0, waiting=0, kv=0.0, queries=0, hits=0, spec=None, by_reason=None):
    return SimpleNamespace(
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        kv_cache_usage=kv,
        prefix_cache_stats=SimpleNamespace(queries=queries, hits=hits, requests=1),
        connector_prefix_cache_stats=None,
        spec_decoding_stats=spec,
        num_corrupted_reqs=0,
        num_waiting_reqs_by_reason=by_reason,
    )


def finished(reason="stop", prompt=10, generation=20, e2e=1.2, queued=0.1, prefill=0.2, decode=0.9):
    return SimpleNamespace(
        finish_reason=reason,
        e2e_latency=e2e,
        num_prompt_tokens=prompt,
        num_generation_tokens=generation,
        max_tokens_param=64,
        queued_time=queued,
        prefill_time=prefill,
        inference_time=prefill + decode,
        decode_time=decode,
        mean_time_per_output_token=decode / max(1, generation - 1),
        num_cached_tokens=4,
    )


def iteration(prompt=0, generation=0, ttft=(), itl=(), done=(), preempted=0, cached=0):
    """IterationStats; *cached* of the *prompt* tokens came from the local prefix cache."""
    tokens = SimpleNamespace(
        computed=prompt - cached,
        local_cache_hit=cached,
        external_kv_transfer=0,
        cached_tokens=cached,
        total=prompt,
    )
    return SimpleNamespace(
        num_prompt_tokens=prompt,
        num_generation_tokens=generation,
        num_preempted_reqs=preempted,
        max_num_generation_tokens_iter=[],
        n_params_iter=[],
        time_to_first_tokens_iter=list(ttft),
        inter_token_latencies_iter=list(itl),
        finished_requests=list(done),
        prompt_token_stats=tokens,
        num_corrupted_reqs=0,
    )


@contextmanager
def snapshot_pair(config, fake_client, sched, it):
    """Two snapshots of engines 0 and 1 of a vLLM fleet 0.2 s apart, *sched* and *it* recorded
    on each engine between them (what ``top`` renders rates from)."""
    from redis_stats import StatsReader, StatsWriter
    from redis_stats.integrations.vllm import VllmRecorder, vllm_catalog

    cat = vllm_catalog()
    writer = StatsWriter(config, cat, engines=[0, 1], client=fake_client(), start=False)
    recorder = VllmRecorder(writer, "m", [0, 1])
    reader = StatsReader(config, cat, client=fake_client())
    writer.flush()
    before = reader.snapshot()
    time.sleep(0.2)
    for e in (0, 1):
        recorder.record(sched, it, engine_idx=e)
    writer.flush()
    try:
        yield before, reader.snapshot()
    finally:
        writer._closed = True
