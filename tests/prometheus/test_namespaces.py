"""One exporter for every model: ``?namespace=`` on one port, the whole ``/metrics`` labelled.

Each test has a private redis-server (``--all-namespaces`` sees every namespace of its Redis),
writers of a few namespaces, and exporters on loopback ports: one of several namespaces against
one exporter per namespace, the way each is served today. What a user sees: each namespace's
``/metrics``, ``/load`` and ``/snapshot`` exactly as its own exporter serves them (with
``redis_stats_namespace`` on every series), the whole ``/metrics`` one valid exposition where two
namespaces' engine 0 stay two series, namespaces found and dropped while it runs, a bound on how
many, and no read of a namespace nobody asks for.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import Catalog, StatsConfig, StatsReader, StatsWriter
from redis_stats.ops.removal import remove_namespace
from redis_stats.server import Exporter
from redis_stats.server.states import sampler
from redis_stats.tools.embedded import EmbeddedRedis
from tests import acl
from tests.conftest import sample_catalog

pytestmark = pytest.mark.redis_server

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
# The exporter's own figures: one process's, not a namespace's (no redis_stats_namespace).
PROCESS = ("process_", "python_", "redis_stats_exporter_", "redis_stats_background_errors")
# Timings, ages and the server's own memory figures (redis_stats_store_*) move between two reads.
VOLATILE = re.compile(r"duration_seconds|age_seconds|^redis_stats_store_")


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A redis-server of this test alone: --all-namespaces lists every namespace it holds."""
    server = EmbeddedRedis().start()
    yield server
    server.close()


def write(url: str, namespace: str, engines: int, base: int, catalog: Catalog | None = None) -> StatsWriter:
    """A writer of *namespace* with numbers of its own (*base*), flushed once."""
    cat = catalog or sample_catalog()
    config = StatsConfig(url=url, namespace=namespace, flush_interval=0.05, stale_after=30)
    writer = StatsWriter(config, cat, engines=list(range(engines)), start=False)
    for e in range(engines):
        writer.counter("tokens").labels(engine=e).inc(base + e)
        writer.gauge("running").labels(engine=e).set(base * 10 + e)
        writer.histogram("latency_seconds").labels(engine=e).observe(0.2 * (e + 1))
    assert writer.flush()
    return writer


def get(base: str, path: str, accept: str | None = None) -> tuple[int, str]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def samples(text: str, *, openmetrics: bool = False) -> dict[tuple[str, tuple], float]:
    """Every sample of a body, parsed as Prometheus does: (name, labels) -> value; a name and
    labels seen twice fail (two series merged into one)."""
    out: dict[tuple[str, tuple], float] = {}
    parse = parse_openmetrics if openmetrics else text_string_to_metric_families
    for family in parse(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"{key} twice"
            out[key] = s.value
    return out


def namespace_samples(text: str, namespace: str) -> dict[tuple[str, tuple], float]:
    """The samples of *namespace* in a body of several, without the label: as its own exporter
    writes them (the volatile ones left out)."""
    out = {}
    for (name, labels), value in samples(text).items():
        found = dict(labels)
        if found.pop("redis_stats_namespace", None) == namespace and not VOLATILE.search(name):
            if name == "redis_stats_namespace_info":
                found["redis_stats_namespace"] = namespace  # its own label, in both
            out[name, tuple(sorted(found.items()))] = value
    return out


def own_samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (n, labels): v
        for (n, labels), v in samples(text).items()
        if not VOLATILE.search(n) and not n.startswith(PROCESS)
    }


def several(url: str, **options) -> Exporter:
    reader = StatsReader(StatsConfig(url=url, namespace="default"), sample_catalog())
    return Exporter(reader, port=0, self_metrics=True, **options).start()


def one(url: str, namespace: str) -> Exporter:
    reader = StatsReader(StatsConfig(url=url, namespace=namespace), sample_catalog())
    return Exporter(reader, port=0, self_metrics=True).start()


def test_each_namespace_is_served_as_its_own_exporter_serves_it(own_redis):
    writers = [write(own_redis.url, "model-a", 3, 5), write(own_redis.url, "model.b", 2, 7)]
    both = several(own_redis.url, all_namespaces=True)
    alone = {ns: one(own_redis.url, ns) for ns in ("model-a", "model.b")}
    try:
        status, doc = get(both.url, "/namespaces")
        assert status == 200 and json.loads(doc)["namespaces"] == ["model-a", "model.b"]
        for ns, single in alone.items():
            q = f"namespace={ns}"
            for path in ("/metrics", "/metrics?slice=1/2&name[]=tokens_total", "/metrics?name[]=running"):
                sep = "&" if "?" in path else "?"
                status, text = get(both.url, path + sep + q)
                assert status == 200, text
                # Every series of the namespace, labelled; the same numbers as its own exporter's.
                assert all(dict(k[1]).get("redis_stats_namespace") == ns for k in samples(text)), text
                assert namespace_samples(text, ns) == own_samples(get(single.url, path)[1]), (ns, path)
            mine, theirs = (json.loads(get(e.url, f"/load?{q}")[1]) for e in (both, single))
            for doc in (mine, theirs):
                doc.pop("time")
                for engine in doc["engines"].values():
                    engine.pop("age_seconds")
            assert mine == theirs and mine["namespace"] == ns
            snap = json.loads(get(both.url, f"/snapshot?{q}&buckets=0")[1])
            assert snap["source"]["namespace"] == ns
            own = json.loads(get(single.url, "/snapshot?buckets=0")[1])
            assert {e: v["counters"] for e, v in snap["engines"].items()} == {
                e: v["counters"] for e, v in own["engines"].items()
            }
            status, health = get(both.url, f"/healthz?{q}")
            assert status == 200 and json.loads(health)["engines_up"] == len(snap["engines"])
        # The one-namespace exporter answers ?namespace= of its own, and says which it serves.
        assert get(alone["model-a"].url, "/load?namespace=model-a")[0] == 200
        status, body = get(alone["model-a"].url, "/metrics?namespace=model.b")
        assert status == 404 and "serves namespace 'model-a' only" in body
    finally:
        for e in (both, *alone.values()):
            e.close()
        for w in writers:
            w.close()


def test_the_whole_metrics_is_one_exposition_where_two_namespaces_never_merge(own_redis):
    writers = [write(own_redis.url, "a", 2, 5), write(own_redis.url, "b", 2, 7)]
    exporter = several(own_redis.url, namespaces=["a", "b"])
    try:
        for accept in (None, OPENMETRICS):
            status, text = get(exporter.url, "/metrics", accept)
            assert status == 200
            # One TYPE line per family (a second one makes Prometheus refuse the whole scrape).
            types = re.findall(r"^# TYPE (\S+) ", text, re.M)
            assert len(types) == len(set(types)), sorted(t for t in types if types.count(t) > 1)
            found = samples(text, openmetrics=accept is not None)
            for (name, labels), _ in found.items():
                if not name.startswith(PROCESS):
                    assert dict(labels).get("redis_stats_namespace") in ("a", "b"), (name, labels)
            total = "tokens_total"  # the sample name in both formats
            tokens = {dict(k[1])["redis_stats_namespace"]: v for k, v in found.items() if k[0] == total}
            assert len(tokens) == 2
            engine0 = {
                dict(k[1])["redis_stats_namespace"]: v
                for k, v in found.items()
                if k[0] == total and dict(k[1])["engine"] == "0"
            }
            assert engine0 == {"a": 5.0, "b": 7.0}
            ups = {
                dict(k[1])["redis_stats_namespace"]: v for k, v in found.items() if k[0] == "redis_stats_up"
            }
            assert ups == {"a": 1.0, "b": 1.0}
            assert {
                dict(k[1])["redis_stats_namespace"] for k in found if k[0].startswith("redis_stats_read_")
            } == {
                "a",
                "b",
            }
        # A slice of every namespace: each engine once per namespace, over the slices.
        seen: dict[tuple[str, str], int] = {}
        for i in range(2):
            for (name, labels), _ in samples(get(exporter.url, f"/metrics?slice={i}/2")[1]).items():
                if name == "redis_stats_engine_up":
                    key = (dict(labels)["redis_stats_namespace"], dict(labels)["engine"])
                    seen[key] = seen.get(key, 0) + 1
        assert seen == {(ns, e): 1 for ns in "ab" for e in "01"}
        assert get(exporter.url, "/load")[0] == 400 and get(exporter.url, "/snapshot")[0] == 400
    finally:
        exporter.close()
        for w in writers:
            w.close()


def test_a_family_two_namespaces_declare_with_two_types_is_left_out_of_the_second(own_redis):
    other = Catalog()
    other.gauge("tokens", "Tokens as a gauge in this namespace.")  # a counter in the other
    writers = [write(own_redis.url, "a", 1, 5)]
    config = StatsConfig(url=own_redis.url, namespace="b", flush_interval=0.05)
    clash = StatsWriter(config, other, engines=[0], start=False)
    clash.gauge("tokens").labels(engine=0).set(9)
    assert clash.flush()
    exporter = several(own_redis.url, all_namespaces=True)
    try:
        status, text = get(exporter.url, "/metrics")
        assert status == 200
        found = samples(text)  # parses: one family, one type
        assert [v for (n, _), v in found.items() if n == "tokens_total"] == [5.0]
        assert not [n for n, _ in found if n == "tokens"]
        clashes = [
            v for (n, labels), v in found.items() if n == "redis_stats_exporter_family_type_clashes_total"
        ]
        assert clashes == [] or clashes == [1.0]  # counted from this scrape on
        status, text = get(exporter.url, "/metrics")
        assert samples(text)["redis_stats_exporter_family_type_clashes_total", (("family", "tokens"),)] == 2.0
        # Its own namespace's /metrics still serves it.
        assert "tokens{" in get(exporter.url, "/metrics?namespace=b")[1]
    finally:
        exporter.close()
        clash.close()
        for w in writers:
            w.close()


def _namespaces_of(text: str) -> set[str]:
    return {dict(k[1]).get("redis_stats_namespace") for k in samples(text) if k[0] == "redis_stats_up"}


def test_namespaces_appear_and_leave_while_it_runs_under_concurrent_scrapes(own_redis):
    writers = {"a": write(own_redis.url, "a", 2, 1)}
    exporter = several(own_redis.url, all_namespaces=True)
    assert exporter.app.sources.several
    exporter.app.sources.discover_every = 0.3
    errors: list[str] = []
    stop = threading.Event()

    def scrape(path: str) -> None:
        while not stop.is_set():
            status, body = get(exporter.url, path)
            if status not in (200, 404):
                errors.append(f"{path}: {status} {body[:200]}")

    threads = [
        threading.Thread(target=scrape, args=(p,))
        for p in ("/metrics", "/metrics?namespace=b", "/load?namespace=a")
    ]
    for t in threads:
        t.start()
    try:
        assert _namespaces_of(get(exporter.url, "/metrics")[1]) == {"a"}
        writers["b"] = write(own_redis.url, "b", 3, 2)  # a model deployed
        deadline = time.monotonic() + 5
        while _namespaces_of(get(exporter.url, "/metrics")[1]) != {"a", "b"}:
            assert time.monotonic() < deadline, "b never appeared"
            time.sleep(0.1)
        assert get(exporter.url, "/metrics?namespace=b")[0] == 200
        writers.pop("a").close()  # a model removed: its writers gone, then its keys
        config = StatsConfig(url=own_redis.url, namespace="a")
        assert remove_namespace(config).keys > 0
        deadline = time.monotonic() + 5
        while _namespaces_of(get(exporter.url, "/metrics")[1]) != {"b"}:
            assert time.monotonic() < deadline, "a never left"
            time.sleep(0.1)
        status, body = get(exporter.url, "/metrics?namespace=a")
        assert status == 404 and "holds nothing" in body
        views = samples(get(exporter.url, "/metrics")[1])["redis_stats_exporter_namespace_views", ()]
        assert views == 1.0  # a's view went with it
    finally:
        stop.set()
        for t in threads:
            t.join()
        exporter.close()
        for w in writers.values():
            w.close()
    assert not errors, errors[:5]


def test_at_most_max_namespaces_are_served_and_the_others_are_said(own_redis, caplog):
    writers = [write(own_redis.url, ns, 1, i) for i, ns in enumerate(("a", "b", "c"))]
    exporter = several(own_redis.url, all_namespaces=True, max_namespaces=2)
    try:
        status, text = get(exporter.url, "/metrics")
        assert _namespaces_of(text) == {"a", "b"}
        found = samples(text)
        assert found["redis_stats_exporter_namespaces", (("state", "over_limit"),)] == 1.0
        assert found["redis_stats_exporter_namespaces", (("state", "served"),)] == 2.0
        status, body = get(exporter.url, "/metrics?namespace=c")
        assert status == 404 and "max_namespaces=2" in body
        assert any("not serving c" in r.getMessage() for r in caplog.records)
        with pytest.raises(ValueError, match="more than max_namespaces=2"):
            several(own_redis.url, namespaces=["a", "b", "c"], max_namespaces=2)
    finally:
        exporter.close()
        for w in writers:
            w.close()


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/metrics?namespace=a%20b", 400, "is not a namespace name"),
        ("/metrics?namespace=a&namespace=b", 400, "given 2 times"),
        ("/metrics?namespace={x}", 400, "is not a namespace name"),
        ("/load?namespace=zz", 404, "not 'zz'"),
        ("/snapshot", 400, "give ?namespace=NS"),
        ("/load", 400, "give ?namespace=NS"),
    ],
)
def test_a_bad_namespace_parameter_gets_a_clear_answer(own_redis, path, status, says):
    writers = [write(own_redis.url, "a", 1, 1)]
    exporter = several(own_redis.url, namespaces=["a", "b"])
    try:
        got, body = get(exporter.url, path)
        assert got == status and says in json.loads(body)["error"], body
    finally:
        exporter.close()
        writers[0].close()


def _commands_on(client: redis.Redis, seconds: float, act) -> list[str]:
    """The commands Redis ran while *act* ran and for *seconds* after (MONITOR)."""
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:
            ready.set()
            for command in monitor.listen():
                seen.append(command["command"])
                if done.is_set():
                    return

    ready = threading.Event()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ready.wait(5)
    act()
    time.sleep(seconds)
    done.set()
    client.ping()  # one more command: the monitor sees it and ends
    watcher.join(5)
    return seen


def test_a_namespace_nobody_asks_for_costs_no_read_and_an_unused_view_is_dropped(own_redis, monkeypatch):
    writers = [write(own_redis.url, "a", 2, 1), write(own_redis.url, "b", 2, 2)]
    monkeypatch.setattr(sampler, "SAMPLER_IDLE", 0.5)
    monkeypatch.setattr(sampler, "SAMPLER_IDLE_WINDOWS", 1)
    exporter = several(own_redis.url, namespaces=["a", "b"], load_refresh=0.05, load_idle=0.5, window=1.0)
    assert exporter.app.sources.several
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    try:

        def ask_a() -> None:
            for path in ("/metrics?namespace=a", "/load?namespace=a", "/snapshot?namespace=a", "/healthz"):
                assert get(exporter.url, path)[0] == 200, path

        seen = _commands_on(client, 1.0, ask_a)
        assert any("rs:{a}" in c for c in seen), seen[:20]
        assert not [c for c in seen if "rs:{b}" in c], "namespace b was read though nobody asked"
        assert exporter.app.sources.known() == ["a", "b"]
        assert set(exporter.app.sources._sources) == {"a"}
        # a's own background reads stop once nobody asks: the load refresher and the sampler.
        time.sleep(1.5)
        quiet = _commands_on(client, 1.5, lambda: None)
        assert not [c for c in quiet if "rs:{a}" in c], quiet[:20]
        # An unused view is dropped (the next request of any namespace sweeps), made again when asked.
        exporter.app.sources.idle = 0.2
        time.sleep(0.3)
        assert get(exporter.url, "/metrics?namespace=b")[0] == 200
        assert set(exporter.app.sources._sources) == {"b"}
        assert get(exporter.url, "/load?namespace=a")[0] == 200
    finally:
        client.close()
        exporter.close()
        for w in writers:
            w.close()


def test_all_namespaces_with_a_reader_user_without_scan_says_why_and_the_given_ones_still_work(own_redis):
    writers = [write(own_redis.url, "a", 1, 1), write(own_redis.url, "b", 1, 2)]
    admin = redis.Redis.from_url(own_redis.url)
    # The one-namespace reader rules of docs/acl.md, for a and b: no +scan.
    admin.execute_command(
        "ACL",
        "SETUSER",
        "two",
        *acl.rules("a", "pw", acl.READER, read_only=True),
        "%R~rs:{b}:*",
        "%R~rs:{b#*}:*",
    )
    admin.execute_command("ACL", "SETUSER", "every", *acl.every_namespace_rules("pw2"))
    host_port = own_redis.url.removeprefix("redis://")
    try:
        without_scan = several(f"redis://two:pw@{host_port}", all_namespaces=True)
        try:
            status, text = get(without_scan.url, "/metrics")
            assert status == 200
            found = samples(text)
            assert found["redis_stats_exporter_namespace_scan_errors_total", (("kind", "noperm"),)] >= 1
            assert _namespaces_of(text) == set()
        finally:
            without_scan.close()
        given = several(f"redis://two:pw@{host_port}", namespaces=["a", "b"])
        every = several(f"redis://every:pw2@{host_port}", all_namespaces=True)
        try:
            for e in (given, every):
                status, text = get(e.url, "/metrics")
                assert _namespaces_of(text) == {"a", "b"}
                assert samples(text)["redis_stats_up", (("redis_stats_namespace", "b"),)] == 1.0
        finally:
            given.close()
            every.close()
    finally:
        admin.close()
        for w in writers:
            w.close()


def test_the_command_serves_several_namespaces_and_refuses_what_cannot_go_together(own_redis):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    writers = [write(own_redis.url, "a", 1, 1), write(own_redis.url, "b", 1, 2)]
    env = {**os.environ, "REDIS_STATS_URL": own_redis.url, "REDIS_STATS_NAMESPACE": "a b"}
    command = [sys.executable, "-m", "redis_stats", "exporter", "--port", "0", "--gc-interval", "0"]
    try:
        for extra, served in ((["--all-namespaces"], "every namespace"), ([], "namespaces a, b")):
            # REDIS_STATS_NAMESPACE="a b": two namespaces; ignored by --all-namespaces.
            proc = subprocess.Popen([*command, *extra], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
            try:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                assert f"serving {served} from" in line, line
                base = re.search(r"on (http://[\d.]+:\d+)/metrics", line).group(1)  # type: ignore[union-attr]
                assert json.loads(get(base, "/namespaces")[1])["namespaces"] == ["a", "b"]
                assert _namespaces_of(get(base, "/metrics")[1]) == {"a", "b"}
            finally:
                proc.terminate()
                assert proc.wait(10) == 0
        for extra, says in (
            (["--all-namespaces", "--namespace", "a"], "--all-namespaces and --namespace"),
            (
                ["--namespace", "a", "--namespace", "b", "--slice", "0/2"],
                "--slice serves part of one namespace",
            ),
            (
                ["--namespace", "a", "--namespace", "b", "--max-namespaces", "1"],
                "more than --max-namespaces 1",
            ),
        ):
            done = subprocess.run(
                [*command, *extra], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 2 and says in done.stderr, done.stderr
    finally:
        for w in writers:
            w.close()
