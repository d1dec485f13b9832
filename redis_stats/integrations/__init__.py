"""Integrations with serving engines. Each imports its engine lazily; redis_stats never needs one."""
