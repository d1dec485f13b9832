import pytest

from redis_stats import ConfigError, StatsConfig
from redis_stats.config import mask_url


def test_from_env_reads_every_option_and_arguments_win():
    env = {
        "REDIS_STATS_URL": "redis://u:hunter2@127.0.0.1:7000/2",
        "REDIS_STATS_NAMESPACE": "llama-3",
        "REDIS_STATS_FLUSH_INTERVAL": "0.5",
        "REDIS_STATS_STALE_AFTER": "12",
        "REDIS_STATS_ENGINE_OFFSET": "3",
    }
    cfg = StatsConfig.from_env(env, namespace="override")
    assert cfg.url == "redis://u:hunter2@127.0.0.1:7000/2"
    assert cfg.namespace == "override"
    assert cfg.flush_interval == 0.5
    assert cfg.stale_after == 12.0
    assert cfg.engine_offset == 3


def test_every_option_has_an_env_variable_and_help():
    names = {o.name for o in StatsConfig.options()}
    assert names == {f.name for f in __import__("dataclasses").fields(StatsConfig)}
    for opt in StatsConfig.options():
        assert opt.env == "REDIS_STATS_" + opt.name.upper()
        assert opt.help


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError, match="REDIS_STATS_FLUSH_INTERVAL='fast'"):
        StatsConfig.from_env({"REDIS_STATS_FLUSH_INTERVAL": "fast"})


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"namespace": "a{b}"}, "namespace"),
        ({"namespace": "a*"}, "namespace"),
        ({"namespace": ""}, "namespace"),
        ({"flush_interval": 0}, "flush_interval"),
        ({"stale_after": 0.5, "flush_interval": 1}, "stale_after"),
        ({"socket_timeout_ms": 0}, "socket_timeout_ms"),
        ({"engine_offset": -1}, "engine_offset"),
        ({"url": "localhost:6379"}, "url"),
    ],
)
def test_invalid_values_are_rejected_with_the_option_name(kwargs, word):
    with pytest.raises(ConfigError, match=word):
        StatsConfig(**kwargs)


@pytest.mark.parametrize(
    "url, masked",
    [
        ("redis://user:s3cret@h:1/0", "redis://user:***@h:1/0"),
        ("redis://:s3cret@h:1/0", "redis://:***@h:1/0"),
        ("rediss://s3cret@h:1", "rediss://***@h:1"),
        ("redis+sentinel://u:s3cret@a:1,b:2/mymaster", "redis+sentinel://u:***@a:1,b:2/mymaster"),
        ("redis://h:1/0", "redis://h:1/0"),
    ],
)
def test_password_is_masked(url, masked):
    assert mask_url(url) == masked
    cfg = StatsConfig(url=url)
    assert "s3cret" not in repr(cfg)
    assert "s3cret" not in cfg.safe_url


@pytest.mark.parametrize(
    ("retention", "stale_after", "flush_interval", "minimum"),
    [(59, 30.0, 1.0, 60), (1.5, 1.0, 1.0, 2), (0.5, 0.5, 0.1, 1)],
)
def test_a_retention_that_would_remove_live_data_is_refused_naming_both_values(
    retention, stale_after, flush_interval, minimum
):
    with pytest.raises(ConfigError) as err:
        StatsConfig(retention=retention, stale_after=stale_after, flush_interval=flush_interval)
    text = str(err.value)
    assert f"retention={retention:g} is shorter than 2 x max(stale_after={stale_after:g}" in text
    assert f"flush_interval={flush_interval:g}) = {minimum:g} s" in text
    assert f"make retention at least {minimum:g} s" in text
    # The minimum itself is accepted.
    StatsConfig(retention=minimum, stale_after=stale_after, flush_interval=flush_interval)


@pytest.mark.parametrize(
    ("stale_after", "bound", "fix"),
    [(3601.0, "3600", "make stale_after at most 3600 s"), (0.05, "0.1", "make stale_after at least 0.1 s")],
)
def test_a_stale_after_readers_would_not_take_from_redis_is_refused_naming_the_bound(stale_after, bound, fix):
    # Readers and gc do not use a stored stale_ms outside 0.1..3600 s (_core/read/liveness.py): a
    # writer configured so would be judged by the default instead of its own value.
    with pytest.raises(ConfigError) as err:
        StatsConfig(stale_after=stale_after, flush_interval=0.01, retention=10_000)
    text = str(err.value)
    assert f"stale_after={stale_after:g} is outside 0.1..3600 s: {bound} s is the" in text
    assert "judged by the default 30 s" in text and fix in text
    for edge in (0.1, 3600.0):  # the bounds themselves are accepted
        StatsConfig(stale_after=edge, flush_interval=0.01, retention=10_000)
