"""``stats``: one streaming pass that counts kinds, dtypes, shapes and values per position,
in memory that does not grow with the record count, shown as text, JSON or a page.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections import Counter
from typing import Any

import numpy as np
from tqdm import tqdm

import evalue_store as evs

from ..container import FRAME_SIZE
from .output import check_output, new_file, refuse_container
from .registry import at_least_one, command, file_arg, json_arg
from .render import (
    EXIT_OK,
    EXIT_PROBLEMS,
    PROG,
    as_numbers,
    bin_label,
    dtype_name,
    field_label,
    field_names,
    kind_name,
    note,
    num,
    open_dataset,
    plural,
    progress,
    sample_indices,
    shape_text,
)
from .stats_html import stats_html


class Histogram:
    """Exact counts of every value in BINS equal-width bins, in O(BINS) memory.

    When a value falls outside, the range doubles (pairs of bins merge, the range grows
    toward the value) so old and new counts stay aligned. Integer data starts with
    width-1 bins, so labels 0..9 get one bin each.
    """

    BINS = 64

    def __init__(self) -> None:
        self.lo = 0.0
        self.width = 0.0
        self.counts = np.zeros(self.BINS, np.int64)

    def add(self, values: np.ndarray, integer: bool) -> None:
        """Count finite float64 ``values`` (never empty)."""
        low, high = float(values.min()), float(values.max())
        if not self.width:
            self.lo = math.floor(low) if integer else low
            span = high - self.lo
            if integer:
                self.width = 1.0
            else:
                self.width = span / (self.BINS - 1) if span > 0 else max(abs(low), 1.0) / 1024
        while low < self.lo:
            self._double(toward_low=True)
        while high >= self.lo + self.BINS * self.width:
            self._double(toward_low=False)
        with np.errstate(invalid="ignore", over="ignore"):  # ranges near 1e308 overflow
            index = ((values - self.lo) / self.width).astype(np.int64)
        np.clip(index, 0, self.BINS - 1, out=index)
        self.counts += np.bincount(index, minlength=self.BINS)

    def _double(self, toward_low: bool) -> None:
        merged = self.counts.reshape(-1, 2).sum(axis=1)
        self.counts = np.zeros(self.BINS, np.int64)
        half = self.BINS // 2
        if toward_low:
            self.counts[half:] = merged
            self.lo -= self.BINS * self.width
        else:
            self.counts[:half] = merged
        self.width *= 2

    def to_json(self, integer: bool) -> dict:
        """Non-empty span of bins: ``edges`` (one more than ``counts``), bins are [lo, hi)."""
        nonzero = np.flatnonzero(self.counts)
        if not nonzero.size:
            return {"edges": [], "counts": [], "integer": integer}
        first, last = int(nonzero[0]), int(nonzero[-1])
        edges = self.lo + self.width * np.arange(first, last + 2)
        counts = self.counts[first : last + 1]
        edge_list = [int(e) for e in edges] if integer else edges.tolist()
        return {"edges": edge_list, "counts": counts.tolist(), "integer": integer}


class Numbers:
    """Running count/min/max/mean, NaN and Inf counts and a Histogram of a stream of numbers.

    Small arrays and scalars are buffered and counted in batches: numpy's per-call overhead
    would otherwise dominate on datasets of many small records.
    """

    BATCH = 1 << 16  # buffered values before a flush
    CHUNK = 1 << 20  # elements of a big tensor processed at once

    def __init__(self) -> None:
        self.count = 0
        self.nan = 0
        self.posinf = 0
        self.neginf = 0
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf
        self.integer = True
        self.hist = Histogram()
        self._arrays: list[np.ndarray] = []
        self._scalars: list[float] = []
        self._buffered = 0

    def add_scalar(self, value: float) -> None:
        if isinstance(value, float):
            self.integer = False
        self._scalars.append(value)
        self._buffered += 1
        if self._buffered >= self.BATCH:
            self.flush()

    def add_array(self, array: np.ndarray) -> None:
        """Count every element of a real-valued array (any shape and dtype)."""
        if array.dtype.kind == "f":
            self.integer = False
        flat = array.reshape(-1)
        if flat.size >= self.BATCH:
            for start in range(0, flat.size, self.CHUNK):
                self._count(flat[start : start + self.CHUNK].astype(np.float64))
            return
        self._arrays.append(flat)
        self._buffered += flat.size
        if self._buffered >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        parts = [a.astype(np.float64) for a in self._arrays]
        if self._scalars:
            parts.append(np.array(self._scalars, np.float64))
        self._arrays, self._scalars, self._buffered = [], [], 0
        if parts:
            self._count(np.concatenate(parts))

    def _count(self, values: np.ndarray) -> None:
        finite = np.isfinite(values)
        if not finite.all():
            self.nan += int(np.isnan(values).sum())
            self.posinf += int((values == math.inf).sum())
            self.neginf += int((values == -math.inf).sum())
            values = values[finite]
        if not values.size:
            return
        self.count += values.size
        self.total += float(values.sum())
        self.low = min(self.low, float(values.min()))
        self.high = max(self.high, float(values.max()))
        self.hist.add(values, self.integer)

    def empty(self) -> bool:
        return not (self.count or self.nan or self.posinf or self.neginf or self._buffered)

    def to_json(self) -> dict:
        self.flush()
        found = self.count > 0
        cast = int if self.integer else float
        return {
            "count": self.count,
            "min": cast(self.low) if found else None,
            "max": cast(self.high) if found else None,
            "mean": self.total / self.count if found else None,
            "nan": self.nan,
            "posinf": self.posinf,
            "neginf": self.neginf,
            "histogram": self.hist.to_json(self.integer),
        }


class Position:
    """Aggregates for the values at one position of the records."""

    MAX_SHAPES = 32  # distinct shapes counted by name; more fall into ``other_shapes``

    def __init__(self) -> None:
        self.count = 0
        self.kinds: Counter[str] = Counter()
        self.dtypes: Counter[str] = Counter()
        self.shapes: Counter[tuple[int, ...]] = Counter()
        self.other_shapes = 0
        self.values = Numbers()
        self.elements = Numbers()
        self.strings = Numbers()

    def add(self, value: Any) -> None:
        self.count += 1
        kind = kind_name(value)
        self.kinds[kind] += 1
        if kind == "Tensor":
            self._tensor(value)
        elif kind in ("ListTensor", "ListOptionalTensor"):
            for item in value:
                if item is not None:
                    self._tensor(item)
        elif kind.startswith("List"):
            self._shape((len(value),))
            self.elements.add_scalar(len(value))
            if value:
                self.values.add_array(np.asarray(value))
        elif kind in ("Int", "Double", "Bool"):
            self.values.add_scalar(float(value) if kind == "Double" else int(value))
        elif kind in ("String", "Bytes"):
            self.strings.add_scalar(len(value))

    def _tensor(self, array: np.ndarray) -> None:
        self.dtypes[dtype_name(array)] += 1
        self._shape(array.shape)
        self.elements.add_scalar(array.size)
        numbers = as_numbers(array)
        if numbers is not None and numbers.size:
            self.values.add_array(numbers)

    def _shape(self, shape: tuple[int, ...]) -> None:
        if shape in self.shapes or len(self.shapes) < self.MAX_SHAPES:
            self.shapes[shape] += 1
        else:
            self.other_shapes += 1

    def to_json(self, position: int) -> dict:
        return {
            "position": position,
            "count": self.count,
            "kinds": dict(self.kinds.most_common()),
            "dtypes": dict(self.dtypes.most_common()),
            "shapes": {shape_text(s): n for s, n in self.shapes.most_common()},
            "other_shapes": self.other_shapes,
            "elements": None if self.elements.empty() else self.elements.to_json(),
            "values": None if self.values.empty() else self.values.to_json(),
            "string_lengths": None if self.strings.empty() else self.strings.to_json(),
        }


def collect_stats(ds: evs.Dataset, sample: int | None, bar: tqdm) -> dict:
    """Stream over the records once; memory depends on record width, not on record count."""
    sizes = Numbers()
    for entries in ds.iter_entries():  # a compressed index may not fit in memory whole
        for start in range(0, len(entries), Numbers.CHUNK):
            sizes.add_array(entries["length"][start : start + Numbers.CHUNK] + FRAME_SIZE)
    indices = sample_indices(len(ds), sample)
    positions: list[Position] = []
    unreadable, examples = 0, []
    for i in indices:
        try:
            record = ds[int(i)]
        except evs.FormatError as exc:  # counted and reported; one bad record spoils nothing
            unreadable += 1
            if len(examples) < 10:
                examples.append(f"record {i}: {exc.detail}")
            bar.update()
            continue
        while len(positions) < len(record):
            positions.append(Position())
        for position, value in zip(positions, record):
            position.add(value)
        bar.update()
    return {
        "file": ds.path,
        "records": len(ds),
        "records_read": len(indices),
        "unreadable_records": unreadable,
        "unreadable_examples": examples,
        "record_bytes": sizes.to_json(),
        "positions": [
            {"field": name, **p.to_json(k)}
            for k, (p, name) in enumerate(itertools.zip_longest(positions, field_names(ds)))
            if p is not None
        ],
    }


def regroup(stats: dict, max_bins: int) -> tuple[list[float], list[int]]:
    """Merge neighbouring bins so that at most ``max_bins`` remain (for the terminal).

    The group size is chosen so the last group is as full as possible, and the outer edges
    are clamped to the data's min and max, so no bar looks short for lack of range.
    """
    hist = stats["histogram"]
    edges, counts = hist["edges"], hist["counts"]
    m = len(counts)
    least = max(1, math.ceil(m / max_bins))
    group = min(range(least, 2 * least + 1), key=lambda g: (-m % g, g))
    width = (edges[1] - edges[0]) * group
    merged = [sum(counts[k : k + group]) for k in range(0, m, group)]
    bounds = [edges[0] + width * k for k in range(len(merged) + 1)]
    bounds[0] = max(bounds[0], stats["min"])
    bounds[-1] = min(bounds[-1], stats["max"] + 1 if hist["integer"] else stats["max"])
    return bounds, merged


def bar_text(fraction: float, width: int, blocks: str) -> str:
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    return blocks[-1] * full + (blocks[part] if part else "")


def terminal_blocks() -> str:
    """Eighth-block characters when stdout can show them, else ASCII."""
    blocks = " ▏▎▍▌▋▊▉█"
    try:
        blocks.encode(sys.stdout.encoding or "ascii")
    except (LookupError, UnicodeEncodeError):
        return "        #"
    return blocks


def histogram_lines(stats: dict, indent: str, width: int = 40, max_bins: int = 12) -> list[str]:
    """Horizontal bars, one line per bin: ``label  bar  count``."""
    if not stats["histogram"]["counts"]:
        return []
    edges, counts = regroup(stats, max_bins)
    integer = stats["histogram"]["integer"]
    labels = [bin_label(lo, hi, integer) for lo, hi in zip(edges, edges[1:])]
    pad = max(len(label) for label in labels)
    top = max(counts)
    blocks = terminal_blocks()
    return [
        f"{indent}{label:>{pad}} {bar_text(c / top, width, blocks):<{width}} {c:,}"
        for label, c in zip(labels, counts)
    ]


def numbers_line(stats: dict, what: str) -> str:
    text = f"{what}: n {stats['count']:,}  min {num(stats['min'])}  "
    text += f"mean {num(stats['mean'])}  max {num(stats['max'])}"
    for key in ("nan", "posinf", "neginf"):
        if stats[key]:
            text += f"  {key} {stats[key]:,}"
    return text


def counter_text(counts: dict) -> str:
    return ", ".join(f"{name} x{n:,}" for name, n in counts.items())


def print_lines(lines: list[str]) -> None:
    for line in lines:
        print(line)


def print_stats(report: dict) -> None:
    read = report["records_read"]
    scope = "all records" if read == report["records"] else f"{read:,} sampled records"
    print(f"{report['file']}: {report['records']:,} records ({scope} read)")
    if report["unreadable_records"]:
        examples = "; ".join(report["unreadable_examples"][:3])
        print(f"{plural(report['unreadable_records'], 'unreadable record')} skipped: {examples}")
    print()
    print(numbers_line(report["record_bytes"], "record bytes (frame + payload, every record)"))
    print_lines(histogram_lines(report["record_bytes"], "  "))
    for pos in report["positions"]:
        print()
        print(f"{field_label(pos)} {counter_text(pos['kinds'])}")
        if pos["dtypes"]:
            print(f"    dtypes: {counter_text(pos['dtypes'])}")
        if pos["shapes"]:
            other = f", other x{pos['other_shapes']:,}" if pos["other_shapes"] else ""
            print(f"    shapes: {counter_text(dict(list(pos['shapes'].items())[:5]))}{other}")
            if len(pos["shapes"]) > 1:
                print("    " + numbers_line(pos["elements"], "elements per value"))
                print_lines(histogram_lines(pos["elements"], "      "))
        for key, what in (("values", "values"), ("string_lengths", "string length")):
            if pos[key] is not None:
                print("    " + numbers_line(pos[key], what))
                print_lines(histogram_lines(pos[key], "      "))


def _stats_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    p.add_argument("--sample", type=at_least_one, metavar="N", help="read N records spread evenly")
    json_arg(p)
    p.add_argument("--html", metavar="PAGE", help="also write a self-contained HTML report")


@command(
    "stats",
    "per-position kinds, dtypes, shapes, value ranges and histograms",
    "evalue-store stats train.evs --sample 10000 --html report.html",
    _stats_args,
    notes="""Record sizes come from the index (every record); the rest from the records read.
Histograms count every value read (NaN and Inf are counted apart); memory stays small
however many records there are.""",
)
def cmd_stats(args: argparse.Namespace) -> int:
    if args.html:  # before the work
        check_output(args.html)
        refuse_container(args.html, "an HTML page")
    with open_dataset(args.file) as ds:
        total = len(sample_indices(len(ds), args.sample))
        with progress(args, total, "stats", "rec") as bar:
            report = collect_stats(ds, args.sample, bar)
    if args.html:
        with new_file(args.html) as page:
            page.write(stats_html(report).encode("utf-8"))
        note(args, f"{PROG}: wrote {args.html}")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_stats(report)
    return EXIT_PROBLEMS if report["unreadable_records"] else EXIT_OK
