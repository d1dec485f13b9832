"""The commands of ``redis-stats``, one module each; :mod:`redis_stats.tools.cli` is the group that
adds them, :mod:`redis_stats.tools.redis_options` what they share."""
