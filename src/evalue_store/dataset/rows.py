"""Batched appends (``Writer.extend``): rows gathered into columns and written as
``extend_columns`` writes them, without a loop per record in the encoder. The file is byte
for byte what appending the rows one by one writes (``extend_columns`` promises that).

A row joins the batch begun by an earlier row when it is a list or tuple of as many values,
each of the kind of the first row's value there: an ndarray of the same dtype, shape and
strides (C-contiguous, little-endian, at least 1-D, smaller than the size a writer writes
from the caller's array), copied into the batch's [B, ...] array as it is taken, so that a
generator may reuse its arrays; or an int, float, bool, str, bytes or None. Any other row
ends the batch. A batch that cannot be encoded or written together is appended row by row,
which raises where ``append`` would, after the rows before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..codec.grammar import BIG_PART
from .columns import append_columns

BATCH_ROWS = 256  # rows per batch, at most
BATCH_BYTES = 1 << 20  # tensor bytes per batch, at most
MIN_ROWS = 16  # a batch cut shorter is appended row by row: a layout costs more
_SCALARS = (int, float, bool, str, bytes, type(None))
_ARRAYS = {int: np.int64, float: np.float64, bool: np.bool_}  # the columns append reads back


class _Batch:
    """Rows of one structure; ``fields[k]`` is (the value's type, its column: a [B, ...]
    array or a list of B values, and for a tensor its dtype, shape and strides)."""

    __slots__ = ("fields", "count", "rows")

    def __init__(self, fields: list[tuple], rows: int):
        self.fields = fields
        self.count = 0
        self.rows = rows

    @classmethod
    def start(cls, row: Any) -> _Batch | None:
        """A batch for rows like ``row`` (not yet taken), or None if it cannot lead one."""
        if type(row) is not list and type(row) is not tuple:
            return None
        shapes, nbytes = [], 0
        for value in row:
            kind = type(value)
            if kind is np.ndarray:
                dtype = value.dtype
                if (
                    not value.ndim
                    or value.nbytes >= BIG_PART
                    or dtype.kind not in "biufc"
                    or dtype.byteorder == ">"
                    or not value.flags.c_contiguous
                ):
                    return None
                shapes.append((dtype, value.shape, value.strides))
                nbytes += value.nbytes
            elif kind in _SCALARS:
                shapes.append(None)
            else:
                return None
        rows = max(1, min(BATCH_ROWS, BATCH_BYTES // max(nbytes, 1)))
        try:
            fields = [
                (type(value), [None] * rows, None, None, None)
                if shape is None
                else (np.ndarray, np.empty((rows, *shape[1]), shape[0]), *shape)
                for value, shape in zip(row, shapes)
            ]
        except ValueError:  # a column numpy cannot address (an empty tensor, a dim near
            return None  # 2**63): such rows are appended one by one
        return cls(fields, rows)

    def take(self, row: Any) -> bool:
        """Add ``row`` (its values copied) if it has the batch's structure."""
        if (type(row) is not list and type(row) is not tuple) or len(row) != len(self.fields):
            return False
        j = self.count
        for value, (kind, column, dtype, shape, strides) in zip(row, self.fields):
            if type(value) is not kind:
                return False
            if dtype is not None:
                if value.dtype != dtype or value.shape != shape or value.strides != strides:
                    return False
                column[j] = value
            else:
                column[j] = value
        self.count = j + 1
        return True

    def columns(self) -> dict[int, Any]:
        """The batch as ``extend_columns`` takes it (ValueError: an int beyond int64)."""
        n = self.count
        out: dict[int, Any] = {}
        for k, (kind, column, *_) in enumerate(self.fields):
            if kind is np.ndarray:
                out[k] = column[:n]
            elif kind in _ARRAYS:
                out[k] = np.array(column[:n], _ARRAYS[kind])
            else:
                out[k] = column[:n]
        return out

    def row(self, j: int) -> list:
        return [column[j] for _, column, *_ in self.fields]


def extend_rows(writer: Any, records: Iterable[Any]) -> None:
    """``Writer.extend`` (the writer is open and locked)."""
    batch: _Batch | None = None
    direct = 0  # rows to append one by one before batching is tried again
    iterator = iter(records)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            break
        except BaseException:
            if batch is not None:  # the rows taken before the iterator failed are appended
                _write(writer, batch)
            raise
        if batch is not None:
            if batch.take(row):
                if batch.count == batch.rows:
                    _write(writer, batch)
                    batch = None
                continue
            short = batch.count < MIN_ROWS
            _write(writer, batch)
            batch = None
            if short:  # structures change often here: batching would cost more
                direct = BATCH_ROWS
        if direct:
            direct -= 1
            writer.append(row)
            continue
        batch = _Batch.start(row)
        if batch is None or not batch.take(row):
            batch, direct = None, BATCH_ROWS  # rows like this one are not batched
            writer.append(row)
    if batch is not None:
        _write(writer, batch)


def _write(writer: Any, batch: _Batch) -> None:
    """Append the batch's rows: together if they encode as one layout, else one by one."""
    if batch.count >= MIN_ROWS:
        try:
            writer._check_open()
            append_columns(writer, batch.columns())
            return
        except Exception:
            if writer._failed:  # the write failed and could not be undone: as append would
                raise
    for j in range(batch.count):
        writer.append(batch.row(j))  # raises as append does, at the row it would
