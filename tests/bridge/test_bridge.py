"""The bridge against real HTTP sources (prometheus_client on loopback) and a real Redis: the store's
view equals each source's body after every scrape, and a source that misbehaves costs only itself."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redis_stats.connection import make_client
from redis_stats.integrations.bridge import Bridge, BridgedSource, exact_amounts, parse_body
from redis_stats.integrations.bridge.fetch import ACCEPT
from redis_stats.tools.embedded import free_port
from tests.conftest import ROOT

from .compare import get, self_metric, source_samples, store_samples, store_text

FORMATS = {"text": ACCEPT["text"], "openmetrics": ACCEPT["openmetrics"]}


def assert_view_equals(cfg, url, accept, *, offset=0, engine_label=None, include="*"):
    body, ct = get(url, accept)
    want = source_samples(body, ct, offset=offset, engine_label=engine_label, include=include)
    engines = {dict(k[1])["engine"] for k in want}
    got = store_samples(cfg, include=include, engines=engines)
    assert got == want
    return want


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sglang_view_equals_the_source_after_every_scrape(cfg, inproc, fmt):
    cat, url = inproc("sglang")
    source = BridgedSource(url, cfg, accept=fmt)
    for _ in range(6):
        cat.step(3)  # fractional counter increments and observations: float totals
        assert source.scrape(), source.stats
        want = assert_view_equals(cfg, url, FORMATS[fmt])
    assert any(name.startswith("sglang:") and name.endswith("_bucket") for name, _ in want)
    assert source.stats.incarnations == 1 and not source.stats.errors
    source.close()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_vllm_shaped_two_engines_keep_their_engine_label_and_offset(cfg, inproc, fmt):
    cat, url = inproc("vllm", engines=2)
    source = BridgedSource(url, cfg.replace(engine_offset=4), engine_label="engine", accept=fmt)
    for _ in range(3):
        cat.step(2)
        assert source.scrape(), source.stats
        want = assert_view_equals(cfg, url, FORMATS[fmt], offset=4, engine_label="engine")
    assert {dict(k[1])["engine"] for k in want} == {"4", "5"}
    assert self_metric(cfg, None, "redis_stats_engine_up", engine="5") == 1.0
    source.close()


def test_naive_differences_would_not_be_exact():
    """What exact_amounts is for: at a rounding tie no single amount lands on the value
    (32.6256... -> 181.9662..., met by test_vllm_shaped_two_engines...), so recording the naive
    difference leaves the stored sum an ulp off."""
    old, new = 32.62560105106691, 181.9662369433216
    amount, rest = exact_amounts(old, new)
    assert old + (new - old) != new
    assert rest and old + amount != new and (old + amount) + rest == new


@given(st.floats(0, 1e300), st.floats(0, 1e300))
def test_exact_amounts_land_on_the_target(a, b):
    total, target = min(a, b), max(a, b)
    amount, rest = exact_amounts(total, target)
    assert amount >= 0 and rest >= 0 and (total + amount) + rest == target


@given(st.integers(0, 2**53), st.floats(0, 2.0**52))
def test_exact_amounts_from_an_int_total(total, target):
    target = max(target, float(total))
    amount, rest = exact_amounts(total, target)
    assert (total + amount) + rest == target


def test_restart_is_a_new_incarnation_and_counters_never_go_back(cfg, helpers):
    h = helpers(seed=1)
    source = BridgedSource(h.url, cfg)
    h.call("/step?n=5")
    assert source.scrape()
    first = store_samples(cfg)
    first_writer = source.writer.writer_id
    h.kill()
    h2 = helpers(port=h.port, seed=2)  # a new run on the same port: its counters start again
    h2.call("/step?n=1")
    assert source.scrape()
    assert source.stats.incarnations == 2 and source.writer.writer_id != first_writer
    now = store_samples(cfg)
    body, ct = get(h2.url, ACCEPT["text"])
    fresh = source_samples(body, ct)
    for key, value in fresh.items():
        name = key[0]
        if name.endswith(("_total", "_bucket", "_count")):
            # the old run's totals stay (its writer is closed), the new run's add to them
            assert now[key] == first.get(key, 0) + value
            assert now[key] >= first.get(key, 0)
        elif name.startswith("sglang:num_"):  # a gauge: only the live writer's value
            assert now[key] == value
    assert self_metric(cfg, None, "redis_stats_writer_up", writer=first_writer) in (None, 0.0)  # closed
    assert self_metric(cfg, None, "redis_stats_writer_up", writer=source.writer.writer_id) == 1.0
    source.close()


def _wait(predicate, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


@pytest.mark.parametrize("fault", ["down", "hang"])
def test_a_failing_source_reads_down_within_stale_after_the_others_go_on(cfg, helpers, inproc, fault):
    cfg = cfg.replace(stale_after=1.5)
    bad = helpers(seed=3)
    cat, good_url = inproc("sglang")
    sources = [
        BridgedSource(bad.url, cfg, timeout=0.5),
        BridgedSource(good_url, cfg.replace(engine_offset=1)),
    ]
    with Bridge(sources, interval=0.2):
        _wait(lambda: self_metric(cfg, None, "redis_stats_engine_up", engine="1") == 1.0, 5)
        _wait(lambda: self_metric(cfg, None, "redis_stats_engine_up", engine="0") == 1.0, 5)
        writer = sources[0].writer.writer_id
        if fault == "down":
            bad.kill()
        else:
            os.kill(bad.proc.pid, signal.SIGSTOP)
        took = _wait(lambda: self_metric(cfg, None, "redis_stats_engine_up", engine="0") == 0.0, 5)
        assert took < cfg.stale_after + 3.0  # down within stale_after; a margin no machine misses
        # the other source goes on: its new traffic reaches the view
        cat.step(5)
        _wait(lambda: store_samples(cfg, engines={"1"}) == _want(good_url), 3)
        assert self_metric(cfg, None, "redis_stats_engine_up", engine="1") == 1.0
        assert sources[0].stats.errors[{"down": "down", "hang": "timeout"}[fault]] >= 1
        if fault == "hang":  # it comes back as the same run: the same writer
            os.kill(bad.proc.pid, signal.SIGCONT)
            _wait(lambda: self_metric(cfg, None, "redis_stats_engine_up", engine="0") == 1.0, 5)
            assert sources[0].writer.writer_id == writer and sources[0].stats.incarnations == 1


def _want(url: str, offset: int = 1):
    body, ct = get(url, ACCEPT["text"])
    return source_samples(body, ct, offset=offset)


@pytest.mark.parametrize(
    ("mode", "fmt", "reason"),
    [
        ("garbage", "text", "garbage"),
        ("garbage", "openmetrics", "garbage"),
        ("truncated", "text", "truncated"),
        ("truncated", "openmetrics", "truncated"),
        ("huge", "text", "too_large"),
        ("typechange", "text", "definition"),
        ("html", "text", "content_type"),
        ("json", "text", "json"),
        ("json_as_text", "openmetrics", "json"),
    ],
)
def test_a_bad_body_is_refused_counted_and_logged_once_and_stores_nothing(
    cfg, helpers, caplog, mode, fmt, reason
):
    h = helpers(seed=4)
    source = BridgedSource(h.url, cfg, accept=fmt, max_bytes=1024 * 1024)
    h.call("/step?n=2")
    assert source.scrape()
    before = store_samples(cfg)
    writer = source.writer.writer_id
    h.call("/step?n=2")
    h.call(f"/mode?m={mode}")
    with caplog.at_level(logging.INFO, logger="redis_stats.bridge"):
        assert not source.scrape()
        assert not source.scrape()
    assert store_samples(cfg) == before  # nothing of the bad body was stored
    assert source.stats.errors == {reason: 2}
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and reason in warnings[0].getMessage(), [r.getMessage() for r in warnings]
    h.call("/mode?m=normal")
    assert source.scrape()
    assert source.writer.writer_id == writer  # not a restart
    assert_view_equals(cfg, h.url, FORMATS[fmt])
    dropped = self_metric(
        cfg, None, "redis_stats_writer_dropped_updates_total", writer=writer, reason=f"scrape_{reason}"
    )
    assert dropped == 2.0
    source.close()


def test_a_json_body_says_it_is_json_and_where_trtllm_serve_serves_prometheus_text(cfg, helpers, caplog):
    """trtllm-serve's /metrics is a JSON stats queue that each read consumes: the refusal says
    which URL answered JSON, and that /prometheus/metrics is the one to bridge."""
    h = helpers(seed=5)
    h.call("/mode?m=json")
    source = BridgedSource(h.url, cfg)
    with caplog.at_level(logging.WARNING, logger="redis_stats.bridge"):
        assert not source.scrape()
    assert source.stats.errors == {"json": 1} and source.writer is None
    message = source.stats.last_error
    for part in (
        h.url,
        "answered JSON",
        "application/json",
        "trtllm-serve",
        "/prometheus/metrics",
        "consumed",
    ):
        assert part in message, (part, message)
    assert [r for r in caplog.records if "answered JSON" in r.getMessage()]
    assert not store_samples(cfg)


def test_label_churn_new_series_stored_and_vanished_ones_keep_their_last_value(cfg, inproc):
    cat, url = inproc("sglang")
    source = BridgedSource(url, cfg)
    assert source.scrape()
    before = store_samples(cfg, include="sglang:lora*")
    for _ in range(3):
        cat.churn()
        assert source.scrape()
        assert_view_equals(cfg, url, ACCEPT["text"], include="sglang:num_*")
    now = store_samples(cfg, include="sglang:lora*")
    body, ct = get(url, ACCEPT["text"])
    current = source_samples(body, ct, include="sglang:lora*")
    assert current.items() <= now.items()  # every series the source shows now
    assert before.items() <= now.items()  # and the vanished first one, at its last value
    assert not source.stats.errors and source.stats.incarnations == 1
    source.close()


def test_a_password_in_the_source_url_appears_in_no_output(cfg, inproc, caplog, capsys):
    secret = "s3cr3t-Pa55"
    _cat, url = inproc("sglang", auth=f"scraper:{secret}")
    authed = url.replace("http://", f"http://scraper:{secret}@") + f"?token={secret}x"
    with caplog.at_level(logging.DEBUG):
        source = BridgedSource(authed, cfg)
        assert source.scrape(), source.stats  # the Basic auth was sent
        wrong = BridgedSource(url.replace("http://", "http://scraper:wrong-" + secret + "@"), cfg)
        assert not wrong.scrape() and wrong.stats.errors == {"http": 1}
        port = free_port()
        down = BridgedSource(f"http://u:{secret}@127.0.0.1:{port}/metrics?auth={secret}", cfg)
        assert not down.scrape()
        for s in (source, wrong, down):
            s.close()
    texts = [r.getMessage() for r in caplog.records] + [repr(source), repr(wrong), repr(down)]
    texts += [str(s.stats) for s in (source, wrong, down)] + [store_text(cfg)]
    client = make_client(cfg)
    for key in client.keys("*"):
        kind = client.type(key)
        texts.append(repr(client.hgetall(key) if kind in (b"hash", "hash") else client.dump(key)))
    out = capsys.readouterr()
    texts += [out.out, out.err]
    assert all(secret not in t for t in texts)
    assert any("scraper:***@" in t for t in texts)


def test_cli_bridges_an_sglang_source_until_its_duration(cfg, inproc, tmp_path):
    cat, url = inproc("sglang")
    cat.step(3)
    env = {
        **os.environ,
        "REDIS_STATS_URL": cfg.url,
        "REDIS_STATS_NAMESPACE": cfg.namespace,
        "REDIS_STATS_FLUSH_INTERVAL": "0.2",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "redis_stats",
            "bridge",
            "--source",
            url,
            "--engine-offset",
            "3",
            "--duration",
            "1.5",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"bridging {url}" in done.stdout and "(engine offset 3)" in done.stdout
    body, ct = get(url, ACCEPT["text"])
    totals = ("_total", "_bucket", "_count", "_sum")
    want = {k: v for k, v in source_samples(body, ct, offset=3).items() if k[0].endswith(totals)}
    assert want and {k: v for k, v in store_samples(cfg).items() if k[0].endswith(totals)} == want
    # closed on exit (not merely silent: stale_after is 30 s): its counters stay, its gauges and
    # self-metrics no longer show
    assert self_metric(cfg, None, "redis_stats_writer_up") in (None, 0.0)
    assert not [k for k in store_samples(cfg) if k[0] == "sglang:num_running_reqs"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "at least one --source"),
        (["--source", "ftp://x/metrics"], "must be an http:// or https:// URL"),
        (["--source", "http://a/m", "--source", "http://b/m", "--engine-offset", "0", "--engine-offset", "1",
          "--engine-offset", "2"], "3 --engine-offset values for 2 sources"),
    ],
)  # fmt: skip
def test_cli_usage_errors_say_what_to_do(args, message):
    from click.testing import CliRunner

    from redis_stats.tools.cli import main

    result = CliRunner().invoke(main, ["bridge", "--redis-url", "redis://127.0.0.1:1/0", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_engine_label_that_is_not_an_index_refuses_the_body():
    body = b'# TYPE x gauge\nx{engine="zero"} 1\n'
    with pytest.raises(ValueError, match="not an engine index"):
        parse_body(body, "text/plain; version=0.0.4", engine_label="engine")


def test_series_twice_and_non_cumulative_buckets_are_refused():
    twice = b'# TYPE x gauge\nx{a="1"} 1\nx{a="1"} 2\n'
    with pytest.raises(ValueError, match="twice"):
        parse_body(twice, None)
    bad = b'# TYPE h histogram\nh_bucket{le="1"} 5\nh_bucket{le="+Inf"} 3\nh_count 3\nh_sum 1\n'
    with pytest.raises(ValueError, match="cumulative"):
        parse_body(bad, None)
    assert math.isfinite(1.0)


@pytest.mark.parametrize("how", ["closed", "crashed"])
def test_a_restarted_bridge_continues_its_predecessor_and_counts_nothing_twice(cfg, inproc, how, caplog):
    cat, url = inproc("sglang")
    first = BridgedSource(url, cfg)
    cat.step(3)
    assert first.scrape()
    old_writer = first.writer.writer_id
    if how == "closed":
        first.close()
    # else: the process died, its writer neither closed nor collected
    cat.step(2)
    with caplog.at_level(logging.WARNING, logger="redis_stats.bridge"):
        second = BridgedSource(url, cfg)  # a new bridge process for the same source
        assert second.scrape()
    assert second.writer.writer_id != old_writer
    assert any(old_writer in r.getMessage() for r in caplog.records)
    body, ct = get(url, ACCEPT["text"])
    want = source_samples(body, ct)
    got = store_samples(cfg)
    totals = ("_total", "_bucket", "_count")
    assert {k: v for k, v in got.items() if k[0].endswith(totals)} == {
        k: v for k, v in want.items() if k[0].endswith(totals)
    }
    for key, value in want.items():  # float sums: the two writers' parts add up to the source's
        if key[0].endswith("_sum"):
            assert got[key] == pytest.approx(value, rel=1e-12)
    cat.step(1)
    assert second.scrape()
    assert_totals_close(cfg, url)
    second.close()


def assert_totals_close(cfg, url):
    body, ct = get(url, ACCEPT["text"])
    want = source_samples(body, ct)
    got = store_samples(cfg)
    for key, value in want.items():
        if key[0].endswith(("_total", "_bucket", "_count", "_sum")):
            assert got[key] == pytest.approx(value, rel=1e-12), key


def test_a_restarted_bridge_whose_source_restarted_too_starts_from_zero(cfg, helpers):
    h = helpers(seed=6)
    h.call("/step?n=5")
    first = BridgedSource(h.url, cfg)
    assert first.scrape()
    before = store_samples(cfg)
    first.close()
    h.kill()
    h2 = helpers(port=h.port, seed=7)  # the source restarted while no bridge ran
    second = BridgedSource(h2.url, cfg)
    assert second.scrape()
    body, ct = get(h2.url, ACCEPT["text"])
    fresh = source_samples(body, ct)
    now = store_samples(cfg)
    for key, value in fresh.items():
        if key[0].endswith(("_total", "_bucket", "_count")):
            assert now[key] == before.get(key, 0) + value
    second.close()


def test_a_sharded_namespace_holds_each_engine_in_its_shard(cfg, inproc):
    cfg = cfg.replace(shards=2)
    cat, url = inproc("vllm", engines=2)
    source = BridgedSource(url, cfg, engine_label="engine")
    for _ in range(2):
        cat.step(1)
        assert source.scrape(), source.stats
        assert_view_equals(cfg, url, ACCEPT["text"], engine_label="engine")
    source.close()
    # a bridge restarted on a sharded namespace finds its predecessor's chunks in both shards
    cat.step(1)
    again = BridgedSource(url, cfg, engine_label="engine")
    assert again.scrape()
    body, ct = get(url, ACCEPT["text"])
    want = source_samples(body, ct, engine_label="engine")
    got = store_samples(cfg)
    for key, value in want.items():
        if key[0].endswith(("_total", "_bucket", "_count")):
            assert got[key] == value, key
    again.close()


@given(st.binary(max_size=400), st.sampled_from([None, "text/plain", "application/openmetrics-text"]))
def test_any_bytes_parse_or_are_refused_with_a_reason(data, content_type):
    try:
        parse_body(data, content_type, engine_label="engine")
    except ValueError as exc:
        assert getattr(exc, "reason", None) in {"garbage", "truncated", "engine_label", "json"}, exc


@given(
    st.text(
        alphabet=st.sampled_from(list('# TYPEHELPcountergaugehistogram_bucketle="+Inf"{}=,01.5e\n x')),
        max_size=300,
    )
)
def test_metrics_like_text_parses_or_is_refused_with_a_reason(text):
    try:
        parse_body(text.encode(), "text/plain; version=0.0.4", engine_label="engine")
    except ValueError as exc:
        assert getattr(exc, "reason", None) in {"garbage", "truncated", "engine_label", "json"}, exc


def test_sigterm_closes_the_writers_and_exits_0(cfg, inproc):
    _cat, url = inproc("sglang")
    env = {
        **os.environ,
        "REDIS_STATS_URL": cfg.url,
        "REDIS_STATS_NAMESPACE": cfg.namespace,
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "redis_stats", "bridge", "--source", url, "--interval", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(lambda: self_metric(cfg, None, "redis_stats_writer_up") == 1.0, 30)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    # closed, not merely silent (stale_after is 30 s): its gauges no longer show, its counters stay
    assert self_metric(cfg, None, "redis_stats_writer_up") in (None, 0.0)
    stored = store_samples(cfg)
    assert not [k for k in stored if k[0] == "sglang:num_running_reqs"]
    assert [k for k in stored if k[0] == "sglang:prompt_tokens_total"]


def test_cli_source_file_keeps_the_password_out_of_the_command_line_and_output(cfg, inproc, tmp_path):
    secret = "fil3-s3cret"
    _cat, url = inproc("sglang", auth=f"u:{secret}")
    path = tmp_path / "sources"
    path.write_text("# the vLLM node\n" + url.replace("http://", f"http://u:{secret}@") + "\n")
    env = {
        **os.environ,
        "REDIS_STATS_URL": cfg.url,
        "REDIS_STATS_NAMESPACE": cfg.namespace,
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "redis_stats", "bridge", "--source-file", str(path), "--duration", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout + done.stderr and "u:***@" in done.stdout
    assert [k for k in store_samples(cfg) if k[0] == "sglang:prompt_tokens_total"]  # stored


def test_a_series_the_store_cannot_take_costs_that_series_not_the_body():
    """A source counter at +Inf, or a histogram that observed a NaN or an infinity (both taken by
    prometheus_client), refused the whole body: nothing stored, every engine of the source read
    down (found by tests/store/test_every_view.py). Each such series is left out and said."""
    histograms = "".join(
        f'h_bucket{{a="{a}",le="1.0"}} {low}\nh_bucket{{a="{a}",le="+Inf"}} 1.0\n'
        f'h_count{{a="{a}"}} 1.0\nh_sum{{a="{a}"}} {total}\n'
        for a, low, total in (("nan", 0.0, "NaN"), ("inf", 0.0, "+Inf"), ("ok", 1.0, "0.5"))
    )
    counters = '# TYPE c_total counter\nc_total{a="bad"} +Inf\nc_total{a="ok"} 5.0\n'
    text = counters + "# TYPE h histogram\n" + histograms
    body = parse_body(text.encode(), "text/plain; version=0.0.4")
    assert body.families["c"].series == {(0, ("ok",)): 5}
    assert list(body.families["h"].series) == [(0, ("ok",))]
    assert set(body.skipped) == {"c{'a': 'bad'}", "h{'a': 'nan'}", "h{'a': 'inf'}"}
