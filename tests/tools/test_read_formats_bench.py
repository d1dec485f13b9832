"""bench/read_formats.py reads the reader's internals (the bulk merge, the decoder's layouts): a
change there must not leave the measured candidates of docs/key-schema.md unreproducible."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# "<scale>  <form>  <us per engine>  <x schema 1>  <stored bytes>"
ROW = re.compile(r"^\s*(\d+)  (.+?)\s+(\d+\.\d)\s+(\d+\.\d\d)\s+(\d+)$")


def test_read_formats_bench_runs_every_form_at_every_scale() -> None:
    bench = ROOT / "bench" / "read_formats.py"
    args = ["--engines", "2", "--rounds", "1", "--scale", "1,1000"]
    done = subprocess.run(
        [sys.executable, str(bench), *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    # Before timing, the bench asserts that every form prints the same bucket and count lines.
    assert done.returncode == 0, done.stderr
    rows = [m.groups() for m in map(ROW.match, done.stdout.splitlines()) if m]
    assert [(scale, form) for scale, form, *_ in rows] == [
        (scale, form)
        for scale in ("1", "1000")
        for form in ("merged line (schema 1)", "per writer, decimal (now)", "per writer, packed hex")
    ], done.stdout
    assert all(ratio == "1.00" for _, form, _, ratio, _ in rows if form.endswith("(schema 1)"))
