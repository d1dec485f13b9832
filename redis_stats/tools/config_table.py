"""Print the options table of docs/configuration.md: ``python -m redis_stats.tools.config_table``.

Its own module because ``redis_stats`` imports ``redis_stats.config`` when it loads: running that
module with ``-m`` would execute it a second time, as ``__main__`` (runpy's RuntimeWarning).
"""

from __future__ import annotations

from redis_stats.config import options_markdown

if __name__ == "__main__":
    print(options_markdown())
