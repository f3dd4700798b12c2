"""Batches of records that share one Layout: decoded into stacked columns, or encoded from
them, with numpy operations over the whole batch instead of a Python walk per record.

A column is one value position across the batch: a tensor slot becomes one [B, *shape]
array, an Int / Double / Bool slot a 1-D int64 / float64 / bool array, a String or None slot
a list. Both directions work from the layout's slots (layout.py), so they agree with the
record codec by construction; tests/test_batch.py holds them to that.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..container import FRAME_CRC_AT, FRAME_SIZE
from .kinds import S_BOOL, S_BYTES, S_NONE, S_SCALAR, S_TENSOR, S_TEXT
from .layout import Layout

assert FRAME_CRC_AT == 4  # the checksum is the high half of the frame's first word
BIG_COPY = 1 << 12  # tensor data at least this big is copied record by record (memcpy bound)
BOOL = np.dtype("?")

Alloc = Callable[[int, tuple, np.dtype], np.ndarray]


def _gather(u8: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """[B, n] uint8: the ``n`` bytes at each of ``starts`` (small fields)."""
    return u8[starts[:, None] + np.arange(n)]


def _copy_data(u8: np.ndarray, starts: np.ndarray, nbytes: int, dest: np.ndarray) -> None:
    """Copy ``nbytes`` from each of ``starts`` (multiples of the file's alignment) into the
    rows of ``dest`` ([B, nbytes] uint8, C-contiguous)."""
    if nbytes >= BIG_COPY:
        for row, start in zip(dest, starts.tolist()):
            row[:] = u8[start : start + nbytes]
        return
    width = min(nbytes & -nbytes, 64)  # rows of this many bytes tile every field exactly
    rows = u8[: len(u8) // width * width].reshape(-1, width)
    index = (starts // width)[:, None] + np.arange(nbytes // width)
    np.take(rows, index, axis=0, out=dest.reshape(len(dest), -1, width), mode="clip")


def decode_batch(
    layout: Layout,
    buf: Any,
    frames: np.ndarray,
    crcs: np.ndarray,
    checksum: Any,
    alloc: Alloc,
) -> list | None:
    """The columns of the records whose frames start at ``buf[frames]`` (int64 offsets; the
    frames must lie inside ``buf``), or None when a record does not have this layout or
    fails its ``checksum`` (a function; None: not checked): the caller then reads record by
    record, which says which and why. ``alloc(slot, shape, dtype)`` gives the array a
    stacked column goes in."""
    u8 = np.frombuffer(buf, np.uint8)
    count = len(frames)
    words, mask, expected = layout.words  # the structure, 8 bytes at a time
    u64 = u8[: len(u8) // 8 * 8].view("<u8")
    found = np.take(u64, (frames // 8)[:, None] + words, mode="clip")  # clipped: no match
    if not ((found & mask) == expected).all():
        return None
    # Word 0 is the frame's magic and checksum (FRAME_CRC_AT = 4): it must be the index's.
    if not ((found[:, 0] >> np.uint64(32)) == crcs).all():
        return None
    if checksum is not None:
        view = memoryview(buf)
        length = layout.length
        for start, crc in zip((frames + FRAME_SIZE).tolist(), crcs.tolist()):
            if checksum(view[start : start + length]) != crc:
                return None
    columns: list[Any] = []
    for k, (kind, _, at, detail) in enumerate(layout.slots):
        starts = frames + at
        if kind == S_TENSOR:
            dtype, shape, strides, nbytes, numel = detail
            out = alloc(k, shape, dtype)
            if numel is None:  # stored in a dim order: copy each strided view
                for row, start in zip(out, starts.tolist()):
                    row[...] = np.ndarray(shape, dtype, buffer=buf, offset=start, strides=strides)
            elif nbytes:
                _copy_data(u8, starts, nbytes, out.reshape(count, -1).view(np.uint8))
            columns.append(out)
        elif kind == S_SCALAR or kind == S_BOOL:
            dtype = detail if kind == S_SCALAR else BOOL
            raw = _gather(u8, starts, dtype.itemsize)
            if kind == S_BOOL and raw.max(initial=0) > 1:
                return None
            out = alloc(k, (), dtype)
            out[...] = raw.view(dtype).ravel()
            columns.append(out)
        elif kind == S_TEXT or kind == S_BYTES:
            if detail:
                items = _gather(u8, starts, detail).view(f"V{detail}").ravel().tolist()
            else:
                items = [b""] * count
            if kind == S_TEXT:
                try:
                    items = [item.decode("utf-8") for item in items]
                except UnicodeDecodeError:
                    return None
            columns.append(items)
        else:
            assert kind == S_NONE
            columns.append([None] * count)
    return columns


def encode_batch(
    layout: Layout, blocks: list, count: int, alignment: int, checksum: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` frames of ``layout``, each padded to the alignment, as one [count, stride]
    uint8 array, and their payload checksums (uint32).

    ``blocks[k]`` holds the bytes of value k of every record, [count, width] uint8, where
    the layout has value bytes (tensor data, a scalar, a string's bytes) at that slot's
    offset; None for a value without (None). Everything else is the layout's structure,
    the same in every frame: the bytes are those the record codec writes, record by record.
    """
    stride = -(-layout.size // alignment) * alignment
    frames = np.empty((count, stride), np.uint8)
    frames[:, : layout.size] = layout.frame
    frames[:, layout.size :] = 0  # the padding to the next frame
    for (_, _, at, _), block in zip(layout.slots, blocks):
        if block is not None:
            frames[:, at : at + block.shape[1]] = block
    flat = memoryview(frames.reshape(-1))
    length = layout.length
    payloads = range(FRAME_SIZE, count * stride, stride)  # where each payload starts
    crcs = np.array([checksum(flat[at : at + length]) for at in payloads], "<u4")
    frames[:, FRAME_CRC_AT : FRAME_CRC_AT + 4] = crcs.view(np.uint8).reshape(count, 4)
    return frames, crcs
