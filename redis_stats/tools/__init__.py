"""The tools around the library: the ``redis-stats`` CLI, the demo and its simulated
API servers, an embedded server, the live table (top)."""
