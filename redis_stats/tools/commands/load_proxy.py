"""``redis-stats load-proxy``, retired (docs/vllm-rs.md): hidden, it exits 2 saying what runs instead."""

from __future__ import annotations

import click

__all__ = ["load_proxy"]

LOAD_PROXY_RETIRED = """\
redis-stats load-proxy was retired: it sat in the path of every inference request and parsed
HTTP by hand (a body on GET /get_load became a second request to vLLM: request smuggling; one new
connection to vLLM per request). The address routers poll is now a proxy operators already run,
configured by a file this project ships and tests with the real binaries:

  nginx:   deploy/nginx/vllm-rs.conf    (HAProxy: deploy/haproxy/vllm-rs.cfg; Kubernetes:
           deploy/kubernetes/vllm-rs, the same nginx as a sidecar)
           GET /get_load and /v1/loads -> redis-stats exporter's view of the pod's endpoint,
           everything else -> vLLM's Rust front end
  numbers: redis-stats bridge --source http://127.0.0.1:8000/metrics --engine-label engine \\
             --family 'vllm:*'    with REDIS_STATS_ENDPOINT=<the proxy's address, as routers reach it>
  views:   redis-stats exporter   (the fleet's, or one on loopback)

What to run, and what it costs in the data path: docs/vllm-rs.md."""


@click.command(
    "load-proxy",
    hidden=True,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
)
@click.pass_context
def load_proxy(ctx: click.Context) -> None:
    """Retired (docs/vllm-rs.md): exits 2 saying what runs instead."""
    click.echo(LOAD_PROXY_RETIRED, err=True)
    ctx.exit(2)
