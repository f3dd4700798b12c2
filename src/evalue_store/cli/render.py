"""What the commands share: exit codes, one-line errors, progress bars and notes, opening
a container, and the names and text of values.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

import evalue_store as evs

from ..dtypes import CODE_TO_NAME, dtype_code

PROG = "evalue-store"
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A problem to report as one line, ``evalue-store: WHERE: MESSAGE``, with an exit code."""

    def __init__(self, where: str | None, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.where = where
        self.message = message
        self.code = code


def located(exc: evs.FormatError) -> str:
    """A FormatError's reason and, when it is known, where: ``problem (at byte N)``."""
    at = "" if exc.offset is None else f" (at byte {exc.offset})"
    return f"{exc.reason}{at}"


def error_line(exc: Exception, file: str | None) -> tuple[int, str]:
    """Exit code and ``WHERE: problem`` text for an exception, without a traceback."""
    if isinstance(exc, CliError):
        return exc.code, f"{exc.where}: {exc.message}" if exc.where else exc.message
    if isinstance(exc, evs.FormatError):
        where = exc.path or file
        return EXIT_PROBLEMS, f"{where}: {located(exc)}" if where else located(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else file
        if file and where == os.path.abspath(file):  # opened by its absolute name
            where = file
        return EXIT_USAGE, f"{where}: {exc.strerror}" if where else exc.strerror
    if isinstance(exc, OSError):  # a store's error (RemoteError...): its text names the URL
        return EXIT_USAGE, str(exc)
    if isinstance(exc, evs.WriterLockedError):
        return EXIT_USAGE, f"{exc} (wait until it exits)"
    if isinstance(exc, (evs.EncodeError, ValueError)):
        return EXIT_USAGE, f"{file}: {exc}" if file else str(exc)
    return EXIT_USAGE, f"internal error {type(exc).__name__}: {exc} (--debug shows where)"


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


def open_dataset(path: str) -> evs.Dataset:
    """Open a container; a file that cannot be read at all is an input error (exit 2)."""
    try:
        return evs.open(path)
    except evs.FormatError as exc:
        raise CliError(path, located(exc)) from None
    except IsADirectoryError:
        raise CliError(path, "is a directory, not an evalue_store file") from None
    except FileNotFoundError as exc:  # named as given (the library opens it by its full name)
        raise CliError(path, exc.strerror or "no such file") from None


def field_names(ds: evs.Dataset) -> tuple[str, ...]:
    """The file's field names, or () if it has none (or its metadata is unreadable)."""
    try:
        return ds.fields or ()
    except evs.FormatError:
        return ()


def sample_indices(n: int, sample: int | None) -> Sequence[int]:
    """All indices (a range: n may be billions), or ``sample`` of them evenly spread
    (deterministic, in file order)."""
    if not sample or sample >= n:
        return range(n)
    return np.unique(np.linspace(0, n - 1, sample).round().astype(np.int64))


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


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


def bin_label(low: float, high: float, integer: bool) -> str:
    if integer:
        return num(int(low)) if high - low == 1 else f"{num(int(low))}..{num(int(high) - 1)}"
    return f"{num(low)}..{num(high)}"


def field_label(row: dict) -> str:
    """``[2]``, or ``[2] label:`` when the position has a field name."""
    return f"[{row['position']}] {row['field']}:" if row.get("field") else f"[{row['position']}]"


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


def as_numbers(array: np.ndarray) -> np.ndarray | None:
    """The array as plain numbers (bfloat16 widened), or None for complex tensors."""
    if array.dtype == evs.BFLOAT16:
        return evs.bfloat16_to_float32(array)
    if array.dtype.kind == "c":
        return None
    return array
