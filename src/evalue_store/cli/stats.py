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
    located,
    note,
    num,
    open_dataset,
    plural,
    progress,
    sample_indices,
    shape_text,
)
from .stats_html import stats_html
from .tally import Numbers


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
    sizes: Numbers | None = Numbers()
    problems = []
    try:
        for entries in ds.iter_entries():  # a compressed index may not fit in memory whole
            for start in range(0, len(entries), Numbers.CHUNK):
                sizes.add_array(entries["length"][start : start + Numbers.CHUNK] + FRAME_SIZE)
    except evs.FormatError as exc:  # a compressed file's records may still be read
        sizes = None
        problems.append(f"index: {located(exc)}")
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
        "problems": problems,
        "record_bytes": None if sizes is None else sizes.to_json(),
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
    merged = [sum(counts[k : k + group]) for k in range(0, m, group)]
    bounds = [edges[min(k * group, m)] for k in range(len(merged) + 1)]  # no sum overflows
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
    for problem in report["problems"]:
        print(f"problem: {problem}")
    print()
    if report["record_bytes"] is None:
        print("record bytes: unknown (the index is unreadable)")
    else:
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
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print_stats(report)
    return EXIT_PROBLEMS if report["unreadable_records"] or report["problems"] else EXIT_OK
