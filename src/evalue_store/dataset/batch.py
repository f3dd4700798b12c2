"""Batch reads that produce batches: ``Dataset.get_batch`` and ``ShardedDataset.get_batch``.

A batch is one value per field (dict by field name when the file names its fields, else a
list by position):

* a Tensor field whose dtype and shape are the same in every record of the batch: one
  stacked array [B, *shape], written straight into a fresh buffer or the caller's ``out``;
* an Int / Double / Bool field: a 1-D int64 / float64 / bool array [B];
* anything else (strings, None, lists, tensors whose shapes differ): a list of B values.

Records that share one layout (codec.layout) are checked and copied into their columns in
one compiled pass per record (codec.batch_decode); any other batch is read record by record,
exactly as ``ds[i]`` reads, and then stacked. Either way every record is checked as
``ds[i]`` checks it (its checksum too with ``verify=True``), and an error names the record
(FormatError) or the field (BatchError for an ``out`` that does not fit).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import _native
from ..checksums import NAMES
from ..codec import MAX_VALUES, compile_layout
from ..codec.batch_decode import decode_batch
from ..container import ENTRY_DTYPE, ENTRY_SIZE, FRAME_SIZE
from ..dtypes import BFLOAT16
from ..errors import FIELDS, BatchError, FormatError
from ..values import _is_torch_tensor
from . import indexing

Batch = Any  # dict[str, Any] | list[Any]
Out = Mapping[Any, Any] | None
ENTRY_WORDS = ENTRY_SIZE // 8
_SCALAR_DTYPES = {int: np.dtype("<i8"), float: np.dtype("<f8"), bool: np.dtype("?")}
_DTYPE_AND_SHAPE = operator.attrgetter("dtype", "shape")


def field_keys(names: tuple[str, ...] | None, out: Out) -> dict[int, Any]:
    """``out`` by field position; its keys are field names or positions."""
    if out is None:
        return {}
    if not isinstance(out, Mapping):
        kind = type(out).__name__
        raise TypeError(f"out must map field names or positions to arrays, not {kind}")
    by_position: dict[int, Any] = {}
    for key, target in out.items():
        if isinstance(key, str):
            if names is None or key not in names:
                raise BatchError(f"out[{key!r}]: the file has no field named {key!r}")
            position = names.index(key)
        elif isinstance(key, (bool, np.bool_)):
            raise TypeError(f"out[{key!r}]: a field is named by a str or a position, not a bool")
        else:
            position = operator.index(key)
            width = MAX_VALUES if names is None else len(names)  # (a record's most values)
            if not 0 <= position < width:
                raise BatchError(f"out[{key!r}]: no field at position {key}")
        by_position[position] = target
    return by_position


def _as_numpy(target: Any) -> np.ndarray:
    """A numpy view of an ``out`` target: a numpy array, or a CPU torch tensor (pinned is
    fine) viewed without a copy."""
    if isinstance(target, np.ndarray):
        return target
    if _is_torch_tensor(target):
        if target.device.type != "cpu":
            raise BatchError(f"an out tensor must be in CPU memory, not on {target.device}")
        import torch

        if target.dtype == torch.bfloat16:
            return target.detach().view(torch.int16).numpy().view(BFLOAT16)
        return target.detach().numpy()
    kind = type(target).__name__
    raise TypeError(f"an out buffer is a numpy array or a torch tensor, not {kind}")


class OutRefused(BatchError):
    """An ``out`` buffer that does not fit its field: the batch path that asked stands
    aside, and the record-by-record path, which knows each record's values, says so (a
    layout learned from another record of the same length may have asked wrongly)."""


class Unstackable(ValueError):
    """A column numpy cannot make (more elements than it can address: an empty tensor with
    a dimension near 2**63): the record-by-record path returns that field as a list."""


class Allocator:
    """Hands out the buffer of each stacked column: the caller's ``out`` when given (checked
    to fit), else ``new(shape, dtype)`` (np.empty by default)."""

    def __init__(self, count: int, outs: dict[int, Any], names: Any, new: Any = None):
        self.count, self.outs, self.names = count, outs, names
        self.new = new or (lambda shape, dtype: np.empty(shape, dtype))
        self.scalars: set[int] = set()  # slots stacked from Int, Double or Bool values

    def label(self, k: int) -> str:
        return f"field {self.names[k]!r}" if self.names and k < len(self.names) else f"field {k}"

    def __call__(self, k: int, shape: tuple, dtype: np.dtype, scalar: bool) -> np.ndarray:
        """The array of slot ``k`` (``scalar``: stacked from Int, Double or Bool values,
        which a list of them gives back as Python numbers)."""
        if scalar:
            self.scalars.add(k)
        full = (self.count, *shape)
        if k not in self.outs:
            try:
                return self.new(full, dtype)
            except ValueError as exc:  # numpy's "array is too big"
                raise Unstackable(f"{self.label(k)}: {exc}") from None
        array = _as_numpy(self.outs[k])
        problem = None
        if array.dtype != dtype:
            problem = f"dtype {array.dtype}, the field's is {dtype}"
        elif array.shape != full:
            problem = f"shape {list(array.shape)}, the batch's is {list(full)}"
        elif not array.flags.c_contiguous:
            problem = "not C-contiguous"
        elif not array.flags.writeable:
            problem = "read-only"
        if problem:
            raise OutRefused(f"out for {self.label(k)}: {problem}")
        return array

    def empty(self, k: int) -> None:
        """Check the ``out`` of field k for a batch of no records, whose field's dtype and
        shape are not known: it must hold no row."""
        array = _as_numpy(self.outs[k])
        if array.ndim == 0 or array.shape[0] != 0:
            shape = list(array.shape)
            raise BatchError(f"out for {self.label(k)}: shape {shape}, the batch has 0 records")

    def refuse_list(self, k: int, why: str) -> None:
        if k in self.outs:
            raise OutRefused(f"out for {self.label(k)}: its values do not stack ({why})")


def read_columns(ds: Any, positions: np.ndarray, alloc: Allocator) -> list:
    """The batch of records ``positions`` of one Dataset, as columns by field position."""
    if len(positions):
        try:
            columns = _by_layout(ds, positions, alloc)
        except (OutRefused, Unstackable):
            columns = None  # the record-by-record path says which field, or makes a list
        if columns is not None:
            return columns
    return stack_records(ds._get_positions(positions.tolist()), positions.tolist(), alloc)


def _entries_at(ds: Any, positions: np.ndarray) -> np.ndarray | None:
    """The index entries of ``positions``: gathered from the mapped index segments, read in
    one pass from a plain file, or located record by record in a compressed one (whose
    index is never decompressed). None if one cannot be read: ``ds[i]`` says why."""
    source = ds._source
    if source.compressed:  # in file order: each frame a lookup needs is decompressed once
        order = np.argsort(positions, kind="stable")
        entries = np.empty(len(positions), ENTRY_DTYPE)
        try:
            entries[order] = [ds._entry_of(i) for i in positions[order].tolist()]
        except FormatError:
            return None
        return entries
    if len(ds._segments) == 1:
        which = np.zeros(len(positions), np.intp)
    else:
        which = np.searchsorted(np.asarray(ds._starts, np.int64), positions, side="right") - 1
    if source.mapped is not None:
        if len(ds._segments) == 1:
            return _segment_rows(source.mapped, ds._segments[0], positions)
        entries = np.empty(len(positions), ENTRY_DTYPE)
        for k in np.unique(which).tolist():
            mine = which == k
            entries[mine] = _segment_rows(
                source.mapped, ds._segments[k], positions[mine] - ds._starts[k]
            )
        return entries
    firsts = np.array([seg.offset for seg in ds._segments], np.int64)
    starts = np.asarray(ds._starts, np.int64)
    at = firsts[which] + (positions - starts[which]) * ENTRY_SIZE
    try:
        buf, where = source.gather(at, np.full(len(at), ENTRY_SIZE, np.int64), index=True)
    except FormatError:
        return None
    raw = np.frombuffer(buf, np.uint8)[where[:, None] + np.arange(ENTRY_SIZE)]
    return raw.view(ENTRY_DTYPE).ravel()


def _located_rows(ds: Any, positions: np.ndarray) -> tuple[np.ndarray, list, np.ndarray] | None:
    """A compressed file's batch as ``ds[i]`` finds its records (the locator, then the
    frame, each frame decompressed once while cached), in file order, in one compiled call
    (``_native.locate_batch``): their index entries (from their frame headers, checked
    later as the index's are), the decompressed frame holding each record, and the place of
    its frame header in it: the batch decoder reads the records where they lie. None if a
    record is not found so, or the batch is over GATHER_BYTES: the record-by-record path
    reads it, and says what is wrong."""
    order = np.argsort(positions, kind="stable")
    found = _native.locate_batch(
        ds._source._native, positions[order].astype(np.int64), GATHER_BYTES
    )
    if found is None:
        return None
    entries, frames, places = found
    rows = np.empty(len(positions), ENTRY_DTYPE)
    rows[order] = np.frombuffer(entries, ENTRY_DTYPE)
    at = np.empty(len(positions), np.int64)
    at[order] = np.frombuffer(places, np.int64)
    buffers = [None] * len(positions)
    for k, frame in zip(order.tolist(), frames):
        buffers[k] = frame
    return rows, buffers, at


def _segment_rows(mapped: Any, seg: Any, rows: np.ndarray) -> np.ndarray:
    """Entries ``rows`` of a mapped index segment, taken as rows of 8-byte words (numpy
    copies a structured dtype element by element, several times slower)."""
    words = np.frombuffer(mapped, "<u8", seg.count * ENTRY_WORDS, seg.offset)
    return np.take(words.reshape(-1, ENTRY_WORDS), rows, axis=0).view(ENTRY_DTYPE).ravel()


GROUP_RECORDS = 16  # records per layout (or per shard), on average, for a batch of several
# to be decoded column by column (each group costs a few dozen numpy calls); fewer: record by
# record (W1 over 8 shards, batch 64: 2.3M instructions per batch; column by column 3.8M)
GATHER_BYTES = 64 << 20  # a batch of a source without a mapping is read in one pass up to
# this many bytes; a bigger one record by record (one copy of each record less at a time)


def _by_layout(ds: Any, positions: np.ndarray, alloc: Allocator) -> list | None:
    """The fast path: the batch's records grouped by payload length, each group decoded by
    its layout, the groups' columns merged. None where the batch does not fit it (too many
    layouts, a structure without one, an index entry or record that fails a check): the
    record-by-record path then reads it, and reports what is wrong."""
    checksum = NAMES.get(ds._checksum) if ds._crc_on_read else None
    if ds._crc_on_read and checksum is None:
        return None  # not a function _native computes (a test's wrapper): Python calls it
    located = _located_rows(ds, positions) if ds._located is not None else None
    entries = _entries_at(ds, positions) if located is None else located[0]
    if entries is None:
        return None
    header, end, limit = ds.header, ds.commit.end, ds.max_record_bytes
    offsets, lengths = entries["offset"], entries["length"]
    length = int(lengths[0])
    one = bool((lengths == length).all())
    top = length if one else int(lengths.max())
    if top > end or (limit is not None and top > limit):
        return None
    lo, hi = int(offsets.min()), int(offsets.max())
    if lo < header.data_start or hi > end - FRAME_SIZE - (length if one else 0):
        return None  # (and so both fit in int64)
    offsets = offsets.astype(np.int64)
    if (offsets & (header.alignment - 1)).any() or entries["reserved"].any():
        return None
    lengths = lengths.astype(np.int64)
    if not one and (offsets > end - FRAME_SIZE - lengths).any():
        return None
    if one:
        groups = [np.arange(len(positions))]
    else:
        keys, which = np.unique(lengths, return_inverse=True)
        if len(keys) * GROUP_RECORDS > len(positions):
            return None
        groups = [np.flatnonzero(which == g) for g in range(len(keys))]
    crcs = entries["crc"]
    layouts = []
    for rows in groups:
        k = int(rows[0])  # the group's layout: read (and so checked) first if not yet known
        frame = None if located is None else (memoryview(located[1][k]), int(located[2][k]))
        layout = _layout_for(
            ds, int(positions[k]), int(offsets[k]), int(lengths[k]), int(crcs[k]), frame
        )
        if layout is None or any(j >= len(layout.slots) for j in alloc.outs):
            return None
        layouts.append(layout)
    source = ds._source
    if source.mapped is not None:
        buf, frames = source.mapped, offsets
    elif located is not None:
        _, buf, frames = located
    elif int(lengths.sum()) + FRAME_SIZE * len(lengths) > GATHER_BYTES:
        return None
    else:
        try:
            buf, frames = source.gather(offsets, lengths + FRAME_SIZE)
        except FormatError:
            return None
    parts, allocs = [], []
    for rows, layout in zip(groups, layouts):
        mine = alloc if one else Allocator(len(rows), {}, None)
        allocs.append(mine)
        buf_of, frames_of, crcs_of = buf, frames, crcs
        if not one:
            frames_of, crcs_of = frames[rows], crcs[rows]
            if isinstance(buf, list):  # each record's own frame
                buf_of = [buf[j] for j in rows.tolist()]
        columns = decode_batch(layout, buf_of, frames_of, crcs_of, checksum, mine)
        if columns is None:
            return None
        parts.append(columns)
    if len(parts) > 1:
        return _merge(groups, parts, allocs, len(positions), alloc)
    for k in alloc.outs:
        if not isinstance(parts[0][k], np.ndarray):
            alloc.refuse_list(k, "they are not tensors or scalars")
    return parts[0]


def _merge(
    groups: list[np.ndarray], parts: list[list], allocs: list, count: int, alloc: Allocator
) -> list | None:
    """The columns of a batch from its groups' columns (``groups[g]``: the batch rows of
    group g, whose columns ``allocs[g]`` made): arrays where every group's are of one dtype
    and row shape, else lists of the values as ``ds[i]`` gives them (Python numbers for
    Int, Double and Bool values, arrays for tensors, 0-d ones included)."""
    width = len(parts[0])
    if any(len(columns) != width for columns in parts):
        return None  # the record-by-record path says which records differ
    merged = []
    for k in range(width):
        pieces = [columns[k] for columns in parts]
        first = pieces[0]
        if isinstance(first, np.ndarray) and all(
            isinstance(p, np.ndarray) and (p.dtype, p.shape[1:]) == (first.dtype, first.shape[1:])
            for p in pieces
        ):
            scalar = all(k in mine.scalars for mine in allocs)
            out = alloc(k, first.shape[1:], first.dtype, scalar)
            for rows, piece in zip(groups, pieces):
                out[rows] = piece
        else:
            alloc.refuse_list(k, "its values differ in kind, dtype or shape")
            out = [None] * count
            for rows, piece, mine in zip(groups, pieces, allocs):
                if isinstance(piece, np.ndarray):  # a group's stacked column, row by row
                    if k in mine.scalars:
                        piece = piece.tolist()
                    else:
                        piece = [piece[j, ...] for j in range(len(rows))]
                for row, value in zip(rows.tolist(), piece):
                    out[row] = value
        merged.append(out)
    return merged


def _layout_for(
    ds: Any, i: int, offset: int, length: int, crc: int, frame: tuple[Any, int] | None = None
) -> Any:
    """The Layout of records of ``length`` bytes, compiled from record ``i`` (read, and so
    checked, first; ``frame``: its frame is already at buf[pos]) if the dataset has none
    yet; None if that structure has none."""
    if length not in ds._layouts:
        if frame is None:
            ds._read(i, offset, length, crc)  # raises for a bad record
            buf, pos = ds._source.frame(offset, FRAME_SIZE + length)
        else:
            buf, pos = frame
            ds._decode(i, buf, pos, offset, length, crc)  # raises for a bad record
        layout = compile_layout(buf, pos, length, ds.header.alignment)
        ds._remember_layout(length, layout)
        return layout
    return ds._layouts.get(length)


def stack_records(records: list, where: Sequence[int], alloc: Allocator) -> list:
    """Decoded records (lists of values; ``where`` their record numbers) as columns."""
    if not records:
        return []
    width = len(records[0])
    for record, i in zip(records, where):
        if len(record) != width:
            raise BatchError(
                f"record {i} has {len(record)} values, record {where[0]} has {width}: "
                "a batch needs one value count"
            )
    for k in alloc.outs:
        if k >= width:
            raise BatchError(f"out for {alloc.label(k)}: the records have {width} values")
    return [_stack([r[k] for r in records], k, alloc) for k in range(width)]


def _stack(values: list, k: int, alloc: Allocator) -> Any:
    first = values[0]
    kind = type(first)
    one_kind = len(set(map(type, values))) == 1  # (loops in C: this runs per field per batch)
    if kind is np.ndarray:
        shape = first.shape
        if one_kind and set(map(_DTYPE_AND_SHAPE, values)) == {(first.dtype, shape)}:
            try:
                out = alloc(k, shape, first.dtype, False)
            except Unstackable as exc:
                alloc.refuse_list(k, str(exc))
                return values
            if shape:  # rows of the values laid end to end: one copy loop in C
                np.concatenate(values, out=out.reshape(len(values) * shape[0], *shape[1:]))
            else:
                out[...] = values
            return out
        alloc.refuse_list(k, "tensors of different shapes or dtypes")
        return values
    dtype = _SCALAR_DTYPES.get(kind)
    if dtype is not None and one_kind:
        out = alloc(k, (), dtype, True)
        out[...] = values
        return out
    alloc.refuse_list(k, f"{kind.__name__} values" if dtype is None else "mixed kinds")
    return values


def get_batch(ds: Any, indices: Any, out: Out = None, new: Any = None) -> Batch:
    """``Dataset.get_batch``: see there. ``new(shape, dtype)`` allocates stacked columns."""
    ds._ensure_open()
    positions = indexing.many(indices, len(ds))
    names = ds.fields
    alloc = Allocator(len(positions), field_keys(names, out), names, new)
    return name_columns(read_columns(ds, positions, alloc), names, alloc)


def name_columns(columns: list, names: tuple[str, ...] | None, alloc: Allocator) -> Batch:
    """The batch as returned: the caller's own ``out`` objects (a tensor stays a tensor),
    by field name when the file has names. A batch of no records has no columns: it is
    then empty lists, and the caller's ``out`` objects (checked to hold no row)."""
    if not columns and alloc.count == 0 and alloc.outs:
        width = len(names) if names is not None else max(alloc.outs) + 1
        columns = [[] for _ in range(width)]
        for k in alloc.outs:
            alloc.empty(k)
    for k, target in alloc.outs.items():
        columns[k] = target
    if names is None:
        return columns
    if not columns:
        return {name: [] for name in names}
    if len(columns) != len(names):
        raise FormatError(
            f"records have {len(columns)} values for {len(names)} field names", code=FIELDS
        )
    return dict(zip(names, columns))
