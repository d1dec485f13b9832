"""What reading two writers' histograms costs, by stored form: the measured candidates of issue 15.

Schema 2 stores each writer's absolute values (a plain ``HSET`` per flush, idempotent) and the
reader adds the writers up. With two API servers per engine, a busy ``/metrics`` render reads each
writer's histogram counts from text, adds them and formats the sums, where schema 1 printed the
one merged line Redis had kept (at ~7x the flush cost on Redis). This bench times that part of a
read — one engine's histogram lines of two writers, to the text ``/metrics`` prints — in three
forms, on the same data (a busy fleet's, filled as ``bench/scrape_full.py`` fills it), in one
process, and prints each per engine and as a ratio to the first:

- ``merged line (schema 1)``: one line ``"<sum> <c0> ... <cN>"`` per series holding both writers'
  sums, read by the per-series rule (:func:`~redis_stats.codec.histogram_numbers`: split,
  ``int()`` to check, the texts printed as stored). What schema 1's reader did; the writers'
  flushes paid for the merge, in Lua.
- ``per writer, decimal (now)``: what schema 2 stores and reads (the bulk path of
  :mod:`redis_stats._core.read.groups`: one JSON scan per writer's chunk, checks, sums, template).
- ``per writer, packed hex``: the candidate not taken: each series' per-bucket (not cumulative)
  counts as fixed-width 16-digit hex, all series of a chunk read as one ``int(text, 16)``, the
  writers added as two big integers (no carry crosses a field: each count is below 2**60), then
  unpacked (``array``) and made cumulative (``itertools.accumulate``) per series.

``stored bytes`` is the size of one engine's histogram lines per writer in that form (schema 1:
one merged line per series for all writers). Usage:

    python bench/read_formats.py [--engines 16] [--rounds 7] [--scale 1,10000]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import timeit
from array import array
from collections.abc import Callable
from functools import partial
from itertools import accumulate, pairwise
from operator import add
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis_stats._core.read import groups
from redis_stats._core.read.values import go_floats
from redis_stats.codec import histogram_numbers
from redis_stats.snapshot import Skipped


def _scrape_full() -> Any:
    """bench/scrape_full.py as a module (its fill and churn: the same busy fleet)."""
    path = Path(__file__).resolve().parent / "scrape_full.py"
    spec = importlib.util.spec_from_file_location("scrape_full", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Histograms:
    """One writer's chunk cut down to its histogram lines: the layout of those lines alone (made
    by the reader's own decoder) and their values, so the bulk path times only this part."""

    def __init__(self, chunk: Any, decoder: Any, catalog: Any, scale: int) -> None:
        full = chunk.layout
        names = "\n".join(full.fields[i] for i in full.histograms)
        self.layout: groups.Layout = decoder.layout(names, catalog)
        self.values: list[str] = [_scaled(chunk.values[i], scale) for i in full.histograms]


def _scaled(line: str, scale: int) -> str:
    """A histogram line with its sum and counts times *scale* (a fleet that has run for longer:
    the same shape, more digits per count)."""
    if scale == 1:
        return line
    total, *counts = line.split(" ")
    return " ".join([repr(float(total) * scale), *(str(int(c) * scale) for c in counts)])


def busy_chunks(engines: int, scales: list[int]) -> dict[int, list[tuple[Histograms, Histograms]]]:
    """Per engine, its two writers' histogram lines, as the reader sees them after every chunk
    changed; per scale (counts and sums multiplied)."""
    sf = _scrape_full()
    rs = sf._imports()
    with rs.EmbeddedRedis() as server:
        made = sf.fill(rs, server.url, "formats", engines, 2)
        sf.churn(made)
        reader = rs.StatsReader(rs.StatsConfig(url=server.url, namespace="formats"), rs.vllm_catalog())
        decoder = reader._decoder
        read = reader.read()
        decoder.decode(read)  # the catalogue
        catalog = decoder.catalog
        shard = read.shards[0]
        out: dict[int, list[tuple[Histograms, Histograms]]] = {scale: [] for scale in scales}
        for j, name in enumerate(shard.engines[0::2]):
            chunks, _, _ = decoder._contents(name, [(0, j)], read.shards, catalog, Skipped(), set())
            first, second = chunks
            assert first.layout is second.layout, "the bench needs both writers to hold the same series"
            for scale, pairs in out.items():
                cut = [Histograms(chunk, decoder, catalog, scale) for chunk in (first, second)]
                pairs.append((cut[0], cut[1]))
    return out


def _templates(layout: groups.Layout) -> list[str]:
    """One ``%`` template per histogram series, a line per bucket, then count and sum (as the
    renderer's, with a shorter line prefix: the same work per number)."""
    out = []
    for bounds in layout.bounds:
        out.append("".join(f'h_bucket{{le="{b}"}} %s\n' for b in bounds) + "h_count %s\nh_sum %s\n")
    return out


Form = tuple[Callable[[], list[str]], int]
"""A stored form of one engine's histograms: the read to text, and the bytes stored per writer
(schema 1: per engine, one line per series for all writers)."""


def form_merged(first: Any, second: Any) -> Form:
    """Schema 1: one stored line per series holding both writers' values."""
    layout = first.layout
    parses = [groups.parse_chunk(layout, first.values), groups.parse_chunk(layout, second.values)]
    group = groups._combine(layout, parses, [])
    lines = [
        f"{total} " + " ".join(map(str, group.counts[where]))
        for where, total in zip(layout.count_slices, group.sums)
    ]
    plan = list(zip(_templates(layout), lines, layout.spaces))

    def read() -> list[str]:
        out = []
        for template, line, size in plan:
            found = histogram_numbers(line, size)
            assert found is not None
            counts = found[1]
            out.append(template % (*counts, counts[-1], found[0]))
        return out

    return read, sum(map(len, lines))


def form_now(first: Any, second: Any) -> Form:
    """Schema 2 as stored and read today (both writers' lines parsed, as a busy read does)."""
    layout = first.layout
    plan = [(t, w.start, w.stop) for t, w in zip(_templates(layout), layout.count_slices)]

    def read() -> list[str]:
        one = groups.parse_chunk(layout, first.values)
        two = groups.parse_chunk(layout, second.values)
        group = groups._combine(layout, [one, two], [one, two])
        counts = group.counts
        out = []
        for (template, start, stop), total in zip(plan, go_floats([*group.sums])):
            found = counts[start:stop]
            out.append(template % (*found, found[-1], total))
        return out

    return read, sum(map(len, first.values))


def hex_lines(chunk: Any) -> list[str]:
    """A writer's histogram lines in the packed-hex form: ``"<sum> <16 hex digits per bucket>"``."""
    out = []
    for line in chunk.values:
        total, *counts = line.split(" ")
        cumulative = [*map(int, counts)]
        per_bucket = [cumulative[0], *(b - a for a, b in pairwise(cumulative))]
        out.append(total + " " + "".join(f"{c:016x}" for c in per_bucket))
    return out


def form_hex(first: Any, second: Any) -> Form:
    """The packed-hex candidate."""
    layout = first.layout
    writers = [hex_lines(first), hex_lines(second)]
    buckets = sum(layout.spaces)
    swap = sys.byteorder == "little"
    plan = []
    start = 0
    for template, size in zip(_templates(layout), layout.spaces):
        plan.append((template, start, start + size))
        start += size

    def read() -> list[str]:
        packed = 0
        sums: list[float] = [0.0] * len(plan)
        for lines in writers:
            tokens = " ".join(lines).split(" ")
            digits = "".join(tokens[1::2])
            if len(digits) != 16 * buckets or digits[0::16].strip("0"):  # each count below 2**60
                raise ValueError("not this form")
            packed += int(digits, 16)
            sums = [*map(add, sums, map(float, tokens[0::2]))]
        counts = array("Q", packed.to_bytes(8 * buckets, "big"))
        if swap:
            counts.byteswap()
        values = counts.tolist()
        out = []
        for (template, begin, end), total in zip(plan, map(repr, sums)):
            found = [*accumulate(values[begin:end])]
            out.append(template % (*found, found[-1], total))
        return out

    return read, sum(map(len, writers[0]))


FORMS: dict[str, Callable[[Any, Any], Form]] = {
    "merged line (schema 1)": form_merged,
    "per writer, decimal (now)": form_now,
    "per writer, packed hex": form_hex,
}


def _read_all(reads: list[Callable[[], list[str]]]) -> None:
    for read in reads:
        read()


def measure(pairs: list[tuple[Histograms, Histograms]], rounds: int) -> dict[str, tuple[float, float]]:
    """Per form: (best seconds per engine, stored bytes per engine), the forms alternated."""
    forms = {name: [make(a, b) for a, b in pairs] for name, make in FORMS.items()}
    texts = {name: [read() for read, _ in made] for name, made in forms.items()}
    first = next(iter(texts.values()))
    for name, got in texts.items():  # every form prints the same lines (sums: each form's repr)
        for a, b in zip(first, got):
            assert [x.rsplit("h_sum", 1)[0] for x in a] == [x.rsplit("h_sum", 1)[0] for x in b], name
    best = dict.fromkeys(forms, float("inf"))
    for r in range(rounds):
        order = list(forms.items())
        for name, made in order if r % 2 == 0 else order[::-1]:
            run = partial(_read_all, [read for read, _ in made])
            took = min(timeit.repeat(run, number=20, repeat=3)) / 20 / len(pairs)
            best[name] = min(best[name], took)
    return {name: (best[name], sum(size for _, size in made) / len(pairs)) for name, made in forms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7, help="rounds, the forms alternated; best kept")
    parser.add_argument(
        "--scale",
        default="1,10000",
        help="counts and sums times each of these (10000: a fleet that ran for days)",
    )
    opts = parser.parse_args()
    scales = [int(x) for x in opts.scale.split(",")]
    by_scale = busy_chunks(opts.engines, scales)
    layout = by_scale[scales[0]][0][0].layout
    print(
        f"{opts.engines} engines x 2 writers, busy; {len(layout.histograms)} histogram series,"
        f" {sum(layout.spaces)} counts per writer"
    )
    print(f"{'counts x':>9}  {'form':<28}{'us per engine':>15}{'x schema 1':>12}{'stored bytes':>14}")
    for scale, pairs in by_scale.items():
        got = measure(pairs, opts.rounds)
        base = got["merged line (schema 1)"][0]
        for name, (took, size) in got.items():
            print(f"{scale:>9}  {name:<28}{took * 1e6:>15.1f}{took / base:>12.2f}{size:>14.0f}")


if __name__ == "__main__":
    main()
