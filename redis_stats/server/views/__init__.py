"""The views of the server, one module per path (the route table: redis_stats.server.app)."""
