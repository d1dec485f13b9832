"""A reader process: serves /metrics for a namespace on a port until stdin closes.

Usage: python reader_proc.py URL NAMESPACE PORT
"""

import sys

from prometheus_client import CollectorRegistry, start_http_server

from redis_stats import Catalog, RedisCollector, StatsConfig, StatsReader


def main() -> None:
    url, namespace, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    registry = CollectorRegistry()
    # No catalogue in code: everything is rendered from the catalogue stored in Redis.
    registry.register(RedisCollector(StatsReader(StatsConfig(url=url, namespace=namespace), Catalog())))
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    print("ready", flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
