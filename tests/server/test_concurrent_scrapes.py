"""Several Prometheus servers scrape one exporter at once (the high-availability setup): every body
must be complete and consistent while writers flush, and identical to a lone scrape when the data
stands still. Bodies are compared line by line, not only parsed: prometheus_client's parser
accepts a body that holds a series twice."""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_stats import StatsConfig, StatsReader, StatsWriter
from redis_stats.server import Exporter
from tests.conftest import sample_catalog
from tests.server import states

ENGINES = range(16)
SCRAPERS = 4
# Families whose values move with the clock between two scrapes of unchanged data.
VOLATILE = (
    "redis_stats_read_duration_seconds",
    "redis_stats_engine_data_age_seconds",
    "redis_stats_writer_last_flush_age_seconds",
    "redis_stats_store_used_memory_bytes",
)


def series_lines(body: str) -> list[tuple[str, str]]:
    """(series, value) of every sample line."""
    out = []
    for line in body.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out.append((series, value))
    return out


def static_part(body: str) -> str:
    return "".join(line + "\n" for line in body.splitlines() if not line.startswith(VOLATILE))


def problems(body: str, reference_series: set[str]) -> list[str]:
    """What is wrong with one body (empty when it is complete and consistent)."""
    lines = series_lines(body)
    found = [s for s, _ in lines]
    wrong = [f"twice: {s}" for s, n in Counter(found).items() if n > 1]
    if set(found) != reference_series:
        missing, extra = reference_series - set(found), set(found) - reference_series
        wrong.append(f"missing {sorted(missing)[:3]} extra {sorted(extra)[:3]}")
    values = dict(lines)
    for e in ENGINES:
        # Each of the two writers sets inflight (sum) to 1, peak (max) and floor (min) to e + i.
        expected = {
            f'inflight{{engine="{e}"}}': "2",
            f'peak{{engine="{e}"}}': str(e + 1),
            f'floor{{engine="{e}"}}': str(e),
        }
        for series, value in expected.items():
            if series in values and float(values[series]) != float(value):
                wrong.append(f"{series} = {values[series]}, want {value}")
        inf = values.get(f'latency_seconds_bucket{{engine="{e}",le="+Inf"}}')
        if inf != values.get(f'latency_seconds_count{{engine="{e}"}}'):
            wrong.append(f"engine {e}: +Inf bucket {inf} != count")
    samples = sum(len(f.samples) for f in text_string_to_metric_families(body))
    if samples != len(lines):
        wrong.append(f"parser saw {samples} samples in {len(lines)} lines")
    return wrong


def scrape_for(url: str, seconds: float) -> list[str]:
    """Bodies of /metrics from SCRAPERS threads scraping for *seconds*."""
    bodies: list[str] = []
    failures: list[BaseException] = []
    deadline = time.monotonic() + seconds

    def scraper() -> None:
        try:
            while time.monotonic() < deadline:
                with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
                    bodies.append(resp.read().decode())
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=scraper) for _ in range(SCRAPERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    return bodies


@pytest.fixture
def fast_thread_switches():
    """Threads switch every 10 us instead of 5 ms: a render shorter than one switch interval would
    hide its races on an idle machine, not on a loaded one."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def test_concurrent_scrapes_are_complete_and_equal_a_lone_scrape(
    redis_server, namespace, fast_thread_switches
):
    cfg = StatsConfig(url=redis_server.url, namespace=namespace, stale_after=120)
    catalog = sample_catalog()
    writers = [StatsWriter(cfg, catalog, engines=list(ENGINES), start=False) for _ in range(2)]

    def record() -> None:
        for i, w in enumerate(writers):
            for e in ENGINES:
                w.counter("requests").labels(engine=e, reason="stop").inc()
                w.counter("tokens").labels(engine=e).inc(3)
                w.gauge("running").labels(engine=e).set(e * 10 + i)
                w.gauge("inflight").labels(engine=e).set(1)
                w.gauge("peak").labels(engine=e).set(e + i)
                w.gauge("floor").labels(engine=e).set(e + i)
                w.histogram("latency_seconds").labels(engine=e).observe(0.3 * (i + 1))
            assert w.flush()

    record()
    exporter = Exporter(StatsReader(cfg, catalog), port=0).start()
    stop = threading.Event()

    def keep_writing() -> None:
        while not stop.is_set():
            record()

    try:
        reference = states.source(exporter).collector.render_text()
        reference_series = {s for s, _ in series_lines(reference)}
        assert not problems(reference, reference_series)
        writing = threading.Thread(target=keep_writing)
        writing.start()
        try:
            busy = scrape_for(exporter.url, 10.0)
        finally:
            stop.set()
            writing.join()
        bad = [(b, p) for b in busy if (p := problems(b, reference_series))]
        print(f"\nwhile writers flush: {len(bad)} bad bodies of {len(busy)}")
        assert not bad, bad[0][1][:5]

        # The data stands still now: every body equals one scraped alone, byte for byte.
        alone = static_part(states.source(exporter).collector.render_text())
        still = scrape_for(exporter.url, 4.0)
        differ = [b for b in still if static_part(b) != alone]
        print(f"static data: {len(differ)} of {len(still)} bodies differ from a lone scrape")
        assert not differ
        assert len(busy) >= 4 * SCRAPERS and len(still) >= SCRAPERS
    finally:
        exporter.close()
        for w in writers:
            w.close()


def test_a_read_overtaken_by_another_checks_its_reply_against_its_own_plan(config, catalog, fake_client):
    """Two scrapes share one reader: one that planned its transaction before the engine list
    grew, and finished after another scrape re-planned, must not take the new plan for its own
    (it would pair engine 1 with another key's hash)."""
    first = StatsWriter(config, catalog, engines=[0], client=fake_client(), start=False)
    first.counter("tokens").labels(engine=0).inc(5)
    assert first.flush()
    reader = StatsReader(config, catalog, client=fake_client())
    reader.read()  # plans engine 0
    second = StatsWriter(config, catalog, engines=[1], client=fake_client(), start=False)
    second.counter("tokens").labels(engine=1).inc(7)
    assert second.flush()

    transaction, overtaken = reader._transaction, []

    def overtaken_once(cmds):
        results = transaction(cmds)
        if not overtaken:
            overtaken.append(True)
            reader.read()  # another thread's scrape runs to its end in between
        return results

    reader._transaction = overtaken_once
    snap = reader.snapshot()
    assert overtaken
    assert {e: s.counter("tokens") for e, s in snap.engines.items()} == {0: 5.0, 1: 7.0}
    assert not snap.skipped


def test_a_read_that_planned_before_a_catalogue_change_keeps_the_newer_catalogue(
    config, catalog, fake_client
):
    """Scrape A read while the stored catalogue was at version 1 (so without the catalogue
    itself); scrape B read and decoded version 2 first. A must not drop the stored catalogue: its
    metrics would vanish from A's body (and the catalogue be fetched again)."""
    from redis_stats import Catalog

    theirs = Catalog()
    theirs.counter("extra", "A metric only the writers define.")
    writer = StatsWriter(config, theirs, engines=[0], client=fake_client(), start=False)
    writer.counter("extra").labels(engine=0).inc(4)
    assert writer.flush()
    reader = StatsReader(config, catalog, client=fake_client())
    assert reader.snapshot().engines[0].counter("extra") == 4.0  # the stored catalogue, version 1
    late = reader.read()  # scrape A: version 1, the decoder has it, so no catalogue in the reply

    newer = Catalog()
    newer.counter("extra", "A metric only the writers define.")
    newer.counter("extra2", "Defined later.")
    other = StatsWriter(config, newer, engines=[0], client=fake_client(), start=False)
    other.counter("extra2").labels(engine=0).inc(1)
    assert other.flush()
    assert reader.snapshot().engines[0].counter("extra2") == 1.0  # scrape B: version 2

    snap = reader.decode(late)
    assert snap.engines[0].counter("extra") == 4.0
    assert not snap.skipped
    assert reader.snapshot().engines[0].counter("extra2") == 1.0
