"""The public types say what a series can do: mypy refuses ``observe`` on a counter's series."""

import textwrap

from mypy import api


def test_a_bound_series_is_typed_by_its_metric_kind(tmp_path):
    user = tmp_path / "user_code.py"
    user.write_text(
        textwrap.dedent(
            """
            from redis_stats import StatsWriter

            def record(writer: StatsWriter) -> None:
                writer.counter("tokens").labels(engine=0).inc(5)
                writer.gauge("running").labels(engine=0).set(3)
                writer.histogram("latency").labels(engine=0).observe(0.1)
                writer.counter("tokens").labels(engine=0).observe(0.1)  # not a histogram
            """
        )
    )
    out, _, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir=/dev/null", "--config-file=", str(user)]
    )
    assert status == 1, out
    # Only the user's file: the package itself is checked by `make lint` with its own settings.
    errors = [line for line in out.splitlines() if line.startswith(str(user)) and ": error:" in line]
    wrong = next(i for i, line in enumerate(user.read_text().splitlines(), 1) if "not a histogram" in line)
    assert len(errors) == 1 and f":{wrong}:" in errors[0], out
    assert '"CounterSeries" has no attribute "observe"' in errors[0], out
