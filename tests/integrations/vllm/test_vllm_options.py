"""The vLLM plugin's configuration from the environment (integrations/vllm/options.py, read by
plugin.RedisStatLogger); needs no vLLM."""

import pytest

from redis_stats.config import ConfigError
from redis_stats.integrations.vllm.options import VARIABLES, plugin_config, plugin_enabled

URL = "redis://127.0.0.1:1/0"


def test_the_plugin_is_on_only_with_a_url():
    assert not plugin_enabled({})
    assert not plugin_enabled({"REDIS_STATS_URL": ""})
    assert plugin_enabled({"REDIS_STATS_URL": URL})


def test_the_namespace_defaults_to_the_served_model_and_the_interval_to_vllms():
    config = plugin_config("meta-llama/Llama 3", {"REDIS_STATS_URL": URL})
    assert (config.url, config.namespace, config.log_interval) == (URL, "meta-llama/Llama_3", 10.0)
    env = {
        "REDIS_STATS_URL": URL,
        "REDIS_STATS_NAMESPACE": "prod",
        "VLLM_LOG_STATS_INTERVAL": "2.5",
        "REDIS_STATS_LOG_INTERVAL": "99",  # not read under vLLM: vLLM's interval drives log()
        "REDIS_STATS_FLUSH_INTERVAL": "0.5",  # every other option as StatsConfig.from_env reads it
        "REDIS_STATS_LEADER": "lease",
    }
    config = plugin_config("m", env)
    assert (config.namespace, config.log_interval, config.flush_interval, config.leader) == (
        "prod",
        2.5,
        0.5,
        "lease",
    )


def test_a_bad_interval_is_a_config_error_naming_the_variable():
    with pytest.raises(ConfigError, match="VLLM_LOG_STATS_INTERVAL='often'"):
        plugin_config("m", {"REDIS_STATS_URL": URL, "VLLM_LOG_STATS_INTERVAL": "often"})


def test_every_variable_is_declared_once_with_a_meaning():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names)) and all(v.help for v in VARIABLES)
