"""``python -m redis_stats`` is the ``redis-stats`` command."""

from .cli import main

if __name__ == "__main__":
    main()
