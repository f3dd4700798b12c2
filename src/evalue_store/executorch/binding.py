"""A dataset bound to one ExecuTorch program method: records checked against the method's
inputs once, then read as batches shaped exactly as the method takes them.

ExecuTorch's runtime accepts only tensors of exactly the planned dtype and rank, and its
errors name neither the record nor the field; so every record is checked up front (an
``InputMismatchError`` names record, field and what the input wants), and each batch gets a
cheap check of what it stacks. Per field, records hold either a tensor without the batch
dimension (stacked), a tensor with a leading 1 (concatenated: how the Android app builds
examples) or a Python bool/int/float (converted to the input's dtype).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Union

import numpy as np
import torch

from ..dataset import indexing
from ..dataset.reader import Dataset, open_dataset
from ..dtypes import BFLOAT16
from ..errors import FormatError, InputMismatchError, UsageError
from ..shards import ShardedDataset, open_shards
from ..torch import as_torch
from .fields import Field, Layout, as_count, name_of, pick, value_text
from .program import MethodInputs, Program, program_bytes, program_digest, read_method_inputs

Data = Union[Dataset, ShardedDataset, str, Path, Sequence[Union[str, Path]]]
LAST = ("drop", "keep", "wrap", "zeros")
READ_RECORDS = 4096  # records per read (of batches, and of the up-front check), at most
READ_BYTES = 4 << 20  # and at most this many bytes of buffers


class Batch(NamedTuple):
    """``inputs``: one tensor per method input, in call order; ``indices``: the records in
    it (padding excluded); ``valid``: how many leading rows are real records."""

    inputs: list[torch.Tensor]
    indices: np.ndarray
    valid: int


def _open(data: Data) -> Dataset | ShardedDataset:
    if isinstance(data, (Dataset, ShardedDataset)):
        return data
    if isinstance(data, (str, Path)) and os.path.isfile(data) and not str(data).endswith(".json"):
        return open_dataset(data)  # one file: no shard layer in between
    return open_shards(data)


class Rows:
    """The buffers of batches of ``rows`` rows: one array per field, its torch view, and
    the batch read's targets for the tensor fields (rows of [1, *shape] where records carry
    the leading 1), made once so that a reused buffer costs nothing per batch."""

    def __init__(self, rows: int, fields: Sequence[Field], layouts: Sequence[Layout]):
        pairs = list(zip(fields, layouts))
        self.arrays = [np.empty((rows, *lay.shape), f.spec.dtype) for f, lay in pairs]
        self.tensors = [_tensor(a) for a in self.arrays]
        self._pairs = pairs
        self._full = self._targets(rows)

    def _targets(self, n: int) -> dict[int, np.ndarray]:
        targets = {}
        for (field, layout), array in zip(self._pairs, self.arrays):
            if not layout.scalar:
                rows = array[:n]
                targets[field.position] = rows.reshape(n, 1, *layout.shape) if layout.lead else rows
        return targets

    def targets(self, n: int) -> dict[int, np.ndarray]:
        """Targets for the first ``n`` rows."""
        return self._full if n == len(self.arrays[0]) else self._targets(n)


class Binding:
    """Records of ``data`` (a Dataset, ShardedDataset or any ``open_shards`` source) bound
    to ``method`` of ``program`` (a .pte path or its bytes).

    ``fields`` picks the record values feeding the inputs, in input order (names for a
    named file, or positions); by default every value of a record, in order, and a record
    must then hold exactly one value per input. ``batch_size`` defaults to the program's
    static batch (or, for a dynamic batch, its upper bound). ``last`` handles a last batch
    of fewer records: ``"drop"`` it (the default for a static batch), ``"keep"`` it smaller
    (the default for a dynamic one), ``"wrap"`` (fill it with the first records of the
    order) or ``"zeros"`` (fill with zeros; ``Batch.valid`` tells the real rows).
    ``check="all"`` checks every record now; ``"first"`` only the first (each batch is
    still checked when read).
    """

    def __init__(
        self,
        data: Data,
        program: Program,
        method: str = "forward",
        *,
        fields: Sequence[str | int] | None = None,
        batch_size: int | None = None,
        last: str | None = None,
        check: str = "all",
    ):
        self.dataset = _open(data)
        code = program_bytes(program)
        self.inputs: MethodInputs = read_method_inputs(code, method)
        self.program_digest = program_digest(code)  # a Trainer checks it is its program
        self.method = method
        self.fields = pick(fields, self.inputs.inputs, self.dataset.fields, method)
        self._every_value = fields is None  # then a record holds exactly one value per input
        self.batch_size, self.last = self._batching(batch_size, last)
        if check not in ("all", "first"):
            raise UsageError(f"check must be 'all' or 'first', not {check!r}")
        if len(self.dataset) == 0:
            raise UsageError("the dataset holds no records")
        self._buffers: dict[int, Rows] = {}
        self.layouts = self._check(check == "all")
        self._buffers.clear()

    # ----------------------------------------------------------------- binding
    def _batching(self, batch_size: int | None, last: str | None) -> tuple[int, str]:
        static, bound = self.inputs.static_batch, self.inputs.max_batch
        dynamic = all(s.dynamic for s in self.inputs.inputs)
        if not dynamic and static is None:
            raise UsageError(f"{self.method!r}: static inputs disagree on the batch size")
        if batch_size is None:
            batch_size = static if not dynamic else bound
            if batch_size is None:
                raise UsageError(f"{self.method!r} has an unbounded batch: pass batch_size")
        batch_size = as_count("batch_size", batch_size, least=1)
        if not dynamic and batch_size != static:
            raise UsageError(f"{self.method!r} takes batches of exactly {static}: not {batch_size}")
        if bound is not None and batch_size > bound:
            raise UsageError(f"{self.method!r} takes batches of at most {bound}: not {batch_size}")
        last = last or ("keep" if dynamic else "drop")
        if last not in LAST or (last == "keep" and not dynamic):
            allowed = LAST if dynamic else tuple(x for x in LAST if x != "keep")
            raise UsageError(f"last must be one of {allowed} for this program, not {last!r}")
        return batch_size, last

    def _record_error(self, i: int, record: Any, layouts: Sequence[Layout | None]) -> None:
        """Raise InputMismatchError if record ``i`` does not fit (or not like ``layouts``)."""
        if isinstance(record, dict):
            record = list(record.values())
        inputs = len(self.fields)
        if self._every_value and len(record) > inputs:
            found = f"{len(record)} values where {self.method!r} takes {inputs} inputs"
            raise InputMismatchError(
                i, name_of(inputs, self.dataset.fields), "no such input", found
            )
        for field, layout in zip(self.fields, layouts):
            if field.position >= len(record):
                found = f"a record of {len(record)} values"
                raise InputMismatchError(i, field.name, field.expected(self.method), found)
            value = record[field.position]
            got = field.layout_of(value)
            if got is None:
                raise InputMismatchError(
                    i, field.name, field.expected(self.method), value_text(value)
                )
            if layout is not None and got != layout:
                expected = field.expected(self.method)
                like = "a Python number" if layout.scalar else f"shape {layout.shape}"
                if layout.lead:
                    like += " after the leading 1"
                raise InputMismatchError(
                    i,
                    field.name,
                    f"{expected}, the same in every record ({like})",
                    value_text(value),
                )

    def _check(self, every: bool) -> list[Layout]:
        """Check the first record (it fixes each field's layout), then with ``every`` all
        the others, read in chunks through the batch path and its per-batch check."""
        first = self.dataset[0]
        self._record_error(0, first, [None] * len(self.fields))
        values = list(first.values()) if isinstance(first, dict) else first
        self.layouts = [f.layout_of(values[f.position]) for f in self.fields]
        pairs = zip(self.fields, self.layouts)
        row = sum(f.spec.dtype.itemsize * int(np.prod(lay.shape)) for f, lay in pairs)
        self._read_rows = max(1, min(READ_RECORDS, READ_BYTES // max(row, 1)))
        if every:
            n = len(self.dataset)
            for begin in range(0, n, self._read_rows):
                indices = np.arange(begin, min(n, begin + self._read_rows))
                self._gather(indices, self._buffers_for(len(indices), True))
        return self.layouts

    # ------------------------------------------------------------------- batches
    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (rest > 0 and self.last != "drop")

    def epoch_order(self, epoch: int, seed: int = 0, shuffle: bool = True) -> np.ndarray:
        """The record order of an epoch: a permutation fixed by (seed, epoch), or file order."""
        n = len(self.dataset)
        if not shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([seed, epoch]).permutation(n)

    def batches(
        self, order: np.ndarray | None = None, *, start: int = 0, reuse: bool = False
    ) -> Iterator[Batch]:
        """Batches over ``order`` (record indices, default file order), from batch ``start``.

        Records are read ahead several batches at a time (up to ``READ_RECORDS`` records or
        ``READ_BYTES`` bytes per read), and batches are views of what was read: a read's
        fixed cost is paid once for many small batches. With ``reuse`` the next read
        overwrites them (no allocation per step: for a loop done with a batch after its
        step); otherwise every read has buffers of its own.
        """
        order = self._order(order)
        size = self.batch_size
        todo = order[as_count("start", start) * size :]
        full = len(todo) // size
        per_read = max(1, self._read_rows // size)
        for first in range(0, full, per_read):
            count = min(per_read, full - first)
            indices = todo[first * size : (first + count) * size]
            tensors = self._read(indices, len(indices), reuse)
            for j in range(count):
                part = slice(j * size, (j + 1) * size)
                yield Batch([t[part] for t in tensors], indices[part], size)
        tail = todo[full * size :]
        if len(tail) and self.last != "drop":
            indices = tail
            if self.last == "wrap":
                indices = np.concatenate([tail, np.resize(order, size - len(tail))])
            rows = size if self.last == "zeros" else len(indices)
            yield Batch(self._read(indices, rows, reuse), tail, len(tail))

    def read(self, indices: Sequence[int] | np.ndarray) -> list[torch.Tensor]:
        """The method's inputs for exactly these records (any count the program accepts):
        ``indices`` as ``Dataset.get_batch`` takes them, a boolean mask included."""
        indices = indexing.many(indices, len(self.dataset))
        self._check_rows(len(indices))
        return self._read(indices, len(indices), False)

    def _check_rows(self, rows: int) -> None:
        """A batch ``read`` makes must be one the program takes (ExecuTorch refuses others
        when it runs, with an error code): its static batch size exactly, else between 1
        and its bound."""
        static, bound = self.inputs.static_batch, self.inputs.max_batch
        if not all(s.dynamic for s in self.inputs.inputs) and rows != static:
            raise UsageError(f"{self.method!r} takes batches of exactly {static}: not {rows}")
        if rows < 1 or (bound is not None and rows > bound):
            most = str(bound) if bound is not None else "any number"
            raise UsageError(f"{self.method!r} takes batches of 1 to {most}: not {rows}")

    def _order(self, order: Any) -> np.ndarray:
        """``order`` as record positions: integers as ``get_batch`` takes them (negative
        ones count from the end; a bool or float is a TypeError, as there); a boolean mask
        selects records rather than ordering them, so it is refused here."""
        n = len(self.dataset)
        if order is None:
            return np.arange(n, dtype=np.int64)
        dtype = getattr(order, "dtype", None)
        if dtype is None and not isinstance(order, slice):
            try:
                dtype = np.asarray(order).dtype
            except (TypeError, ValueError):
                dtype = None  # ragged: indexing.many says what is wrong
        if str(dtype) in ("bool", "torch.bool"):
            raise TypeError(
                "order is a sequence of record indices, not a boolean mask "
                "(np.flatnonzero(mask) gives the records a mask selects)"
            )
        return indexing.many(order, n)

    def _read(self, indices: np.ndarray, rows: int, reuse: bool) -> list[torch.Tensor]:
        buffers = self._buffers_for(rows, reuse)
        if rows > len(indices):
            for b in buffers.arrays:
                b[len(indices) :] = 0
        return self._gather(indices, buffers)

    def _buffers_for(self, rows: int, reuse: bool) -> Rows:
        """Fresh buffers of ``rows`` rows; with ``reuse`` those of the last call."""
        buffers = self._buffers.get(rows) if reuse else None
        if buffers is None:
            buffers = Rows(rows, self.fields, self.layouts)
            if reuse:
                self._buffers[rows] = buffers
        return buffers

    def _gather(self, indices: np.ndarray, out: Rows) -> list[torch.Tensor]:
        """Read records ``indices`` into the first rows of ``out``, checked: the batch read
        (``_columns``) puts tensors straight into their rows and refuses another shape or
        dtype, scalars are checked for kind and range here; a batch that fails is then read
        record by record to find the record to blame."""
        n = len(indices)
        if n == 1 and len(out.arrays[0]) == 1:  # not a padded batch: "zeros" fills the rest
            one = self._one(int(indices[0]), out.arrays)
            if one is not None:
                return one
        try:
            columns = self._columns(indices, out.targets(n))
            if self._every_value and len(columns) != len(self.fields):
                raise UsageError("another number of values")
            for field, layout, buf in zip(self.fields, self.layouts, out.arrays):
                if layout.scalar:
                    _fill_scalars(buf[:n], columns[field.position])
        except FormatError:
            raise
        except (ValueError, TypeError, OverflowError):
            self._locate(indices)
        return out.tensors

    def _columns(self, indices: np.ndarray, targets: dict[int, np.ndarray]) -> list:
        """The batch read: ``get_batch`` of records ``indices``, the tensor fields decoded
        straight into ``targets`` (ValueError where they do not fit), columns by position."""
        batch = self.dataset.get_batch(indices, out=targets)
        return list(batch.values()) if isinstance(batch, dict) else batch

    def _one(self, i: int, out: list[np.ndarray]) -> list[torch.Tensor] | None:
        """A batch of one record: its tensors themselves, private but not copied when big
        (``as_torch``); None if the record does not fit (the general path says why)."""
        record = self.dataset[i]
        values = list(record.values()) if isinstance(record, dict) else record
        if self._every_value and len(values) != len(self.fields):
            return None
        tensors = []
        for field, layout, buf in zip(self.fields, self.layouts, out):
            value = values[field.position] if field.position < len(values) else None
            if field.layout_of(value) != layout:
                return None
            if layout.scalar:
                buf[0] = value
                tensors.append(_tensor(buf))
            else:
                tensors.append(_tensor(as_torch(np.ascontiguousarray(value).reshape(buf.shape))))
        return tensors

    def _locate(self, indices: np.ndarray) -> None:
        records = self.dataset.get_many(indices)
        for i, record in zip(indices.tolist(), records):
            self._record_error(i, record, self.layouts)
        raise AssertionError("a batch failed its check but none of its records did")

    # ------------------------------------------------------------ torch samples
    def collate(self, samples: Sequence[Any]) -> list[torch.Tensor]:
        """``collate_fn`` for a DataLoader over ``evalue_store.torch.EValueDataset`` of the
        same file: samples (lists of tensors and Python values) to the method's inputs, the
        same tensors ``read`` gives, so one container feeds ExecuTorch and eager torch."""
        result = []
        for field, layout in zip(self.fields, self.layouts):
            column = [s[field.position] for s in samples]
            dtype = torch.from_numpy(np.empty(0, field.spec.dtype)).dtype
            shape = (1, *layout.shape) if layout.lead else layout.shape
            for k, v in enumerate(column):
                ok = isinstance(v, torch.Tensor) and v.dtype == dtype and tuple(v.shape) == shape
                if not (ok or (layout.scalar and field.layout_of(v) == layout)):
                    found = f"{value_text(v)} (sample {k} of the batch)"
                    raise InputMismatchError(None, field.name, field.expected(self.method), found)
            if layout.scalar:
                result.append(torch.tensor(column, dtype=dtype))
            else:
                result.append(torch.cat(column) if layout.lead else torch.stack(column))
        return result


_SCALAR_KINDS = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}  # input kind: value kinds


def _fill_scalars(out: np.ndarray, column: Any) -> None:
    """A column of Python bools/ints/floats (a list, or an int64 / float64 / bool array)
    into ``out`` of the input's dtype; TypeError for another kind, OverflowError for an
    integer out of the dtype's range."""
    if not isinstance(column, np.ndarray):
        if not set(map(type, column)) <= {bool, int, float}:
            raise TypeError("not Python numbers")
        column = np.asarray(column)
    if column.dtype.kind not in _SCALAR_KINDS.get(out.dtype.kind, "") or column.shape != out.shape:
        raise TypeError("not numbers of the input's kind")
    if out.dtype.kind in "iu" and column.dtype != out.dtype and len(column):
        info = np.iinfo(out.dtype)
        if column.min() < info.min or column.max() > info.max:
            raise OverflowError(f"integers out of {out.dtype} range")
    np.copyto(out, column, casting="unsafe")


def _tensor(array: Any) -> torch.Tensor:
    if isinstance(array, torch.Tensor):
        return array
    if array.dtype == BFLOAT16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def bind(data: Data, program: Program, method: str = "forward", **options: Any) -> Binding:
    """``Binding(data, program, method, **options)``: see ``Binding``."""
    return Binding(data, program, method, **options)
