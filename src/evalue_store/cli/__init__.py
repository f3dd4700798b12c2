"""The ``evalue-store`` command line: pack, inspect, check, recover, export and merge containers.

Each subcommand is one function registered with ``@command`` plus a function that declares its
arguments, so adding a subcommand is a few lines. Exit codes: 0 ok, 1 verification or data
problems found, 2 usage error or unreadable input. Errors are one line on stderr,
``evalue-store: FILE: problem``; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import datetime
import html
import itertools
import json
import math
import os
import signal
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from tqdm import tqdm

import evalue_store as evs

from ..container import ENTRY_SIZE, FRAME_SIZE
from . import copy, pack, verify
from .output import check_output, new_file, refuse_container
from .pack import expand_inputs, pack_files
from .registry import at_least_one, build_parser, command, file_arg, json_arg
from .render import (
    EXIT_OK,
    EXIT_PROBLEMS,
    PROG,
    CliError,
    as_numbers,
    bin_label,
    dtype_name,
    error_line,
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
    without_index,
)

__all__ = ["CliError", "Terminated", "main"]

# The command groups, in the order `evalue-store --help` lists them.
GROUPS = (sys.modules[__name__], verify, pack, copy)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same cleanup runs: a
    killed run leaves no temporary file behind and never a partial output under OUT."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into Terminated while a command runs (when its default action is set and
    this is the main thread: a host program's own handler is left alone)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``evalue-store`` script and of ``python -m evalue_store``."""
    try:
        with sigterm_raises():
            return run_command(argv)
    except KeyboardInterrupt as exc:  # the cleanup ran on the way out
        terminated = isinstance(exc, Terminated)
        print(f"{PROG}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


def run_command(argv: list[str] | None) -> int:
    parser = build_parser(GROUPS)
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the command's parser, which names its own --help
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "run"):
        parser.error("no command given; try `evalue-store demo`")
    try:
        return args.run(args)
    except BrokenPipeError:  # `evalue-store head f | head -3`: the reader left, that is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        if args.debug:
            raise
        code, line = error_line(exc, getattr(args, "file", None))
        print(f"{PROG}: {line}", file=sys.stderr)
        return code


def human_bytes(n: int) -> str:
    """``1,304,568 B (1.2 MiB)``: exact for scripts that grep, rounded for people."""
    if n < 1024:
        return f"{n:,} B"
    size, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n:,} B ({size:.1f} {unit})"


def type_text(value: Any) -> str:
    """``Tensor int64[128]``, ``ListInt[3]``, ``String``...: kind plus dtype and shape."""
    kind = kind_name(value)
    if kind == "Tensor":
        return f"Tensor {dtype_name(value)}{shape_text(value.shape)}"
    if kind in ("ListTensor", "ListOptionalTensor"):
        inner = ", ".join("None" if v is None else type_text(v)[7:] for v in value[:3])
        return f"{kind}[{inner}{', ...' if len(value) > 3 else ''}]"
    if kind.startswith("List") and value:
        return f"{kind}[{len(value)}]"
    return kind


def finite_range(array: np.ndarray) -> tuple[Any, Any, int]:
    """(min, max, NaN count) over the finite-or-integer values; (None, None, n) if none."""
    if array.dtype.kind == "f":
        nan = int(np.isnan(array).sum())
        finite = array[np.isfinite(array)]
        if not finite.size:
            return None, None, nan
        return finite.min().item(), finite.max().item(), nan
    return array.min().item(), array.max().item(), 0


def tensor_summary(array: np.ndarray) -> str:
    """``float32[16] [-0.41 1.2 0.03 ... 0.9] min -1.9 max 2.3``, like numpy's repr but short."""
    text = f"{dtype_name(array)}{shape_text(array.shape)}"
    numbers = as_numbers(array)
    shown = array if numbers is None else numbers
    if array.size:
        flat = np.array2string(
            shown.reshape(-1), threshold=8, edgeitems=3, precision=4, max_line_width=10**6
        )
        text += f" {flat}"
    if numbers is not None and array.size:
        low, high, nan = finite_range(numbers)
        text += f"  min {num(low)} max {num(high)}"
        if nan:
            text += f" nan {nan:,}"
    return text


def short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def value_summary(value: Any) -> str:
    kind = kind_name(value)
    if kind == "Tensor":
        return f"Tensor {tensor_summary(value)}"
    if kind in ("ListTensor", "ListOptionalTensor"):
        items = "; ".join("None" if v is None else tensor_summary(v) for v in value[:2])
        return short(f"{kind}[{len(value)}] {items}{'; ...' if len(value) > 2 else ''}", 150)
    if kind == "List(empty)":
        return "List(empty) []"
    if kind.startswith("List"):
        return f"{kind}[{len(value)}] {short(str(value))}"
    if kind == "Bytes":
        return f"Bytes[{len(value)}] {short(repr(value))}"
    if kind == "None":
        return "None"
    return f"{kind} {short(repr(value))}"


def value_full(value: Any) -> str:
    """Everything in a value; tensors printed whole."""
    kind = kind_name(value)
    if kind == "Tensor":
        numbers = as_numbers(value)
        shown = value if numbers is None else numbers
        body = np.array2string(shown, threshold=sys.maxsize, max_line_width=100)
        return f"Tensor {dtype_name(value)}{shape_text(value.shape)}\n{body}"
    if kind in ("ListTensor", "ListOptionalTensor"):
        parts = [f"{kind}[{len(value)}]"]
        for k, item in enumerate(value):
            head, *body = ["None"] if item is None else value_full(item).splitlines()
            parts += [f"item {k}: {head}"] + [f"  {line}" for line in body]
        return "\n".join(parts)
    if kind == "List(empty)":
        return "List(empty) []"
    if kind.startswith("List"):
        return f"{kind}[{len(value)}] {value}"
    if kind == "None":
        return "None"
    return f"{kind} {value!r}"


def print_head(ds: evs.Dataset, n: int) -> int:
    """The first ``n`` records, summarized; an unreadable one is named and skipped."""
    code = EXIT_OK
    for i in range(min(n, len(ds))):
        if i:
            print()
        try:
            print_record(i, ds[i])
        except evs.FormatError as exc:
            print(f"record {i}: unreadable: {without_index(exc.reason, i)}")
            code = EXIT_PROBLEMS
    return code


def print_record(index: int, record: list, full: bool = False) -> None:
    print(f"record {index}: {plural(len(record), 'value')}")
    for position, value in enumerate(record):
        text = value_full(value) if full else value_summary(value)
        lines = text.splitlines() or [""]
        print(f"  [{position}] {lines[0]}")
        for line in lines[1:]:
            print(f"      {line}")


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
                examples.append(f"record {i}: {without_index(exc.reason, int(i))}")
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


def svg_histogram(stats: dict, width: int = 480, height: int = 120) -> str:
    """An inline SVG bar chart of every bin; each bar's tooltip gives its range and count."""
    hist = stats["histogram"]
    counts = hist["counts"]
    if not counts:
        return "<p>(no finite values)</p>"
    top = max(counts)
    step = width / len(counts)
    base = height + 16  # 16 px above the bars for the "max" label
    bars = []
    for k, c in enumerate(counts):
        h = height * c / top
        label = bin_label(hist["edges"][k], hist["edges"][k + 1], hist["integer"])
        bars.append(
            f'<rect x="{k * step:.2f}" y="{base - h:.2f}" width="{max(step - 1, 1):.2f}" '
            f'height="{h:.2f}"><title>{html.escape(label)}: {c:,}</title></rect>'
        )
    low, high = html.escape(num(stats["min"])), html.escape(num(stats["max"]))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{base + 16}" '
        f'viewBox="0 0 {width} {base + 16}" role="img">'
        f'<text x="0" y="11">bar height: count (max {top:,})</text>'
        f'<g class="bars">{"".join(bars)}</g>'
        f'<text x="0" y="{base + 13}">{low}</text>'
        f'<text x="{width}" y="{base + 13}" text-anchor="end">{high}</text></svg>'
    )


def html_numbers(stats: dict | None, what: str) -> str:
    if stats is None:
        return ""
    cells = "".join(
        f"<td>{html.escape(num(stats[k]))}</td>"
        for k in ("count", "min", "mean", "max", "nan", "posinf", "neginf")
    )
    return (
        f"<h3>{html.escape(what)}</h3><table><tr><th>count</th><th>min</th><th>mean</th>"
        f"<th>max</th><th>NaN</th><th>+Inf</th><th>-Inf</th></tr><tr>{cells}</tr></table>"
        f"{svg_histogram(stats)}"
    )


def html_counter(title: str, counts: dict) -> str:
    if not counts:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{v:,}</td></tr>" for k, v in counts.items()
    )
    return f"<table><tr><th>{html.escape(title)}</th><th>count</th></tr>{rows}</table>"


HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 60em; }
table { border-collapse: collapse; margin: 0.5em 1em 0.5em 0; display: inline-table;
        vertical-align: top; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th { background: #f3f3f3; }
section { border-top: 1px solid #ddd; margin-top: 1.5em; }
svg { display: block; margin: 0.5em 0; font-size: 11px; }
svg .bars rect { fill: #4a7bb7; }
"""


def stats_html(report: dict) -> str:
    """A self-contained page: the stats tables and inline SVG histograms, no scripts."""
    title = f"evalue-store stats: {os.path.basename(report['file'])}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{HTML_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(report['file'])}: {report['records']:,} records, "
        f"{report['records_read']:,} read, {report['unreadable_records']:,} unreadable.</p>",
        "<section><h2>Record bytes</h2>",
        html_numbers(report["record_bytes"], "frame + payload bytes, every record"),
        "</section>",
    ]
    for pos in report["positions"]:
        title = f"Field {pos['field']} (position {pos['position']})" if pos.get("field") else ""
        title = html.escape(title or f"Position {pos['position']}")
        parts.append(f"<section><h2>{title}</h2><div>")
        parts.append(html_counter("kind", pos["kinds"]))
        parts.append(html_counter("dtype", pos["dtypes"]))
        shapes = dict(pos["shapes"])
        if pos["other_shapes"]:
            shapes["other"] = pos["other_shapes"]
        parts.append(html_counter("shape", shapes))
        parts.append("</div>")
        if len(pos["shapes"]) > 1:
            parts.append(html_numbers(pos["elements"], "elements per value"))
        parts.append(html_numbers(pos["values"], "values"))
        parts.append(html_numbers(pos["string_lengths"], "string length"))
        parts.append("</section>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def schema(ds: evs.Dataset, samples: int = 8) -> tuple[list[dict], int, list[str]]:
    """Kinds, dtypes and shapes per position, from up to ``samples`` records spread out."""
    indices = sample_indices(len(ds), samples)
    seen: list[dict[str, None]] = []  # dicts as ordered sets
    problems = []
    for i in indices:
        try:
            record = ds[int(i)]
        except evs.FormatError as exc:
            problems.append(f"record {i}: {without_index(exc.reason, int(i))}")
            continue
        while len(seen) < len(record):
            seen.append({})
        for types, value in zip(seen, record):
            types[type_text(value)] = None
    names = field_names(ds)
    rows = [
        {"position": k, "field": names[k] if k < len(names) else None, "types": list(types)}
        for k, types in enumerate(seen)
    ]
    return rows, len(indices), problems


def info_report(ds: evs.Dataset) -> tuple[dict, list[str]]:
    commit, header = ds.commit, ds.header
    file_bytes = os.path.getsize(ds.path)
    lengths = sum(int(e["length"].sum(dtype=np.uint64)) for e in ds.iter_entries())
    data = lengths + FRAME_SIZE * len(ds)
    index = sum(seg.count for seg in commit.segments) * ENTRY_SIZE
    committed = ds.logical_size  # of the decompressed stream, for a compressed file
    problems = []
    try:
        metadata: Any = ds.metadata
    except evs.FormatError as exc:
        metadata = None
        problems.append(f"metadata: {exc.reason}")
    rows, sampled, record_problems = schema(ds)
    created = datetime.datetime.fromtimestamp(header.created_ns / 1e9, datetime.timezone.utc)
    report = {
        "file": ds.path,
        "records": len(ds),
        "file_bytes": file_bytes,
        "compressed": ds.compressed,
        "logical_bytes": committed,
        "compression_ratio": (file_bytes - ds.uncommitted_bytes) / max(committed, 1),
        "data_bytes": data,
        "index_bytes": index,
        "metadata_bytes": commit.metadata_length,
        "overhead_bytes": committed - data - index - commit.metadata_length,
        "uncommitted_bytes": ds.uncommitted_bytes,
        "commits": commit.number - 1,  # number 1 is the empty commit that creates a file
        "last_commit": commit.number,
        "segments": len(commit.segments),
        "alignment": header.alignment,
        "writer": header.writer,
        "created": created.isoformat(timespec="seconds"),
        "file_id": header.file_id.hex(),
        "metadata": metadata,
        "schema_sampled_records": sampled,
        "schema": rows,
    }
    return report, problems + record_problems


def print_info(report: dict, problems: list[str]) -> None:
    rows = [
        ("file", report["file"]),
        ("records", f"{report['records']:,}"),
        ("file bytes", human_bytes(report["file_bytes"])),
    ]
    if report["compressed"]:
        ratio = report["compression_ratio"]
        rows.append(("compressed", f"zstd frames, {ratio:.2f}x of the plain container"))
        rows.append(("plain bytes", human_bytes(report["logical_bytes"])))
    rows += [
        ("  data", human_bytes(report["data_bytes"]) + "  record frames"),
        ("  index", human_bytes(report["index_bytes"])),
        ("  metadata", human_bytes(report["metadata_bytes"])),
        ("  overhead", human_bytes(report["overhead_bytes"]) + "  header, footers, padding"),
        ("  uncommitted", human_bytes(report["uncommitted_bytes"])),
        ("commits", str(report["commits"])),
        ("segments", str(report["segments"])),
        ("alignment", str(report["alignment"])),
        ("writer", report["writer"]),
        ("created", report["created"]),
        ("file id", report["file_id"]),
        ("metadata", json.dumps(report["metadata"], ensure_ascii=False)),
    ]
    for name, value in rows:
        print(f"{name:<14} {value}")
    if report["uncommitted_bytes"]:
        print("               (a writer crashed or is still writing; see `evalue-store recover`)")
    print(f"schema (from {report['schema_sampled_records']} sampled records)")
    for row in report["schema"]:
        print(f"  {field_label(row)} {' | '.join(row['types'])}")
    for problem in problems:
        print(f"problem: {problem}")


DEMO_RECORDS = 300


def demo_record(i: int) -> dict[str, Any]:
    """Record ``i`` of the built-in W1-like sample (tokens, features, label, id)."""
    rng = np.random.default_rng(i)
    return {
        "tokens": rng.integers(0, 32_000, 128, dtype=np.int64),
        "features": rng.standard_normal(16).astype(np.float32),
        "label": int(rng.integers(0, 10)),
        "id": f"w1-{i:05d}",
    }


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="DIR", help="where to put the demo (default: a new temp dir)")


@command(
    "demo",
    f"pack a built-in sample of {DEMO_RECORDS} W1-like records, read, verify and show it",
    "evalue-store demo --dir /tmp/evs-demo",
    _demo_args,
)
def cmd_demo(args: argparse.Namespace) -> int:
    folder = args.dir or tempfile.mkdtemp(prefix="evalue-store-demo-")
    samples = os.path.join(folder, "samples")
    os.makedirs(samples, exist_ok=True)
    for i in range(DEMO_RECORDS):
        np.savez(os.path.join(samples, f"{i:05d}.npz"), **demo_record(i))
    print(f"1. wrote {DEMO_RECORDS} sample .npz files to {samples}")
    out = os.path.join(folder, "demo.evs")
    pack = argparse.Namespace(
        **vars(args), sources=[samples], output=out, dtype="float32", append=False, force=True
    )
    pack.metadata = {"dataset": "evalue-store demo (W1-like)"}
    written, size = pack_files(expand_inputs(pack), pack)
    print(f"2. packed them: {PROG} pack {samples} -o {out}  ({written} records, {size:,} bytes)")
    with open_dataset(out) as ds:
        for i, record in enumerate(ds):
            want = demo_record(i)
            same = [np.array_equal(record[0], want["tokens"])]
            same.append(np.array_equal(record[1], want["features"]))
            if not all(same) or record[2:] != [want["label"], want["id"]]:
                raise CliError(out, f"record {i} does not match sample {i}", EXIT_PROBLEMS)
        print(f"3. read back all {len(ds)} records: identical to the samples")
        report = ds.verify()
        if not report.ok:
            raise CliError(out, "; ".join(report.problems) or "bad records", EXIT_PROBLEMS)
        print(f"4. {PROG} verify {out}: OK, {report.bytes_checked:,} bytes checked")
        print(f"\n5. {PROG} info {out}")
        print_info(*info_report(ds))
        print(f"\n6. {PROG} head {out} -n 2")
        print_head(ds, 2)
    print(f"\nthe demo file is {os.path.abspath(out)}")
    print(f"next: {PROG} stats {out} --html {os.path.join(folder, 'report.html')}")
    return EXIT_OK


def _info_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    json_arg(p)


@command(
    "info",
    "sizes, commits, metadata and the schema of a file",
    "evalue-store info train.evs --json",
    _info_args,
)
def cmd_info(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds:
        report, problems = info_report(ds)
    if args.json:
        print(json.dumps({**report, "problems": problems}, indent=2))
    else:
        print_info(report, problems)
    return EXIT_PROBLEMS if problems else EXIT_OK


def _head_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    p.add_argument(
        "-n", type=at_least_one, default=5, metavar="N", help="records to show (default 5)"
    )


@command(
    "head", "the first records, tensors summarized", "evalue-store head train.evs -n 3", _head_args
)
def cmd_head(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds:
        if not len(ds):
            print(f"{args.file}: no records")
        return print_head(ds, args.n)


def _show_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    p.add_argument("index", type=int, metavar="INDEX", help="record number; -1 is the last")


@command("show", "one record in full", "evalue-store show train.evs -1", _show_args)
def cmd_show(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds:
        n = len(ds)
        if not -n <= args.index < n:
            raise CliError(args.file, f"record {args.index} out of range ({n} records)")
        print_record(args.index % n, ds[args.index], full=True)
    return EXIT_OK


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
