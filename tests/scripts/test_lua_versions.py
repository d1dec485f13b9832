"""Every script means the same in Lua 5.1 (Redis, Valkey) and Lua 5.4 (issue 33): the numbers
scripts concatenate or format (server times, sequence numbers, chunk indexes, gc's folded sums
and counts) print the same text, and ``unpack`` is found in both.

One scenario (tests/helpers/lua_scenario.py: flushes of every kind of value, a flush in parts,
two gc folds into base fields, reads with ``read.lua`` and with the transaction, the text
format) runs on fakeredis under each Lua runtime lupa offers, in its own process (fakeredis
picks its runtime when imported); both runs must leave the same keys and read the same series.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

from tests.conftest import PYTHON, ROOT


def _run(version: str, env: dict[str, str], server_type: str = "redis") -> dict:
    done = subprocess.run(
        [PYTHON, "-m", "tests.helpers.lua_scenario"],
        cwd=ROOT,
        env={**env, "FAKEREDIS_LUA_VERSION": version, "FAKE_SERVER_TYPE": server_type},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.skipif(importlib.util.find_spec("lupa.lua54") is None, reason="lupa has no Lua 5.4 runtime here")
def test_the_scripts_store_and_read_the_same_under_lua_5_1_and_5_4(python_env):
    env = {k: v for k, v in python_env.items() if k != "FAKEREDIS_LUA_VERSION"}
    old, new = _run("5.1", env), _run("5.4", env)
    base = old["keys"]["rs:{lua}:v2:e:1:b"]  # two writers folded by gc: sums and counts added
    assert base["latency_seconds|h:3f4d4c8d"] == "15.5 0 0 2 2 4"
    assert base["tokens"] == str(2 * 2**53 + 5)
    assert [r[1] for r in old["gc"]] == [["node:2:b"], ["node:3:c"]]
    for part in ("keys", "gc", "scripted", "plain", "text"):
        assert new[part] == old[part], part
    assert old["scripted"] == old["plain"]


@pytest.mark.skipif(importlib.util.find_spec("lupa.lua54") is None, reason="lupa has no Lua 5.4 runtime here")
def test_the_scripts_store_and_read_the_same_on_dragonfly_and_touch_no_undeclared_key(python_env):
    """The Dragonfly lane's scenario (fakeredis' Dragonfly emulation, Lua 5.4, and Dragonfly's
    refusal of undeclared keys): the same keys, gc and reads as on Redis, no key a call did not
    declare; and the guard is real (a script reading another key is refused)."""
    env = {k: v for k, v in python_env.items() if k not in ("FAKEREDIS_LUA_VERSION", "FAKE_SERVER_TYPE")}
    redis_run, dragonfly_run = _run("5.1", env), _run("5.4", env, "dragonfly")
    assert dragonfly_run["undeclared"] == []
    assert "script tried accessing undeclared key" in dragonfly_run["guard"]
    for part in ("keys", "gc", "scripted", "plain", "text"):
        assert dragonfly_run[part] == redis_run[part], part
