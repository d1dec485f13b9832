"""The docs name every option and environment variable the code reads."""

import re

from redis_stats import StatsConfig

from .conftest import ROOT


def test_configuration_doc_lists_every_option_and_variable():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for opt in StatsConfig.options():
        assert f"`{opt.name}`" in doc, f"docs/configuration.md does not document option {opt.name}"
        assert f"`{opt.env}`" in doc, f"docs/configuration.md does not document {opt.env}"


def test_every_env_variable_read_in_the_code_is_documented():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    used = set()
    for path in (ROOT / "redis_stats").rglob("*.py"):
        used |= set(re.findall(r"[\"'](REDIS_STATS_[A-Z_]+)[\"']", path.read_text()))
    missing = sorted(v for v in used if f"`{v}`" not in doc)
    assert not missing, f"docs/configuration.md does not document {missing}"
