"""A bridge restarted again and again (clean exits and kill -9, real `redis-stats bridge`
processes) against a real prometheus_client source that may itself restart in between: the
store's totals are always what every run of the source counted, once."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from redis_stats import StatsConfig
from redis_stats.connection import make_client
from redis_stats.integrations.bridge import BridgedSource
from redis_stats.integrations.bridge.fetch import ACCEPT
from redis_stats.keys import Keys
from redis_stats.ops.removal import remove_namespace
from redis_stats.ops.retention import collect_garbage
from tests.conftest import ROOT
from tests.ops.test_gc_acl import admin_config  # noqa: F401 (a fixture)

from .compare import get, source_samples, store_samples, store_text

TOTALS = ("_total", "_bucket", "_count", "_sum")


def _env(cfg: StatsConfig, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "REDIS_STATS_URL": cfg.url,
        "REDIS_STATS_NAMESPACE": cfg.namespace,
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def _writers(cfg: StatsConfig) -> set[str]:
    """Ids of the writers whose redis_stats_writer_up is 1."""
    from prometheus_client.parser import text_string_to_metric_families

    up = set()
    for fam in text_string_to_metric_families(store_text(cfg)):
        for s in fam.samples:
            if s.name == "redis_stats_writer_up" and s.value == 1.0:
                up.add(s.labels["writer"])
    return up


def _totals(samples):
    """The source's own totals (not the process_* and python_* families of --process)."""
    return {k: v for k, v in samples.items() if k[0].startswith("sglang:") and k[0].endswith(TOTALS)}


def _run_bridge(
    cfg: StatsConfig,
    url: str,
    how: str,
    seen: set[str],
    env: dict[str, str],
    during=None,
    args: tuple[str, ...] = (),
) -> str:
    """One bridge process: it stores a few scrapes (and *during* runs, given the new writer's id),
    then exits cleanly (SIGTERM) or is killed -9. Returns the new writer's id."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "redis_stats", "bridge", "--source", url, "--interval", "0.2", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not (_writers(cfg) - seen):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the bridge stored nothing within 30 s"
            time.sleep(0.05)
        (new,) = _writers(cfg) - seen
        seen.add(new)
        time.sleep(0.6)  # a few more scrapes
        if during is not None:
            during(new)
        proc.send_signal(signal.SIGKILL if how == "kill9" else signal.SIGTERM)
        proc.wait(30)
        if how == "clean":
            assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
        return new
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


def _records(cfg: StatsConfig) -> list[str]:
    """The fields of the namespace's handover records."""
    return sorted(make_client(cfg).hkeys(Keys(cfg.namespace).bridges))


def _assert_once(cfg: StatsConfig, earlier: dict, url: str) -> None:
    """The store's totals are those of the source's earlier runs plus its current values."""
    body, ct = get(url, ACCEPT["text"])
    now = _totals(source_samples(body, ct))
    want = {k: earlier.get(k, 0) + now.get(k, 0) for k in {*earlier, *now}}
    got = _totals(store_samples(cfg))
    assert got.keys() == want.keys()
    exact = {k: v for k, v in want.items() if not k[0].endswith("_sum") and float(v).is_integer()}
    assert {k: got[k] for k in exact} == exact
    for key, value in want.items():  # float totals: several writers' parts add up to the source's
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-9), key


def _earlier_run(h, earlier: dict) -> None:
    """Add what the source's run now ending counted to *earlier* (it stays in the store)."""
    body, ct = get(h.url, ACCEPT["text"])
    for key, value in _totals(source_samples(body, ct)).items():
        earlier[key] = earlier.get(key, 0) + value


@pytest.mark.parametrize("how", ["clean", "kill9"])
def test_a_bridge_restarted_five_times_counts_its_source_once(cfg, helpers, how):
    h = helpers(seed=11)
    h.call("/step?n=3")
    env = _env(cfg)
    seen: set[str] = set()
    earlier: dict = {}  # what the source's previous runs counted (they stay in the store)
    for run in range(6):
        if run == 3:  # the source restarts between two bridge runs: its counters start again
            _earlier_run(h, earlier)
            h.kill()
            h = helpers(port=h.port, seed=12)
        if run in (1, 4):
            h.call("/step?n=2")  # the source moves while no bridge runs
        writer = _run_bridge(cfg, h.url, how, seen, env)
        _assert_once(cfg, earlier, h.url)
        records = _records(cfg)  # one record per source, however often it was bridged
        assert len(records) == 1 and records[0].endswith("|" + writer), records


def test_a_constant_source_bridged_four_times_reads_its_value(cfg, helpers):
    """Issue 32's case: a source that does not move, four bridges one after another."""
    h = helpers(seed=13)
    env = _env(cfg)
    seen: set[str] = set()
    body, ct = get(h.url, ACCEPT["text"])
    want = _totals(source_samples(body, ct))
    for how in ("clean", "kill9", "clean", "kill9"):
        _run_bridge(cfg, h.url, how, seen, env)
        assert _totals(store_samples(cfg)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("how", ["clean", "kill9"])
def test_restarts_stay_exact_while_gc_folds_the_earlier_writers(cfg, helpers, how):
    """gc (retention 2 s) folds each bridge's predecessors into the base fields while the next
    one runs: what the new ones continue does not change."""
    cfg = cfg.replace(stale_after=1.0, retention=2.0)
    env = _env(cfg, REDIS_STATS_STALE_AFTER="1", REDIS_STATS_RETENTION="2")
    h = helpers(seed=14)
    h.call("/step?n=2")
    seen: set[str] = set()
    earlier: dict = {}
    previous: list[str] = []

    def fold_the_previous(_new: str) -> None:
        if not previous:
            return
        deadline = time.monotonic() + 15
        while previous[-1] not in collect_garbage(cfg).writers:
            assert time.monotonic() < deadline, f"gc did not fold {previous[-1]}"
            time.sleep(0.3)

    for run in range(5):
        if run == 2:
            _earlier_run(h, earlier)
            h.kill()
            h = helpers(port=h.port, seed=15)
        h.call("/step?n=1")
        previous.append(_run_bridge(cfg, h.url, how, seen, env, during=fold_the_previous))
        _assert_once(cfg, earlier, h.url)


def test_a_source_restarted_past_its_old_totals_is_told_by_its_start_time(cfg, helpers):
    """Between two bridges the source restarts and counts past what it showed before: its
    counters alone look continued, its process_start_time_seconds says it is a new run."""
    h = helpers(seed=16, process=True)
    h.call("/step?n=1")
    env = _env(cfg)
    seen: set[str] = set()
    earlier: dict = {}
    _run_bridge(cfg, h.url, "clean", seen, env, args=("--family", "sglang:*"))
    _earlier_run(h, earlier)
    h.kill()
    time.sleep(1.1)  # process_start_time_seconds has a resolution of one clock tick
    h = helpers(port=h.port, seed=16, process=True)
    h.call("/step?n=5")  # the same seed: every counter now above the first run's
    # (its own families only: the process' CPU seconds would tell the restart too)
    _run_bridge(cfg, h.url, "kill9", seen, env, args=("--family", "sglang:*"))
    _assert_once(cfg, earlier, h.url)


def test_a_lost_handover_record_is_walked_around(cfg, helpers, caplog):
    """The records deleted (the key evicted, or by hand) before the fourth bridge: it continues
    from the chunks of the source's writers, newest first, back to where the source restarted."""
    h = helpers(seed=17)
    h.call("/step?n=5")
    BridgedSource(h.url, cfg).scrape()  # bridges a first run of the source, then dies
    earlier: dict = {}
    _earlier_run(h, earlier)
    h.kill()
    h = helpers(port=h.port, seed=18)  # its second run: every counter starts again
    for _ in range(2):  # two bridges of the second run, one after another
        h.call("/step?n=1")
        source = BridgedSource(h.url, cfg)
        assert source.scrape()
        source.close()
    make_client(cfg).delete(Keys(cfg.namespace).bridges)
    h.call("/step?n=1")
    source = BridgedSource(h.url, cfg)
    with caplog.at_level(logging.WARNING, logger="redis_stats.bridge"):
        assert source.scrape()
    assert any("left no handover record" in r.getMessage() for r in caplog.records)
    _assert_once(cfg, earlier, h.url)
    source.close()


def test_drop_namespace_without_scan_removes_the_handover_records(
    redis_server,
    namespace,
    inproc,
    admin_config,  # noqa: F811
):
    """The documented admin user may not SCAN: drop-namespace removes the keys it knows by name,
    the bridges' records among them."""
    _cat, url = inproc("sglang")
    cfg = StatsConfig(url=redis_server.url, namespace=namespace)
    source = BridgedSource(url, cfg)
    assert source.scrape()
    source.close()
    client = make_client(cfg)
    assert client.hkeys(Keys(namespace).bridges)
    done = remove_namespace(admin_config())  # the writer closed: none is live
    assert (done.failed, done.live_writers, done.scanned) == ({}, [], False)
    assert not client.keys(f"rs:{{{namespace}}}:*")


def test_the_documented_bridge_user_restarts_exactly(redis_server, namespace, inproc):
    """docs/bridge.md: the writer's ACL rules plus +zrange +hgetall +hkeys carry a bridge and its
    handover (a user without them stores nothing, reason redis)."""
    import redis

    from tests import acl

    root = redis.Redis.from_url(redis_server.url)
    user = f"b-{namespace}"
    root.execute_command(
        "ACL", "SETUSER", user, *acl.rules(namespace, "bp", acl.WRITER + " +zrange +hgetall +hkeys")
    )
    try:
        host = redis_server.url.split("//", 1)[1].split("/", 1)[0]
        cfg = StatsConfig(url=f"redis://{user}:bp@{host}/0", namespace=namespace)
        cat, url = inproc("sglang")
        for _ in range(3):
            cat.step(1)
            source = BridgedSource(url, cfg)
            assert source.scrape(), source.stats
            source.close()
        admin = StatsConfig(url=redis_server.url, namespace=namespace)
        body, ct = get(url, ACCEPT["text"])
        assert _totals(store_samples(admin)) == pytest.approx(_totals(source_samples(body, ct)), rel=1e-12)
        bare = f"c-{namespace}"  # the writer's rules alone: the handover cannot read
        root.execute_command("ACL", "SETUSER", bare, *acl.rules(namespace, "cp", acl.WRITER))
        source = BridgedSource(url, cfg.replace(url=f"redis://{bare}:cp@{host}/0"))
        assert not source.scrape() and source.stats.errors == {"redis": 1}
    finally:
        root.execute_command("ACL", "DELUSER", user, f"c-{namespace}")
