"""The ``evalue-store`` command line: pack, inspect, check, recover, export and merge containers.

Each subcommand is one function registered with ``@command`` plus a function that declares its
arguments, so adding a subcommand is a few lines. Exit codes: 0 ok, 1 verification or data
problems found, 2 usage error or unreadable input. Errors are one line on stderr,
``evalue-store: FILE: problem``; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import datetime
import errno
import glob
import html
import itertools
import json
import math
import os
import re
import secrets
import signal
import sys
import tempfile
import threading
import zipfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

import numpy as np
from tqdm import tqdm

import evalue_store as evs

from . import java
from .container import ENTRY_SIZE, FRAME_SIZE, MAGIC
from .dtypes import CODE_TO_NAME, dtype_code
from .fields import FIELDS_KEY
from .files import fsync_dir, lock, replace_locked
from .writer import MIN_FRAME_SIZE
from .zstd import MAX_FRAME_SIZE, is_compressed

PROG = "evalue-store"
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A problem to report as one line, ``evalue-store: WHERE: MESSAGE``, with an exit code."""

    def __init__(self, where: str | None, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.where = where
        self.message = message
        self.code = code


# ------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Command:
    """One subcommand: how it parses its arguments and what it runs."""

    name: str
    summary: str
    example: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    notes: str = ""


COMMANDS: list[Command] = []


def command(
    name: str,
    summary: str,
    example: str,
    arguments: Callable[[argparse.ArgumentParser], None],
    notes: str = "",
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register ``run(args) -> exit code`` as subcommand ``name``.

    ``example`` and ``notes`` go in the command's --help epilog.
    """

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS.append(Command(name, summary, example, arguments, run, notes))
        return run

    return register


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """One line instead of argparse's usage dump, as for every other error."""
        where = self.prog[len(PROG) :].strip()
        where = f"{where}: " if where else ""
        self.exit(EXIT_USAGE, f"{PROG}: {where}{message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Pack, inspect, check, recover and export evalue_store containers.",
        epilog="exit codes: 0 ok, 1 verification or data problems found, "
        "2 usage error or unreadable input\n\nexample:\n  evalue-store demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {evs.__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes")
    common.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for cmd in COMMANDS:
        sub = subparsers.add_parser(
            cmd.name,
            help=cmd.summary,
            description=cmd.summary,
            epilog=(cmd.notes + "\n\n" if cmd.notes else "") + f"example:\n  {cmd.example}",
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.arguments(sub)
        sub.set_defaults(run=cmd.run, parser=sub)
    return parser


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
    parser = build_parser()
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
        code, line = _error_line(exc, getattr(args, "file", None))
        print(f"{PROG}: {line}", file=sys.stderr)
        return code


def _error_line(exc: Exception, file: str | None) -> tuple[int, str]:
    """Exit code and ``WHERE: problem`` text for an exception, without a traceback."""
    if isinstance(exc, CliError):
        return exc.code, f"{exc.where}: {exc.message}" if exc.where else exc.message
    if isinstance(exc, evs.FormatError):
        where = exc.path or file
        at = "" if exc.offset is None else f" (at byte {exc.offset})"
        return EXIT_PROBLEMS, f"{where}: {exc.reason}{at}" if where else f"{exc.reason}{at}"
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else file
        return EXIT_USAGE, f"{where}: {exc.strerror}" if where else exc.strerror
    if isinstance(exc, evs.WriterLockedError):
        return EXIT_USAGE, f"{exc} (wait until it exits)"
    if isinstance(exc, (evs.EncodeError, ValueError)):
        return EXIT_USAGE, f"{file}: {exc}" if file else str(exc)
    return EXIT_USAGE, f"internal error {type(exc).__name__}: {exc} (--debug shows where)"


# ------------------------------------------------------------------------------- helpers


def progress(args: argparse.Namespace, total: int, desc: str, unit: str) -> tqdm:
    """A tqdm bar on stderr, shown only when stderr is a terminal and not --quiet."""
    show = not args.quiet and sys.stderr.isatty()
    return tqdm(
        total=total, desc=desc, unit=unit, disable=not show, leave=False, dynamic_ncols=True
    )


def note(args: argparse.Namespace, text: str) -> None:
    """A remark for the person at the terminal (stderr, silenced by --quiet)."""
    if not args.quiet:
        print(text, file=sys.stderr)


def without_index(reason: str, index: int) -> str:
    """A reason without the ``record N:`` prefix the reader adds (the caller names N)."""
    prefix = f"record {index}: "
    return reason[len(prefix) :] if reason.startswith(prefix) else reason


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def open_dataset(path: str) -> evs.Dataset:
    """Open a container; a file that cannot be read at all is an input error (exit 2)."""
    try:
        return evs.open(path)
    except evs.FormatError as exc:
        at = "" if exc.offset is None else f" (at byte {exc.offset})"
        raise CliError(path, f"{exc.reason}{at}") from None
    except IsADirectoryError:
        raise CliError(path, "is a directory, not an evalue_store file") from None


def json_object(text: str) -> dict:
    """argparse type for --metadata: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('must be a JSON object, like \'{"name": "w1"}\'')
    return value


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in [low, high], checked before any work (out of range, it
    would surface later as an error blamed on the input file, or as a silent no-op)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if high is None and value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    return parse


at_least_one = int_range(1)
ZSTD_LEVELS = (-(1 << 17), 22)  # zstd's negative "fast" levels, then 1 (fast) to 22 (small)


def natural_key(text: str) -> list[tuple[int, Any]]:
    """Sort key that puts file2 before file10."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p]


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


def num(x: Any) -> str:
    """A number for people: thousands separators for ints, 4 significant digits for floats."""
    if x is None:
        return "-"
    if isinstance(x, (int, np.integer)) or (
        isinstance(x, float) and x.is_integer() and abs(x) < 1e15
    ):
        return f"{int(x):,}"
    if 1e4 <= abs(x) < 1e15:
        return f"{x:,.1f}"
    return f"{x:.4g}"


def dtype_name(array: np.ndarray) -> str:
    """The ExecuTorch name of an array's dtype (``bfloat16`` for evs.BFLOAT16)."""
    return CODE_TO_NAME[dtype_code(array.dtype)]


def shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def kind_name(value: Any) -> str:
    """The EValue kind a decoded value came from.

    Decoding cannot tell an empty list's kind, nor a ListOptionalTensor without a None
    from a ListTensor; those show as ``List(empty)`` and ``ListTensor``.
    """
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return "Tensor"
    if isinstance(value, bool):
        return "Bool"
    if isinstance(value, int):
        return "Int"
    if isinstance(value, float):
        return "Double"
    if isinstance(value, str):
        return "String"
    if isinstance(value, bytes):
        return "Bytes"
    if not value:
        return "List(empty)"
    first = value[0]
    if isinstance(first, bool):
        return "ListBool"
    if isinstance(first, int):
        return "ListInt"
    if isinstance(first, float):
        return "ListDouble"
    return "ListOptionalTensor" if any(v is None for v in value) else "ListTensor"


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


def as_numbers(array: np.ndarray) -> np.ndarray | None:
    """The array as plain numbers (bfloat16 widened), or None for complex tensors."""
    if array.dtype == evs.BFLOAT16:
        return evs.bfloat16_to_float32(array)
    if array.dtype.kind == "c":
        return None
    return array


def finite_range(array: np.ndarray) -> tuple[Any, Any, int]:
    """(min, max, NaN count) over the finite-or-integer values; (None, None, n) if none."""
    if array.dtype.kind == "f":
        nan = int(np.isnan(array).sum())
        finite = array[np.isfinite(array)]
        if not finite.size:
            return None, None, nan
        return finite.min().item(), finite.max().item(), nan
    return array.min().item(), array.max().item(), 0


# ------------------------------------------------------------------------------- showing values


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


# ------------------------------------------------------------------------------- streaming stats


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


def sample_indices(n: int, sample: int | None) -> Sequence[int]:
    """All indices (a range: n may be billions), or ``sample`` of them evenly spread
    (deterministic, in file order)."""
    if not sample or sample >= n:
        return range(n)
    return np.unique(np.linspace(0, n - 1, sample).round().astype(np.int64))


def field_names(ds: evs.Dataset) -> tuple[str, ...]:
    """The file's field names, or () if it has none (or its metadata is unreadable)."""
    try:
        return ds.fields or ()
    except evs.FormatError:
        return ()


def field_label(row: dict) -> str:
    """``[2]``, or ``[2] label:`` when the position has a field name."""
    return f"[{row['position']}] {row['field']}:" if row.get("field") else f"[{row['position']}]"


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


# ------------------------------------------------------------------------------- rendering


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


def bin_label(low: float, high: float, integer: bool) -> str:
    if integer:
        return num(int(low)) if high - low == 1 else f"{num(int(low))}..{num(int(high) - 1)}"
    return f"{num(low)}..{num(high)}"


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


# ------------------------------------------------------------------------------- info


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


# ------------------------------------------------------------------------------- pack inputs

# An input yields (where, record); ``where`` names the file (and line) for error messages.
Source = Iterator[tuple[str, list]]
PACK_SUFFIXES = (".npz", ".npy", ".jsonl", ".ndjson", ".bin")
FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16")


def scalar_or_array(array: np.ndarray) -> Any:
    """0-d bool/int/float/str/bytes arrays become plain values; anything else stays a tensor."""
    if array.ndim or array.dtype.kind not in "biufUS":
        return array
    if array.dtype.kind == "S":
        return array.tobytes()  # .item() would drop trailing NUL bytes
    return array.item()


def numpy_file(path: str, magic: bytes, what: str) -> None:
    """Check a file's first bytes: np.load takes anything else for a pickle and says so."""
    with open(path, "rb") as f:
        head = f.read(len(magic))
    if head != magic:
        raise CliError(path, f"cannot read: {'empty file' if not head else 'not ' + what}")


def npz_source(path: str, args: argparse.Namespace, fields: Counter) -> Source:
    """One record per .npz file: its arrays in the order they are stored in the archive."""
    numpy_file(path, b"PK", "a .npz file (a zip archive of .npy arrays)")
    with np.load(path, allow_pickle=False) as npz:
        fields[tuple(npz.files)] += 1
        yield path, [scalar_or_array(npz[name]) for name in npz.files]


def npy_source(path: str, args: argparse.Namespace, fields: Counter) -> Source:
    numpy_file(path, b"\x93NUMPY", "a .npy file")
    yield path, [scalar_or_array(np.load(path, allow_pickle=False))]


def json_tensor(items: list, dtype: str) -> np.ndarray:
    """A (nested, rectangular) JSON list of numbers as a tensor, by the documented rule."""
    leaves: set[type] = set()
    stack = [items]
    while stack:
        for item in stack.pop():
            if isinstance(item, list):
                stack.append(item)
            elif isinstance(item, (bool, int, float)):
                leaves.add(type(item))
            else:
                found = "null" if item is None else type(item).__name__
                hint = " (give each string its own value, or join them)" if found == "str" else ""
                raise ValueError(f"a list must hold only numbers or only bools, not {found}{hint}")
    if bool in leaves and len(leaves) > 1:
        raise ValueError("a list mixes bools and numbers")
    try:
        if float in leaves:
            if dtype == "bfloat16":
                return evs.float32_to_bfloat16(np.array(items, np.float32))
            return np.array(items, dtype)
        return np.array(items, bool if bool in leaves else np.int64)
    except ValueError:
        raise ValueError("nested lists must be rectangular (equal lengths at each level)") from None


def json_value(value: Any, dtype: str) -> Any:
    if isinstance(value, list):
        return json_tensor(value, dtype)
    if isinstance(value, dict):
        raise ValueError("JSON objects have no EValue kind")
    return value


def jsonl_source(path: str, args: argparse.Namespace, fields: Counter) -> Source:
    """One record per non-blank line; each line a JSON list of values."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}: line {number}"
            try:
                values = json.loads(line)
                if not isinstance(values, list):
                    raise ValueError("each line must be a JSON list (one record)")
                record = []
                for k, value in enumerate(values):
                    try:
                        record.append(json_value(value, args.dtype))
                    except (ValueError, OverflowError) as exc:
                        raise ValueError(f"value {k}: {exc}") from None
            except ValueError as exc:
                raise CliError(where, str(exc)) from None
            yield where, record


def java_source(path: str, args: argparse.Namespace, fields: Counter) -> Source:
    """One Java ``EValue[]`` record (EVJ1 framing) per .bin file."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        record = java.loads_record(data)
    except evs.FormatError as exc:
        at = "" if exc.offset is None else f" (at byte {exc.offset})"
        raise CliError(path, f"not an EVJ1 record: {exc.reason}{at}") from None
    yield path, record


SOURCES: dict[str, Callable[[str, argparse.Namespace, Counter], Source]] = {
    ".npz": npz_source,
    ".npy": npy_source,
    ".jsonl": jsonl_source,
    ".ndjson": jsonl_source,
    ".bin": java_source,
}


def expand_inputs(args: argparse.Namespace) -> list[str]:
    """Files to pack, in order: arguments as given; directories and globs naturally sorted."""
    files: list[str] = []
    skipped = 0
    for arg in args.sources:
        if os.path.isdir(arg):
            found = []
            for root, _, names in os.walk(arg):
                found += [os.path.join(root, n) for n in names]
        elif os.path.exists(arg):
            if not arg.lower().endswith(PACK_SUFFIXES):
                raise CliError(arg, f"unknown input type; pack reads {', '.join(PACK_SUFFIXES)}")
            files.append(arg)
            continue
        else:
            found = glob.glob(arg, recursive=True)
            if not found:
                raise CliError(arg, "no such file, directory or matching glob")
        found.sort(
            key=lambda p: natural_key(os.path.relpath(p, arg if os.path.isdir(arg) else "."))
        )
        usable = [p for p in found if os.path.isfile(p) and p.lower().endswith(PACK_SUFFIXES)]
        skipped += len(found) - len(usable)
        files += usable
    if skipped:
        note(args, f"{PROG}: skipped {plural(skipped, 'file')} not {'/'.join(PACK_SUFFIXES)}")
    if not files:
        raise CliError(None, f"no input files to pack (it reads {', '.join(PACK_SUFFIXES)})")
    return files


LOCKED = "a running writer has this file open; not replaced (wait until it exits)"


def check_output(path: str) -> None:
    """An output's folder must exist and the output must not be a folder (the errors would
    otherwise name the temporary file)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(path, f"no such folder {folder}")
    if os.path.isdir(path):
        raise CliError(path, "is a directory; give a file name")


def refuse_container(path: str, what: str) -> None:
    """A page or a dictionary never replaces a container (`stats F --html F`): it may hold
    the only copy of its data."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError:
        return
    if head == MAGIC or is_compressed(head):
        raise CliError(path, f"is an evalue_store container; {what} never replaces one")


def refuse_overwrite(path: str, force: bool, append: bool = False) -> None:
    """Replacing a container takes --force: it may hold the only copy of some data. Checked
    before any work: OUT's folder must exist, OUT must not be a folder nor a live writer's."""
    check_output(path)
    if not os.path.exists(path):
        return
    if not force:
        flags = "--append to add to it or --force" if append else "--force"
        raise CliError(path, f"already exists; use {flags} to replace it")
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # unreadable: the rename decides
    try:
        lock(fd, path)
    except evs.WriterLockedError:
        raise CliError(path, LOCKED) from None
    finally:
        os.close(fd)


@contextmanager
def replacing(path: str, *, clobber: bool = True, durable: bool = True) -> Iterator[str]:
    """A temporary name beside ``path`` to build the output under; when the block ends, it is
    renamed to ``path`` and the folder fsynced (``durable``). On any exception, Ctrl-C and
    SIGTERM included, the temporary file is removed, so ``path`` is as it was or complete.

    The rename is refused while a running Writer holds ``path`` (its later commits would go
    to an unlinked inode); without ``clobber`` an existing ``path`` is never replaced.
    """
    check_output(path)
    temp = f"{path}.{os.getpid()}-{secrets.token_hex(3)}.partial"
    try:
        yield temp
        if clobber:
            try:
                replace_locked(temp, path, durable=durable)
            except evs.WriterLockedError:
                raise CliError(path, LOCKED) from None
        else:
            exists = CliError(path, "already exists; use --force to overwrite")
            try:
                os.link(temp, path)  # atomic, and fails if path exists
                os.unlink(temp)
            except FileExistsError:
                raise exists from None
            except OSError as exc:  # no hard links (FAT, some network filesystems)
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP):
                    raise
                if os.path.exists(path):
                    raise exists from None
                os.rename(temp, path)
            if durable:
                fsync_dir(path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp)
        raise


@contextmanager
def new_file(path: str, *, clobber: bool = True, durable: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s bytes into; they appear under ``path`` only when
    complete and fsynced (see ``replacing``)."""
    with replacing(path, clobber=clobber, durable=durable) as temp, open(temp, "xb") as out:
        yield out
        out.flush()
        os.fsync(out.fileno())


@contextmanager
def output_writer(
    path: str,
    *,
    append: bool,
    force: bool,
    metadata: dict | None,
    alignment: int = 64,
    **options: Any,
) -> Iterator[evs.Writer]:
    """A Writer for OUT. A new file is built under a temporary name and renamed when complete,
    so a failed run never leaves a half-written OUT behind (nor replaces an old one).
    ``options`` go to evs.Writer for a new file (compression settings)."""
    if append:
        with evs.Writer(path, "a", metadata=metadata) as writer:
            if writer.salvage:
                s = writer.salvage
                print(
                    f"{PROG}: {path}: salvaged {s.salvaged_records} records of a crashed "
                    f"writer first"
                    + (f"; damaged tail kept in {s.side_file}" if s.side_file else ""),
                    file=sys.stderr,
                )
            yield writer
        return
    refuse_overwrite(path, force)
    with replacing(path) as temp:
        with evs.Writer(temp, "x", metadata=metadata, alignment=alignment, **options) as writer:
            yield writer


def pack_files(files: list[str], args: argparse.Namespace) -> tuple[int, int]:
    """Pack ``files`` into args.output; returns (records written, bytes of the output)."""
    fields: Counter = Counter()
    written = 0
    with output_writer(
        args.output, append=args.append, force=args.force, metadata=args.metadata
    ) as writer:
        try:
            with progress(args, len(files), "pack", "file") as bar:
                for path in files:
                    source = SOURCES[os.path.splitext(path)[1].lower()]
                    try:
                        for where, record in source(path, args, fields):
                            try:
                                writer.append(record)
                            except evs.EncodeError as exc:
                                raise CliError(where, str(exc)) from None
                            written += 1
                    except (ValueError, EOFError, zipfile.BadZipFile) as exc:
                        if "allow_pickle" in str(exc):  # numpy's advice is for its own API
                            exc = ValueError("holds Python objects, which pack never unpickles")
                        raise CliError(path, f"cannot read: {exc}") from None
                    bar.update()
        except Exception as exc:
            if args.append and written:  # the writer aborts: its file stays at its last commit
                code, line = _error_line(exc, None)
                raise CliError(
                    None, f"{line}; nothing was appended, {args.output} is as it was", code
                ) from exc
            raise
        if not args.append and len(fields) == 1 and sum(fields.values()) == len(files):
            # Every input was an .npz with the same arrays: their names name the fields.
            metadata = dict(args.metadata or {})
            metadata.setdefault(FIELDS_KEY, list(next(iter(fields))))
            writer.set_metadata(metadata)
    return written, os.path.getsize(args.output)


# ------------------------------------------------------------------------------- export


def npz_value(value: Any) -> np.ndarray:
    """The inverse of pack's .npz rule: tensors as they are, scalars as 0-d arrays."""
    kind = kind_name(value)
    if kind == "Tensor":
        return value
    if kind in ("Int", "Double", "Bool", "String", "Bytes"):
        return np.array(value)
    if kind in ("ListInt", "ListDouble", "ListBool", "List(empty)"):
        return np.array(value, np.int64 if kind == "List(empty)" else None)
    raise evs.EncodeError(f"a {kind} value has no .npz form; try --format jsonl")


def json_ready(value: Any) -> Any:
    kind = kind_name(value)
    if kind == "Tensor":
        numbers = as_numbers(value)
        if numbers is None:
            raise evs.EncodeError("complex tensors have no JSON form")
        return numbers.tolist()
    if kind == "Bytes":
        raise evs.EncodeError("byte strings have no JSON form; try --format npz")
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    return value


def export_name(args: argparse.Namespace, index: int, count: int, suffix: str) -> str:
    return os.path.join(args.to, f"{index:0{max(6, len(str(count - 1)))}d}{suffix}")


def export_records(ds: evs.Dataset, args: argparse.Namespace, bar: tqdm) -> int:
    """Each file appears complete (written, fsynced, renamed); the folder is fsynced at the end."""
    if os.path.exists(args.to) and not os.path.isdir(args.to):
        raise CliError(args.to, "is a file; --to takes a folder")
    if not os.path.isdir(args.to):
        os.makedirs(args.to)
        fsync_dir(args.to)  # its entry in its parent
    n = len(ds)
    if args.format == "jsonl":
        stem = os.path.splitext(os.path.basename(ds.path))[0]
        out_path = os.path.join(args.to, stem + ".jsonl")
        with new_file(out_path, clobber=args.force) as out:
            for i, record in enumerate(ds):
                try:
                    line = json.dumps(json_ready(record), ensure_ascii=False)
                except evs.EncodeError as exc:
                    raise CliError(ds.path, f"record {i}: {exc}") from None
                out.write(line.encode("utf-8") + b"\n")
                bar.update()
        return n
    names = None
    if args.format == "npz":  # "fields": what pack stored before FIELDS_KEY existed
        names = list(field_names(ds)) or ds.metadata.get("fields")
    for i, record in enumerate(ds):
        try:
            if args.format == "java":
                data = java.dumps_record(record)
            else:
                keys = names if isinstance(names, list) and len(names) == len(record) else None
                keys = keys or [f"arr_{k}" for k in range(len(record))]
                arrays = {str(key): npz_value(v) for key, v in zip(keys, record)}
        except evs.EncodeError as exc:
            raise CliError(ds.path, f"record {i}: {exc}") from None
        suffix = ".bin" if args.format == "java" else ".npz"
        path = export_name(args, i, n, suffix)
        with new_file(path, clobber=args.force, durable=False) as out:
            if args.format == "java":
                out.write(data)
            else:
                np.savez(out, **arrays)
        bar.update()
        if i == n - 1:
            fsync_dir(path)  # every name at once
    return n


# ------------------------------------------------------------------------------- commands


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


def _file(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="an evalue_store container")


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output (stable keys)")


def _info_args(p: argparse.ArgumentParser) -> None:
    _file(p)
    _json_flag(p)


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
    _file(p)
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
    _file(p)
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
    _file(p)
    p.add_argument("--sample", type=at_least_one, metavar="N", help="read N records spread evenly")
    _json_flag(p)
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


def _verify_args(p: argparse.ArgumentParser) -> None:
    _file(p)
    _json_flag(p)


@command("verify", "check every checksum and record", "evalue-store verify train.evs", _verify_args)
def cmd_verify(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds, progress(args, len(ds), "verify", "rec") as bar:
        report = ds.verify(progress=lambda done: bar.update(done - bar.n))
    bad = [(i, without_index(reason, i)) for i, reason in report.bad_records]
    if args.json:
        out = {
            "file": args.file,
            "ok": report.ok,
            "records": report.records,
            "bytes_checked": report.bytes_checked,
            "bad_records": [{"index": i, "reason": r} for i, r in bad],
            "problems": report.problems,
            "uncommitted_bytes": report.uncommitted_bytes,
        }
        print(json.dumps(out, indent=2))
    elif report.ok:
        print(
            f"{args.file}: OK, {report.records:,} records, {report.bytes_checked:,} bytes checked"
        )
    else:
        print(
            f"{args.file}: {plural(len(bad), 'bad record')}, "
            f"{plural(len(report.problems), 'other problem')} ({report.records:,} records checked)"
        )
        for i, reason in bad[:50]:
            print(f"  record {i}: {reason}")
        if len(bad) > 50:
            print(f"  ... and {len(bad) - 50:,} more bad records (--json lists all)")
        for problem in report.problems:
            print(f"  {problem}")
        if report.uncommitted_bytes:
            print(f"  next: `{PROG} recover {args.file}`")
        elif bad:
            print(f"  next: `{PROG} copy {args.file} -o CLEAN --skip-bad` leaves them out")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


@command(
    "recover",
    "after a crash: keep committed records, salvage whole ones from the tail, set the rest aside",
    "evalue-store recover train.evs",
    _file,
)
def cmd_recover(args: argparse.Namespace) -> int:
    open_dataset(args.file).close()  # a file that is no container is a one-line error
    s = evs.recover(args.file)
    if not s.tail_bytes:
        print(
            f"{args.file}: nothing to recover: {s.committed_records:,} committed records, no tail"
        )
        return EXIT_OK
    print(f"{args.file}: kept {s.committed_records:,} committed records")
    print(
        f"salvaged {s.salvaged_records:,} complete records from the {s.tail_bytes:,}-byte "
        "uncommitted tail; they are committed now"
    )
    if s.side_file:
        print(f"moved {s.damaged_bytes:,} damaged tail bytes to {s.side_file} (nothing deleted)")
    return EXIT_OK


def _pack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SRC", help="files, directories or globs")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="container to write")
    p.add_argument(
        "--dtype",
        choices=FLOAT_DTYPES,
        default="float32",
        help="tensor dtype for JSON lists holding a float (default float32)",
    )
    p.add_argument("--metadata", type=json_object, metavar="JSON", help="a JSON object to store")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--append", action="store_true", help="add records to an existing OUT")
    mode.add_argument("--force", action="store_true", help="replace OUT if it exists")


@command(
    "pack",
    "build a container from .npz, .npy, JSON Lines or Java .bin files",
    'evalue-store pack samples/ -o train.evs --metadata \'{"split": "train"}\'',
    _pack_args,
    notes="""One record per .npz file (its arrays in the order stored in the archive, which is
the order given to np.savez), per .npy file (one tensor), per .jsonl/.ndjson line (a
JSON list) and per .bin file (a Java EValue[] in EVJ1 framing). Directories are read
recursively and, like globs, in natural order (2.npz before 10.npz); other files are
skipped. 0-d arrays of bool/int/float/str/bytes become Bool/Int/Double/String values.
JSON: numbers -> Int/Double, strings, bools, null; a list of integers -> int64 tensor,
a list holding any float -> --dtype tensor, a list of bools -> bool tensor; nested
lists must be rectangular. A new OUT appears only when complete.""",
)
def cmd_pack(args: argparse.Namespace) -> int:
    if not args.append:
        refuse_overwrite(args.output, args.force, append=True)
    files = expand_inputs(args)
    written, size = pack_files(files, args)
    print(
        f"packed {plural(written, 'record')} from {plural(len(files), 'file')} into {args.output} "
        f"({size:,} bytes)"
    )
    return EXIT_OK


def _export_args(p: argparse.ArgumentParser) -> None:
    _file(p)
    p.add_argument("--to", required=True, metavar="DIR", help="folder to write into")
    p.add_argument("--format", required=True, choices=("npz", "jsonl", "java"))
    p.add_argument("--force", action="store_true", help="overwrite files that exist")


@command(
    "export",
    "write records out as .npz files, one JSON Lines file or Java EVJ1 .bin files",
    "evalue-store export train.evs --to out/ --format java",
    _export_args,
    notes="""npz and java write one file per record, named by record number (000000.npz,
000001.bin, ...); npz keys come from the "fields" metadata pack stores, else arr_0,
arr_1, ...; java output is byte-identical to .bin files that were packed. jsonl writes
DIR/<name>.jsonl, one JSON list per record (tensors as nested lists).""",
)
def cmd_export(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds, progress(args, len(ds), "export", "rec") as bar:
        n = export_records(ds, args, bar)
    print(f"exported {plural(n, 'record')} to {args.to} as {args.format}")
    return EXIT_OK


def _merge_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="FILE", help="containers, in order")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="container to write")
    p.add_argument("--metadata", type=json_object, metavar="JSON", help="instead of the first's")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")


@command(
    "merge", "concatenate containers", "evalue-store merge a.evs b.evs -o all.evs", _merge_args
)
def cmd_merge(args: argparse.Namespace) -> int:
    refuse_overwrite(args.output, args.force)
    datasets = [open_dataset(path) for path in args.inputs]
    try:
        metadata = dict(args.metadata if args.metadata is not None else datasets[0].metadata)
        names = {field_names(ds) for ds in datasets}
        if len(names) == 1 and FIELDS_KEY not in metadata and names != {()}:
            metadata[FIELDS_KEY] = list(names.pop())  # --metadata replaces the rest only
        elif len(names) > 1 and args.metadata is None:
            metadata.pop(FIELDS_KEY, None)  # records named differently, or not: positional
        total = sum(len(ds) for ds in datasets)
        with (
            output_writer(
                args.output,
                append=False,
                force=args.force,
                metadata=metadata,
                alignment=datasets[0].alignment,
            ) as writer,
            progress(args, total, "merge", "rec") as bar,
        ):
            for ds in datasets:
                copy_raw(ds, writer, bar)
    finally:
        for ds in datasets:
            ds.close()
    print(
        f"merged {plural(total, 'record')} from {plural(len(datasets), 'file')} into {args.output}"
    )
    if len(names) > 1:
        print(f"the inputs name their fields differently: {args.output} names none")
    return EXIT_OK


def _copy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="container to copy")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="container to write")
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave out records that fail their checks (each is listed) instead of stopping",
    )
    p.add_argument("--alignment", type=int, metavar="N", help="OUT's alignment (default FILE's)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    _json_flag(p)


@command(
    "copy",
    "rewrite a container record by record, optionally leaving out damaged records",
    "evalue-store copy train.evs -o clean.evs --skip-bad",
    _copy_args,
    notes="""Records are copied as stored (exact), each checked on the way: its frame, checksum
and structure. A compressed FILE gives a compressed OUT (with its dictionary). Without
--skip-bad the first damaged record stops the copy and OUT is not written; with it, the
records left out are listed and the exit code is 1, since data was lost. Records after a
left-out one move up by one index.""",
)
def cmd_copy(args: argparse.Namespace) -> int:
    alignment = args.alignment
    if alignment is not None and (
        alignment < 8 or alignment > 65536 or alignment & (alignment - 1)
    ):
        raise CliError("--alignment", f"must be a power of two in [8, 65536], not {alignment}")
    refuse_overwrite(args.output, args.force)
    skipped: list[tuple[int, str]] = []

    def leave_out(i: int, error: evs.FormatError) -> None:
        reason = without_index(error.reason, i)
        if not args.skip_bad:
            raise CliError(
                args.file,
                f"record {i}: {reason} (--skip-bad leaves such records out)",
                EXIT_PROBLEMS,
            )
        skipped.append((i, reason))

    with open_dataset(args.file) as ds:
        options: dict[str, Any] = {}
        if ds.compressed:
            options = {"compression": "zstd", "dictionary": evs.read_dictionary(args.file)}
        copy_records(ds, args, "copy", on_bad=leave_out, alignment=alignment, **options)
        copied = len(ds) - len(skipped)
    if args.json:
        out = {
            "file": args.file,
            "output": args.output,
            "records_copied": copied,
            "skipped": [{"index": i, "reason": r} for i, r in skipped],
        }
        print(json.dumps(out, indent=2))
    else:
        print(f"copied {plural(copied, 'record')} from {args.file} into {args.output}")
        if skipped:
            print(f"left out {plural(len(skipped), 'damaged record')}:")
            for i, reason in skipped[:50]:
                print(f"  record {i}: {reason}")
            if len(skipped) > 50:
                print(f"  ... and {len(skipped) - 50:,} more (--json lists all)")
    return EXIT_PROBLEMS if skipped else EXIT_OK


def _compress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="container to compress")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="compressed container")
    p.add_argument(
        "--level", type=int_range(*ZSTD_LEVELS), default=3, help="zstd level, up to 22 (default 3)"
    )
    p.add_argument(
        "--frame-size",
        type=int_range(MIN_FRAME_SIZE, MAX_FRAME_SIZE),
        default=4 << 10,
        metavar="BYTES",
        help="target frame size",
    )
    p.add_argument(
        "--dictionary", action="store_true", help="train a zstd dictionary and store it in OUT"
    )
    p.add_argument(
        "--dict-samples",
        type=at_least_one,
        default=1000,
        metavar="N",
        help="records to train it on",
    )
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")


@command(
    "compress",
    "rewrite a container as seekable zstd frames; random access and appends still work",
    "evalue-store compress train.evs -o train.evs.zst --dictionary",
    _compress_args,
    notes="""OUT holds the same records and metadata as one new commit. Stock zstd decompresses
it ("zstd -d OUT"); with --dictionary it needs the dictionary, which
"evalue-store dictionary OUT -o DICT" writes out.""",
)
def cmd_compress(args: argparse.Namespace) -> int:
    refuse_overwrite(args.output, args.force)
    before = os.path.getsize(args.file)  # OUT may be FILE itself (with --force)
    with open_dataset(args.file) as ds:
        options: dict[str, Any] = {
            "compression": "zstd",
            "level": args.level,
            "frame_size": args.frame_size,
        }
        if args.dictionary:
            samples = ds[: max(8, min(len(ds), args.dict_samples))]
            options["dictionary"] = evs.train_dictionary(samples)
        copy_records(ds, args, "compress", **options)
    after = os.path.getsize(args.output)
    print(
        f"compressed {args.file} ({before:,} bytes) into {args.output} ({after:,} bytes, "
        f"{after / max(before, 1):.2f}x)"
    )
    return EXIT_OK


def copy_records(
    ds: evs.Dataset,
    args: argparse.Namespace,
    what: str,
    on_bad: Callable[[int, evs.FormatError], None] | None = None,
    alignment: int | None = None,
    **options: Any,
) -> None:
    """Write every record of ``ds`` to args.output (a new file) with Writer ``options``,
    and ``ds``'s alignment unless ``alignment`` is given."""
    with (
        output_writer(
            args.output,
            append=False,
            force=args.force,
            metadata=ds.metadata,
            alignment=ds.alignment if alignment is None else alignment,
            **options,
        ) as writer,
        progress(args, len(ds), what, "rec") as bar,
    ):
        copy_raw(ds, writer, bar, on_bad)


def copy_raw(
    ds: evs.Dataset,
    writer: evs.Writer,
    bar: Any,
    on_bad: Callable[[int, evs.FormatError], None] | None = None,
) -> None:
    """Copy every record's payload bytes as they are (exact, and no decoding); only the
    padding before tensor data changes when the alignments differ. A record that fails its
    checks stops the copy, unless ``on_bad(index, error)`` is given to decide."""
    for i in range(len(ds)):
        bar.update()
        try:
            writer.append_raw(ds.raw(i), ds.alignment)
        except evs.FormatError as exc:
            if on_bad is None:
                raise
            on_bad(i, exc)


def _decompress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="compressed container")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="plain container")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")


@command(
    "decompress",
    "turn a compressed container back into the plain one (what zstd -d gives)",
    "evalue-store decompress train.evs.zst -o train.evs",
    _decompress_args,
    notes="""OUT is byte for byte the logical stream, commit history included, exactly what the
stock "zstd -d" writes (no dictionary flag needed here).""",
)
def cmd_decompress(args: argparse.Namespace) -> int:
    refuse_overwrite(args.output, args.force)
    with open_dataset(args.file) as ds:
        if not ds.compressed:
            raise CliError(args.file, "is not compressed")
        with replacing(args.output) as temp:
            with open(temp, "xb") as out, progress(args, ds.logical_size, "decompress", "B") as bar:
                for chunk in ds.logical_chunks():
                    out.write(chunk)
                    bar.update(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            with evs.open(temp) as check:  # what we wrote must be a valid container
                if len(check) != len(ds):
                    raise CliError(args.output, "decompressed output lost records")
    print(f"decompressed {args.file} into {args.output} ({os.path.getsize(args.output):,} bytes)")
    return EXIT_OK


def _dictionary_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="compressed container")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="dictionary file")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")


@command(
    "dictionary",
    "write out the zstd dictionary a compressed container was made with",
    "evalue-store dictionary train.evs.zst -o train.dict && zstd -d -D train.dict train.evs.zst",
    _dictionary_args,
)
def cmd_dictionary(args: argparse.Namespace) -> int:
    refuse_container(args.output, "a dictionary")
    refuse_overwrite(args.output, args.force)
    open_dataset(args.file).close()  # a file that is no container is a one-line error
    data = evs.read_dictionary(args.file)
    if data is None:
        raise CliError(args.file, "holds no dictionary (zstd -d needs none)", EXIT_PROBLEMS)
    with new_file(args.output) as out:
        out.write(data)
    print(f"wrote the {len(data):,}-byte dictionary of {args.file} to {args.output}")
    return EXIT_OK
