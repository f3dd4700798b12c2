"""Decoding a batch of records that share one Layout into stacked columns, in one compiled
pass per record (``_native.BatchPlan``, src/evalue_store/_native_batch.cc).

A column is one value position across the batch: a tensor slot becomes one [B, *shape]
array, an Int / Double / Bool slot a 1-D int64 / float64 / bool array, a String or None slot
a list. For each record in turn the compiled code checks its frame (the header's checksum
field against the index's, the structure bytes against the layout's, the payload's checksum
when verifying, each Bool byte) and copies each tensor, scalar and Bool value straight into
its row of the column, so each record's bytes come from memory once. The records are at
random places in the file: the numpy decoder this replaced read them three times (the
checksum, a gather of whole frames, the copies out of it). A tensor stored in a dim order is
copied as bytes, then put in C order by numpy. tests/test_batch_paths.py holds the result to
what the record codec decodes.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import _native
from ..container import FRAME_SIZE
from .kinds import S_BOOL, S_BYTES, S_NONE, S_SCALAR, S_TENSOR, S_TEXT
from .layout import Layout

BOOL = np.dtype("?")

Alloc = Callable[[int, tuple, np.dtype, bool], np.ndarray]  # (slot, shape, dtype, scalar)


def _value_size(kind: int, detail: Any) -> int:
    """Bytes of a slot's value in the frame."""
    if kind == S_TENSOR:
        return detail[3]
    if kind == S_SCALAR:
        return detail.itemsize
    if kind == S_BOOL:
        return 1
    if kind in (S_TEXT, S_BYTES):
        return detail
    return 0


def plan_of(layout: Layout) -> Any:
    """The layout's ``_native.BatchPlan``, made by its first batch."""
    plan = layout.plan
    if plan is None:
        steps = [(kind, at, _value_size(kind, detail)) for kind, _, at, detail in layout.slots]
        plan = layout.plan = _native.BatchPlan(FRAME_SIZE + layout.length, layout.runs(), steps)
    return plan


def decode_batch(
    layout: Layout,
    buf: Any,
    frames: np.ndarray,
    crcs: np.ndarray,
    checksum: str | None,
    alloc: Alloc,
) -> list | None:
    """The columns of the records whose frames start at ``buf[frames]`` (int64 offsets;
    ``buf``: one buffer, or a list of one per record; ``crcs``: their index entries'
    checksums, uint32), or None when a record does not have
    this layout, lies outside ``buf`` or fails its ``checksum`` ('crc32c', 'crc32'; None:
    not checked): the caller then reads record by record, which says which and why.
    ``alloc(slot, shape, dtype, scalar)`` gives the array a stacked column goes in
    (``scalar``: of Int, Double or Bool values, not tensors)."""
    count = len(frames)
    columns: list[Any] = []
    outs: list[Any] = []
    reorder = []  # (column, its bytes): tensors stored in a dim order
    for k, (kind, _, _, detail) in enumerate(layout.slots):
        if kind == S_TENSOR:
            dtype, shape, strides, nbytes, numel = detail
            out = alloc(k, shape, dtype, False)
            if numel is None:
                data = np.empty((count, nbytes), np.uint8)
                reorder.append((out, data, (count, *shape), dtype, (nbytes, *strides)))
                outs.append(data)
            else:
                outs.append(out)
        elif kind == S_SCALAR or kind == S_BOOL:
            out = alloc(k, (), BOOL if kind == S_BOOL else detail, True)
            outs.append(out)
        else:
            out = [None] * count if kind == S_NONE else None
            outs.append(None)
        columns.append(out)
    bad, lists = plan_of(layout).decode(buf, frames, crcs, checksum, outs)
    if bad:
        return None
    for out, data, shape, dtype, strides in reorder:
        out[...] = np.ndarray(shape, dtype, data, 0, strides)
    return [column if values is None else values for column, values in zip(columns, lists)]
