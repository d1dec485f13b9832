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


def test_the_endpoint_defaults_to_the_pods_address_and_vllms_port():
    """The API server's address as a router reaches it: POD_IP (else the host name) and --port."""
    import socket

    env = {"REDIS_STATS_URL": URL, "POD_IP": "10.0.0.7"}
    assert plugin_config("m", env, argv=["vllm", "serve", "m", "--port", "8100"]).endpoint == "10.0.0.7:8100"
    assert plugin_config("m", env, argv=["vllm", "serve", "m", "--port=8200"]).endpoint == "10.0.0.7:8200"
    assert plugin_config("m", env, argv=["vllm", "serve", "m"]).endpoint == "10.0.0.7:8000"
    assert plugin_config("m", {**env, "POD_IP": "fd00::7"}, argv=[]).endpoint == "[fd00::7]:8000"
    host = socket.gethostname()
    assert plugin_config("m", {"REDIS_STATS_URL": URL}, argv=[]).endpoint == f"{host}:8000"
    # REDIS_STATS_ENDPOINT wins; a bad one is refused with the variable's rule
    assert plugin_config("m", {**env, "REDIS_STATS_ENDPOINT": "api-0:9000"}, argv=[]).endpoint == "api-0:9000"
    with pytest.raises(ConfigError, match="endpoint='a b' is not an endpoint id"):
        plugin_config("m", {**env, "REDIS_STATS_ENDPOINT": "a b"}, argv=[])


def test_the_pod_index_derives_the_offset_from_vllms_data_parallel_size():
    env = {"REDIS_STATS_URL": "redis://x", "REDIS_STATS_POD_INDEX": "3"}
    assert plugin_config("m", env, argv=[], data_parallel_size=4).engine_offset == 12
    assert plugin_config("m", env, argv=[]).engine_offset == 3  # one engine per pod
    assert (
        plugin_config("m", {"REDIS_STATS_URL": "redis://x"}, argv=[], data_parallel_size=4).engine_offset == 0
    )


@pytest.mark.parametrize("index", ["-1", "1.5", "two", "٣"])
def test_a_pod_index_that_is_not_one_is_refused_naming_the_variable(index):
    env = {"REDIS_STATS_URL": "redis://x", "REDIS_STATS_POD_INDEX": index}
    with pytest.raises(ConfigError, match=r"REDIS_STATS_POD_INDEX=.* is not a pod index .*pod-index"):
        plugin_config("m", env, argv=[], data_parallel_size=2)


def test_a_pod_index_beside_a_hand_set_offset_is_refused_naming_both():
    env = {"REDIS_STATS_URL": "redis://x", "REDIS_STATS_POD_INDEX": "1", "REDIS_STATS_ENGINE_OFFSET": "4"}
    with pytest.raises(ConfigError, match="REDIS_STATS_POD_INDEX and REDIS_STATS_ENGINE_OFFSET are both set"):
        plugin_config("m", env, argv=[], data_parallel_size=2)
