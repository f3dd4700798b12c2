"""Columnar writes (``Writer.extend_columns``): N records given field by field.

The layers: ``Column`` (a user's column) -> ``column_layout`` (the first record's layout,
and each column's bytes for it) or ``encode_rows`` -> ``append_columns`` (frames built
CHUNK_BYTES at a time and written as ``append`` writes, all or nothing; a plain file's
batches by a second thread while the next one is encoded: pipeline.py).

A column is one field's values for all N records:

* a numpy array or torch tensor of shape [N, ...] with at least 2 dimensions: a Tensor
  per record (row k); wrap a 1-D array in ``evs.Tensor(...)`` for 0-d tensors (a torch
  column of rank-64 rows, 65 dims, which numpy cannot hold, is taken as its list of rows);
* a 1-D integer / floating / bool array: an Int / Double / Bool per record;
* a list or tuple of N values of any kind (strings, bytes, None...), or a 1-D numpy string
  or object array: value k per record, as ``append`` would store it (such an array of more
  dimensions is refused, as ``append`` refuses its rows).

The records are exactly those ``append`` would write, row by row (the file is byte for
byte the same). When every record has the first record's layout (codec.layout: tensors of
one dtype and shape, strings of one encoded length...) their frames are built many at a
time in one numpy buffer (codec.batch.encode_batch), the one the write goes from; the
writer keeps it, with its layout, for the next batch of that layout (``extend`` sends
batch after batch). Otherwise each record is encoded on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..codec import compile_layout, encode_record
from ..codec.batch import encode_batch, frame_buffer
from ..codec.kinds import S_BOOL, S_BYTES, S_NONE, S_SCALAR, S_TENSOR, S_TEXT
from ..codec.layout import Layout
from ..container import ENTRY, ENTRY_DTYPE, FRAME_SIZE
from ..dtypes import BFLOAT16
from ..errors import EncodeError
from ..values import (
    INT64_MAX,
    MAX_RANK,
    Kind,
    Typed,
    _is_torch_tensor,
    as_array,
    masked_problem,
)
from .pipeline import WriteBehind

_SCALAR_KINDS = {"i": int, "u": int, "f": float, "b": bool}
CHUNK_BYTES = 4 << 20  # frames built and written at a time (they stay in the CPU's cache)


class Column:
    """One field's values: ``row(k)`` is record k's value (as append takes it), and
    ``block(slot)`` the bytes of all of them for one slot of a layout, or None when some
    record's value does not fit that slot."""

    def __init__(self, key: Any, value: Any):
        self.key = key
        self.array: np.ndarray | None = None
        self.items: list | None = None
        self.scalar: type | None = None
        force_tensor = isinstance(value, Typed) and value.kind == Kind.TENSOR
        if force_tensor:
            value = value.value
        if isinstance(value, np.ma.MaskedArray):  # (np.asarray would drop the mask)
            raise EncodeError(f"column {key!r}: {masked_problem(value)}")
        if _is_torch_tensor(value) and value.dim() > MAX_RANK:
            # Rows of rank 64 make a column numpy cannot hold (64 dims at most): its rows
            # are the column, stored one by one as append stores them.
            if value.dim() > MAX_RANK + 1:
                rank = value.dim() - 1
                raise EncodeError(f"column {key!r}: tensor rank {rank} exceeds {MAX_RANK}")
            value = list(value.unbind(0))
        if isinstance(value, np.ndarray) and value.dtype.kind in "SUO":  # values, not numbers
            if value.ndim != 1 or force_tensor:  # rows that append refuses as tensors
                raise EncodeError(
                    f"column {key!r}: numpy dtype {value.dtype} has no ExecuTorch ScalarType "
                    "(its rows cannot be tensors; a 1-D array of it is a column of values)"
                )
            value = value.tolist()
        if isinstance(value, np.ndarray) or _is_torch_tensor(value):
            tensor_like = value.ndim > 1 or force_tensor or _is_torch_tensor(value)  # (bf16)
            array = as_array(value) if tensor_like else np.asarray(value)
            if array.ndim == 0:
                raise EncodeError(f"column {key!r}: a 0-d array has no rows")
            if array.ndim == 1 and not force_tensor:
                self.scalar = _SCALAR_KINDS.get(array.dtype.kind)
                if self.scalar is None:
                    dtype = "bfloat16" if array.dtype == BFLOAT16 else array.dtype
                    raise EncodeError(
                        f"column {key!r}: a 1-D {dtype} array is neither Int, Double nor "
                        "Bool values; wrap it in evs.Tensor(...) for 0-d tensors"
                    )
                if array.dtype.kind == "u" and len(array) and array.max() > INT64_MAX:
                    row = int(np.argmax(array > INT64_MAX))
                    raise EncodeError(f"column {key!r} row {row}: {array[row]} does not fit int64")
            self.array = array
            self.count = len(array)
        elif isinstance(value, (list, tuple)):
            self.items = list(value)
            self.count = len(self.items)
        else:
            raise EncodeError(
                f"column {key!r}: a column is an array [N, ...] or a list of N values, "
                f"not {type(value).__name__}"
            )

    def row(self, k: int) -> Any:
        if self.items is not None:
            return self.items[k]
        if self.scalar is not None:
            return self.scalar(self.array[k])
        return self.array[k, ...]  # an array: 0-d for a 1-D column wrapped in evs.Tensor

    def block(self, slot: Any) -> np.ndarray | None:
        kind, _, _, detail = slot
        count = self.count
        if self.items is not None:
            return _items_block(self.items, kind, detail)
        array = self.array
        if self.scalar is not None:
            if kind == S_SCALAR and self.scalar is not bool:
                return np.ascontiguousarray(array, detail).view(np.uint8).reshape(count, -1)
            if kind == S_BOOL and self.scalar is bool:
                return array.astype(np.uint8).reshape(count, 1)
            return None
        dtype, shape, _, nbytes, numel = detail
        if kind != S_TENSOR or numel is None or array.shape[1:] != shape:
            return None  # (a dim order: record by record)
        if array.dtype != dtype or not (count < 2 or array[0].flags.c_contiguous):
            return None  # rows stored after a conversion: record by record
        if not nbytes:
            return np.zeros((count, 0), np.uint8)
        if not array.flags.c_contiguous:  # a slice of a bigger array, a broadcast: not copied
            return _Rows(array, nbytes)
        return array.reshape(count, -1).view(np.uint8).reshape(count, nbytes)


class _Rows:
    """The bytes of the rows of a tensor column that is not C-contiguous, gathered batch
    by batch (``rows[lo:hi]``), so that the memory a write needs stays about a batch."""

    def __init__(self, array: np.ndarray, nbytes: int):
        self.array, self.nbytes = array, nbytes

    def __getitem__(self, rows: slice) -> np.ndarray:
        part = np.ascontiguousarray(self.array[rows])
        return part.reshape(len(part), -1).view(np.uint8).reshape(len(part), self.nbytes)


def _items_block(items: list, kind: int, size: Any) -> np.ndarray | None:
    if kind == S_NONE:
        return None if any(item is not None for item in items) else _NO_BYTES
    if kind not in (S_TEXT, S_BYTES):
        return None
    want = str if kind == S_TEXT else bytes
    if set(map(type, items)) != {want}:
        return None
    data = items
    if want is str:
        text = "".join(items)
        if text.isascii():  # one byte per character
            joined = text.encode("ascii")
        else:
            try:
                data = [item.encode("utf-8") for item in items]
            except UnicodeEncodeError:  # a lone surrogate: the row by row path says which
                return None
            joined = b"".join(data)
    else:
        joined = b"".join(items)
    if len(joined) != len(items) * size or set(map(len, data)) != {size}:
        return None
    return np.frombuffer(joined, np.uint8).reshape(len(items), size)


_NO_BYTES = object()  # a None slot fits: it has no bytes


def columns_of(columns: Mapping[Any, Any]) -> tuple[Any, int]:
    """The columns as a record would hold them (a dict by name, or a list by position,
    for ``Fields.values``) and their common row count."""
    if not isinstance(columns, Mapping) or not columns:
        raise EncodeError("extend_columns takes a non-empty dict of columns")
    keys = list(columns)
    if all(isinstance(k, str) for k in keys):
        record: Any = {k: Column(k, v) for k, v in columns.items()}
        found = list(record.values())
    elif all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in keys):
        by_position = {int(k): v for k, v in columns.items()}  # (numpy integers as ints)
        if sorted(by_position) != list(range(len(keys))):
            raise EncodeError(f"columns by position must be 0..{len(keys) - 1}, not {sorted(keys)}")
        found = [Column(k, by_position[k]) for k in range(len(keys))]
        record = found
    else:
        raise EncodeError("columns are keyed all by field name or all by position")
    counts = {c.count for c in found}
    if len(counts) != 1:
        sizes = {c.key: c.count for c in found}
        raise EncodeError(f"columns differ in length: {sizes}")
    return record, counts.pop()


def column_layout(
    columns: list[Column], alignment: int, checksum: Any, known: Layout | None = None
) -> tuple[Layout, list] | None:
    """The first record's layout and each column's bytes for it ([N, width] uint8, or
    _Rows giving them for a slice of the records; None for a value without bytes), or
    None when the records do not all share that layout.
    ``known``: a layout the first record may have (the last batch's), used if it does,
    instead of compiling the same again."""
    chunks, length, _ = encode_record([c.row(0) for c in columns], alignment, checksum)
    frame = b"".join(bytes(memoryview(chunk).cast("B")) for chunk in chunks)
    if (
        known is not None
        and FRAME_SIZE + length == known.size
        and known.structure(known.unpack(frame)) == known.expected
    ):
        layout: Layout | None = known  # the same structural bytes: compiling gives the same
    else:
        layout = compile_layout(memoryview(frame), 0, length, alignment)
    if layout is None or len(layout.slots) != len(columns):
        return None
    blocks = []
    for column, slot in zip(columns, layout.slots):
        block = column.block(slot)
        if block is None:
            return None
        blocks.append(None if block is _NO_BYTES else block)
    return layout, blocks


def encode_rows(columns: list[Column], count: int, alignment: int, checksum: Any = None) -> list:
    """Each record on its own: [(chunks, payload length, checksum)] in order."""
    return [encode_record([c.row(k) for c in columns], alignment, checksum) for k in range(count)]


def _write_frames(sink: Any, view: memoryview, count: int, size: int, stride: int) -> None:
    """``count`` frames of ``size`` bytes (``stride`` with their padding), end to end."""
    write_blocks = getattr(sink, "write_blocks", None)
    if write_blocks is not None:
        write_blocks(view, count, stride, size)
        return
    for at in range(0, count * stride, stride):  # the frame layer places each record's block
        sink.begin_block(size)
        sink.write(view[at : at + stride], stride)


def append_columns(writer: Any, columns: Mapping[Any, Any]) -> range:
    """``Writer.extend_columns`` (the writer is open and locked): encode, write, index."""
    record, count = columns_of(columns)
    if count and isinstance(record, dict):  # names checked on the first row's values too,
        writer._record_values({k: c.row(0) for k, c in record.items()})  # as append does it
    ordered, fixed = writer._record_values(record)
    first = len(writer)
    if count == 0:
        return range(first, first)
    known = writer._column_frames[0] if writer._column_frames else None
    built = column_layout(ordered, writer.alignment, writer._checksum, known)
    rows = None
    if built is None:  # each record encoded on its own, before anything is written
        rows = encode_rows(ordered, count, writer.alignment, writer._checksum)
    offset = writer._align()
    pending = len(writer._pending)
    try:
        if built is not None:
            _write_batches(writer, *built, count, offset)
        else:
            sink = writer._sink
            for chunks, length, crc in rows:
                at = sink.pos
                sink.begin_block(FRAME_SIZE + length)
                for chunk in chunks:
                    sink.write(chunk, len(chunk))
                writer._pending += ENTRY.pack(at, length, crc, 0)
    except BaseException as exc:
        del writer._pending[pending:]
        writer._undo_record(offset, exc)
        raise
    writer._record_appended(fixed, len(ordered))
    return range(first, first + count)


def _write_batches(writer: Any, layout: Layout, blocks: list, count: int, offset: int) -> None:
    """``count`` records of one layout from ``offset`` on, CHUNK_BYTES of frames at a time,
    each batch encoded into a buffer and written from it. When there are several batches
    of a plain file, a second thread writes each while this one encodes the next
    (pipeline.WriteBehind); it has stopped writing when this returns or raises."""
    alignment, sink = writer.alignment, writer._sink
    stride = -(-layout.size // alignment) * alignment
    step = max(1, min(count, CHUNK_BYTES // stride))
    buffers = [_frame_buffer(writer, layout, step)]
    behind = None
    if count > step and not sink.compressed:
        buffers += [frame_buffer(layout, step, alignment) for _ in range(2)]
        behind = WriteBehind(sink, buffers, _write_frames)
    try:
        for lo in range(0, count, step):
            n = min(step, count - lo)
            frames = buffers[0] if behind is None else behind.buffer()
            part = [None if b is None else b[lo : lo + n] for b in blocks]
            crcs = encode_batch(layout, part, frames[:n], writer._checksum)
            if behind is None:
                _write_frames(sink, memoryview(frames[:n].reshape(-1)), n, layout.size, stride)
            else:
                behind.write(frames, n, layout.size, stride)
            entries = np.zeros(n, ENTRY_DTYPE)
            at = offset + lo * stride
            entries["offset"] = np.arange(at, at + n * stride, stride)
            entries["length"] = layout.length
            entries["crc"] = crcs
            writer._pending += entries.tobytes()
        if behind is not None:
            behind.finish()
    except BaseException:
        if behind is not None:
            behind.cancel()  # its thread has stopped writing before the file is cut back
        raise


def _frame_buffer(writer: Any, layout: Layout, rows: int) -> np.ndarray:
    """A frame_buffer of ``rows`` frames of ``layout``: the writer keeps the last one made,
    so that batch after batch of one layout (``extend``'s) has its structure written once."""
    kept = writer._column_frames
    if kept is None or kept[0] is not layout or len(kept[1]) < rows:
        kept = writer._column_frames = layout, frame_buffer(layout, rows, writer.alignment)
    return kept[1][:rows]
