"""Print the tables of docs/configuration.md: ``python -m redis_stats.tools.config_table`` (the
options of StatsConfig), ``... config_table vllm`` (the vLLM plugin's own variables), ``... config_table
litellm`` (the LiteLLM callback's).

Its own module because ``redis_stats`` imports ``redis_stats.config`` when it loads: running that
module with ``-m`` would execute it a second time, as ``__main__`` (runpy's RuntimeWarning).
"""

from __future__ import annotations

import sys

from redis_stats.config import env_markdown, options_markdown


def table(which: str = "") -> str:
    """The options table, or with *which* ``vllm`` the vLLM plugin's variables, ``litellm`` the
    LiteLLM callback's."""
    if which == "vllm":
        from redis_stats.integrations.vllm.options import VARIABLES

        return env_markdown(VARIABLES)
    if which == "litellm":
        from redis_stats.integrations.litellm.usage import VARIABLES as LITELLM

        return env_markdown(LITELLM)
    return options_markdown()


if __name__ == "__main__":
    print(table(sys.argv[1] if len(sys.argv) > 1 else ""))
