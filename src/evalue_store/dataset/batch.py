"""Batch reads that produce batches: ``Dataset.get_batch`` and ``ShardedDataset.get_batch``.

A batch is one value per field (dict by field name when the file names its fields, else a
list by position):

* a Tensor field whose dtype and shape are the same in every record of the batch: one
  stacked array [B, *shape], written straight into a fresh buffer or the caller's ``out``;
* an Int / Double / Bool field: a 1-D int64 / float64 / bool array [B];
* anything else (strings, None, lists, tensors whose shapes differ): a list of B values.

Records of a plain, memory-mapped file that share one layout (codec.layout) are checked and
copied column by column (codec.batch); any other batch is read record by record, exactly as
``ds[i]`` reads, and then stacked. Either way every record is checked as ``ds[i]`` checks it
(its checksum too with ``verify=True``), and an error names the record (FormatError) or the
field (ValueError for an ``out`` that does not fit).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..codec import compile_layout
from ..codec.batch import decode_batch
from ..container import ENTRY_DTYPE, FRAME_SIZE
from ..dtypes import BFLOAT16
from ..errors import FormatError
from ..values import _is_torch_tensor
from . import indexing

Batch = Any  # dict[str, Any] | list[Any]
Out = Mapping[Any, Any] | None
_SCALAR_DTYPES = {int: np.dtype("<i8"), float: np.dtype("<f8"), bool: np.dtype("?")}


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
                raise ValueError(f"out[{key!r}]: the file has no field named {key!r}")
            position = names.index(key)
        else:
            position = operator.index(key)
            if position < 0 or (names is not None and position >= len(names)):
                raise ValueError(f"out[{key!r}]: no field at position {key}")
        by_position[position] = target
    return by_position


def _as_numpy(target: Any) -> np.ndarray:
    """A numpy view of an ``out`` target: a numpy array, or a CPU torch tensor (pinned is
    fine) viewed without a copy."""
    if isinstance(target, np.ndarray):
        return target
    if _is_torch_tensor(target):
        if target.device.type != "cpu":
            raise ValueError(f"an out tensor must be in CPU memory, not on {target.device}")
        import torch

        if target.dtype == torch.bfloat16:
            return target.detach().view(torch.int16).numpy().view(BFLOAT16)
        return target.detach().numpy()
    kind = type(target).__name__
    raise TypeError(f"an out buffer is a numpy array or a torch tensor, not {kind}")


class Allocator:
    """Hands out the buffer of each stacked column: the caller's ``out`` when given (checked
    to fit), else ``new(shape, dtype)`` (np.empty by default)."""

    def __init__(self, count: int, outs: dict[int, Any], names: Any, new: Any = None):
        self.count, self.outs, self.names = count, outs, names
        self.new = new or (lambda shape, dtype: np.empty(shape, dtype))

    def label(self, k: int) -> str:
        return f"field {self.names[k]!r}" if self.names and k < len(self.names) else f"field {k}"

    def __call__(self, k: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
        full = (self.count, *shape)
        if k not in self.outs:
            return self.new(full, dtype)
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
            raise ValueError(f"out for {self.label(k)}: {problem}")
        return array

    def refuse_list(self, k: int, why: str) -> None:
        if k in self.outs:
            raise ValueError(f"out for {self.label(k)}: its values do not stack ({why})")


def read_columns(ds: Any, positions: np.ndarray, alloc: Allocator) -> list:
    """The batch of records ``positions`` of one Dataset, as columns by field position."""
    if len(positions) and ds._source.mapped is not None:
        columns = _mapped_columns(ds, positions, alloc)
        if columns is not None:
            return columns
    return stack_records(ds._get_positions(positions.tolist()), positions.tolist(), alloc)


def _entries_at(ds: Any, positions: np.ndarray) -> np.ndarray:
    """The index entries of ``positions``, gathered from the mapped index segments."""
    mapped = ds._source.mapped
    if len(ds._segments) == 1:
        seg = ds._segments[0]
        return np.frombuffer(mapped, ENTRY_DTYPE, seg.count, seg.offset)[positions]
    starts = np.asarray(ds._starts, np.int64)
    which = np.searchsorted(starts, positions, side="right") - 1
    entries = np.empty(len(positions), ENTRY_DTYPE)
    for k in np.unique(which).tolist():
        seg, mine = ds._segments[k], which == k
        segment = np.frombuffer(mapped, ENTRY_DTYPE, seg.count, seg.offset)
        entries[mine] = segment[positions[mine] - starts[k]]
    return entries


GROUP_RECORDS = 16  # records per layout, on average, for a batch of several layouts to be
# decoded column by column (each group costs a few dozen numpy calls); fewer: record by record


def _mapped_columns(ds: Any, positions: np.ndarray, alloc: Allocator) -> list | None:
    """The fast path: the batch's records grouped by payload length, each group decoded by
    its layout, the groups' columns merged. None where the batch does not fit it (too many
    layouts, a structure without one, an index entry or record that fails a check): the
    record-by-record path then reads it, and reports what is wrong."""
    entries = _entries_at(ds, positions)
    header, end, limit = ds.header, ds.commit.end, ds.max_record_bytes
    if (entries["offset"] > end).any() or (entries["length"] > end).any():
        return None  # (and after this, both fit in int64)
    offsets = entries["offset"].astype(np.int64)
    lengths = entries["length"].astype(np.int64)
    if (
        entries["reserved"].any()
        or (offsets % header.alignment).any()
        or (offsets < header.data_start).any()
        or (offsets > end - FRAME_SIZE - lengths).any()
        or (limit is not None and int(lengths.max()) > limit)
    ):
        return None
    if (lengths == lengths[0]).all():
        groups = [np.arange(len(positions))]
    else:
        keys, which = np.unique(lengths, return_inverse=True)
        if len(keys) * GROUP_RECORDS > len(positions):
            return None
        groups = [np.flatnonzero(which == g) for g in range(len(keys))]
    checksum = ds._checksum if ds._crc_on_read else None
    parts = []
    for rows in groups:
        first = int(rows[0])
        length, offset, crc = int(lengths[first]), int(offsets[first]), int(entries["crc"][first])
        layout = _layout_for(ds, int(positions[first]), offset, length, crc)
        if layout is None or any(k >= len(layout.slots) for k in alloc.outs):
            return None
        mine = alloc if len(groups) == 1 else Allocator(len(rows), {}, None)
        columns = decode_batch(
            layout, ds._source.mapped, offsets[rows], entries["crc"][rows], checksum, mine
        )
        if columns is None:
            return None
        parts.append(columns)
    if len(parts) > 1:
        return _merge(groups, parts, len(positions), alloc)
    for k in alloc.outs:
        if not isinstance(parts[0][k], np.ndarray):
            alloc.refuse_list(k, "they are not tensors or scalars")
    return parts[0]


def _merge(
    groups: list[np.ndarray], parts: list[list], count: int, alloc: Allocator
) -> list | None:
    """The columns of a batch from its groups' columns (``groups[g]``: the batch rows of
    group g): arrays where every group's are of one dtype and row shape, else lists."""
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
            out = alloc(k, first.shape[1:], first.dtype)
            for rows, piece in zip(groups, pieces):
                out[rows] = piece
        else:
            alloc.refuse_list(k, "its values differ in kind, dtype or shape")
            out = [None] * count
            for rows, piece in zip(groups, pieces):
                for row, value in zip(rows.tolist(), piece):
                    out[row] = value
        merged.append(out)
    return merged


def _layout_for(ds: Any, i: int, offset: int, length: int, crc: int) -> Any:
    """The Layout of records of ``length`` bytes, compiled from record ``i`` (read, and so
    checked, first) if the dataset has none yet; None if that structure has none."""
    if length not in ds._layouts:
        ds._read(i, offset, length, crc)  # raises for a bad record
        buf, pos = ds._source.frame(offset, FRAME_SIZE + length)
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
            raise ValueError(
                f"record {i} has {len(record)} values, record {where[0]} has {width}: "
                "a batch needs one value count"
            )
    for k in alloc.outs:
        if k >= width:
            raise ValueError(f"out for {alloc.label(k)}: the records have {width} values")
    return [_stack([r[k] for r in records], k, alloc) for k in range(width)]


def _stack(values: list, k: int, alloc: Allocator) -> Any:
    first = values[0]
    kind = type(first)
    if kind is np.ndarray:
        spec = (first.dtype, first.shape)
        if all(type(v) is np.ndarray and (v.dtype, v.shape) == spec for v in values):
            out = alloc(k, first.shape, first.dtype)
            for row, value in zip(out, values):
                row[...] = value
            return out
        alloc.refuse_list(k, "tensors of different shapes or dtypes")
        return values
    dtype = _SCALAR_DTYPES.get(kind)
    if dtype is not None and all(type(v) is kind for v in values):
        out = alloc(k, (), dtype)
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


def sharded_batch(sds: Any, indices: Any, out: Out = None, new: Any = None) -> Batch:
    """``ShardedDataset.get_batch``: one batch across shards. The records of each shard
    are read as one batch of that shard; with several shards, their columns are merged
    (one copy more)."""
    positions = indexing.many(indices, len(sds))
    names = sds.fields
    alloc = Allocator(len(positions), field_keys(names, out), names, new)
    shard_of = np.searchsorted(sds.offsets, positions, side="right") - 1
    one = len(positions) == 0 or shard_of.min() == shard_of.max()
    shards = shard_of[:1].tolist() if one else np.unique(shard_of).tolist()
    if len(shards) <= 1:
        ds = sds.shard(shards[0]) if shards else None
        local = positions - (sds.offsets[shards[0]] if shards else 0)
        columns = read_columns(ds, local, alloc) if shards else []
        return name_columns(columns, names, alloc)
    groups, parts = [], []
    for k in shards:
        rows = np.flatnonzero(shard_of == k)
        part = Allocator(len(rows), {}, names)
        parts.append(read_columns(sds.shard(k), positions[rows] - sds.offsets[k], part))
        groups.append(rows)
    columns = _merge(groups, parts, len(positions), alloc)
    if columns is None:
        widths = sorted({len(p) for p in parts})
        raise ValueError(f"the shards' records have different numbers of values: {widths}")
    return name_columns(columns, names, alloc)


def name_columns(columns: list, names: tuple[str, ...] | None, alloc: Allocator) -> Batch:
    """The batch as returned: the caller's own ``out`` objects (a tensor stays a tensor),
    by field name when the file has names."""
    for k, target in alloc.outs.items():
        columns[k] = target
    if names is None:
        return columns
    if not columns:
        return {name: [] for name in names}
    if len(columns) != len(names):
        raise FormatError(f"records have {len(columns)} values for {len(names)} field names")
    return dict(zip(names, columns))
