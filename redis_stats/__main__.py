"""``python -m redis_stats`` is the ``redis-stats`` command."""

from redis_stats.tools.cli import main

if __name__ == "__main__":
    main()
