"""Nothing misconfigured stays silent (issue 50, item 2), where no server is needed: the library's
``StatsConfig.from_env()`` warns on a misspelt ``REDIS_STATS_*`` variable as the command and the
plugin do (one function all of them call), and a ``redis://`` path that is no database number is
refused (redis-py took ``/abc`` as database 0)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from redis_stats import ConfigError, StatsConfig, config

PACKAGE = Path(config.__file__).parent


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test sees the once-per-process warnings as a new process would."""
    monkeypatch.setattr(config, "_warned_variables", set())


def test_the_library_warns_once_on_a_misspelt_variable_naming_the_closest(fresh_warnings, caplog):
    env = {"REDIS_STATS_NAMESPCE": "prod", "REDIS_STAT_URL": "redis://x:6379/0"}
    with caplog.at_level(logging.WARNING, logger="redis_stats.config"):
        cfg = StatsConfig.from_env(env)
        StatsConfig.from_env(env)  # once per process, not per call
    assert cfg.namespace == "default"  # the setting it meant keeps its default: hence the warning
    warnings = [r.getMessage() for r in caplog.records if r.name == "redis_stats.config"]
    assert warnings == [
        "REDIS_STATS_NAMESPCE is not a variable redis_stats reads (did you mean REDIS_STATS_NAMESPACE?); "
        "it is ignored",
        "REDIS_STAT_URL is not a variable redis_stats reads (did you mean REDIS_STATS_URL?); it is ignored",
    ]


def test_variables_other_parts_read_are_known_to_the_library_without_importing_them(fresh_warnings, caplog):
    env = {name: "1" for name in config.READ_ELSEWHERE} | {"REDIS_STATS_FLUSH_INTERVAL": "2"}
    with caplog.at_level(logging.WARNING, logger="redis_stats.config"):
        StatsConfig.from_env(env)
    assert not caplog.records


def test_every_variable_the_package_reads_is_known_to_the_one_check():
    """READ_ELSEWHERE is every REDIS_STATS_* name the package's source reads outside the options,
    and nothing more (a name added to the plugin or a tool without it would be warned about)."""
    options = {o.env for o in StatsConfig.options()}
    named = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name != "config.py":
            named |= set(re.findall(r'"(REDIS_STATS_[A-Z_]+)"', path.read_text()))
    assert named - options == config.READ_ELSEWHERE


@pytest.mark.parametrize("path", ["abc", "0/x", "-1", "1.5", " 1", "db0"])
@pytest.mark.parametrize("scheme", ["redis", "rediss"])
def test_a_path_that_is_no_database_number_is_refused(scheme, path):
    with pytest.raises(ConfigError) as err:
        StatsConfig(url=f"{scheme}://u:secret@h:6379/{path}")
    message = str(err.value)
    assert "is not a database number" in message and "secret" not in message, message
    assert "redis://host:6379/0" in message  # what to write instead


@pytest.mark.parametrize("url", ["redis://h:6379/0", "redis://h:6379/15", "redis://h:6379/", "rediss://h"])
def test_a_database_number_or_none_is_taken(url):
    assert StatsConfig(url=url).url == url
