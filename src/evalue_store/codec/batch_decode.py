"""Decoding a batch of records that share one Layout into stacked columns, with a fixed
number of numpy operations per batch, none per record.

A column is one value position across the batch: a tensor slot becomes one [B, *shape]
array, an Int / Double / Bool slot a 1-D int64 / float64 / bool array, a String or None slot
a list. Per batch, one gather copies, for every record, the 8-byte words of its frame that
hold structure or small values (scalars, short strings, small tensors) into a [B, W] block:
the structure is checked there with one masked compare, and each small value's column is
one strided copy out of it. Bigger tensor data is copied straight from the buffer into its
column, in rows of up to 64 bytes. The plan of which words and where is made once per
layout. tests/test_batch_paths.py holds the result to what the record codec decodes.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..checksums import checksum_ranges
from ..container import FRAME_CRC_AT, FRAME_LENGTH_AT, FRAME_SIZE
from .kinds import S_BOOL, S_BYTES, S_NONE, S_SCALAR, S_TENSOR, S_TEXT
from .layout import Layout

assert (FRAME_CRC_AT, FRAME_LENGTH_AT) == (4, 8)  # word 0: magic, then the checksum
BIG_COPY = 1 << 12  # tensor data at least this big is copied record by record (memcpy bound)
SMALL_VALUE = 64  # values up to this many bytes are taken from the gathered words
BOOL = np.dtype("?")

Alloc = Callable[[int, tuple, np.dtype], np.ndarray]


class Plan:
    """Where a layout's values are, for the batch decoder: ``words`` (frame word indices
    gathered per record: one contiguous run when that costs at most twice the words
    needed, as a strided view is gathered faster than by an index array), ``mask`` /
    ``expected`` (the structural bits of those words and their values), ``at`` (per slot:
    its byte offset in a gathered row, or None when it is copied from the buffer itself)."""

    __slots__ = ("words", "run", "mask", "expected", "at")

    def __init__(self, layout: Layout):
        frame = layout.frame
        n_words = -(-len(frame) // 8)
        wanted = np.zeros(n_words, bool)
        wanted[layout.check_at // 8] = True
        wanted[0] = True  # the checksum, compared with the index entry's
        small = []
        for kind, _, at, detail in layout.slots:
            size = _value_size(kind, detail)
            is_small = size is not None and size <= SMALL_VALUE
            small.append(is_small and size > 0)
            if is_small and size:
                wanted[at // 8 : -(-(at + size) // 8)] = True
        words = np.flatnonzero(wanted)
        self.run = int(words[-1]) + 1 <= 2 * len(words)  # words 0.. last, contiguous
        self.words = np.arange(words[-1] + 1) if self.run else words
        padded = np.zeros(n_words * 8, np.uint8)
        padded[: len(frame)] = frame
        mask = np.zeros(n_words * 8, np.uint8)
        mask[layout.check_at] = 0xFF
        self.mask = mask.view("<u8")[self.words]
        self.expected = (padded & mask).view("<u8")[self.words]
        place = np.full(n_words, -1, np.int64)  # per frame word: its offset in a gathered row
        place[self.words] = np.arange(len(self.words)) * 8
        self.at = [
            int(place[at // 8] + at % 8) if is_small else None
            for (_, _, at, _), is_small in zip(layout.slots, small)
        ]

    def gather(self, buf: Any, u64: np.ndarray, frames: np.ndarray) -> np.ndarray | None:
        """[B, W] uint64: the gathered words of each frame (None if one runs off ``buf``,
        which only a damaged index can make happen)."""
        if not self.run:
            return np.take(u64, (frames >> 3)[:, None] + self.words, mode="clip")
        width = len(self.words)
        rows = len(u64) - width + 1
        if rows <= 0 or int(frames.max()) >> 3 >= rows:
            return None
        return np.ndarray((rows, width), "<u8", buf, 0, (8, 8))[frames >> 3]


def _value_size(kind: int, detail: Any) -> int | None:
    """Bytes of a slot's value; None for a tensor stored in a dim order (copied apart)."""
    if kind == S_TENSOR:
        return None if detail[4] is None else detail[3]
    if kind == S_SCALAR:
        return detail.itemsize
    if kind == S_BOOL:
        return 1
    if kind in (S_TEXT, S_BYTES):
        return detail
    return 0


def plan_of(layout: Layout) -> Plan:
    plan = layout.plan
    if plan is None:
        plan = layout.plan = Plan(layout)
    return plan


def _copy_data(
    u8: np.ndarray, starts: np.ndarray, nbytes: int, dest: np.ndarray, alignment: int
) -> None:
    """Copy ``nbytes`` from each of ``starts`` (multiples of ``alignment``) into the rows of
    ``dest`` ([B, nbytes] uint8, C-contiguous)."""
    if nbytes >= BIG_COPY:
        for row, start in zip(dest, starts.tolist()):
            row[:] = u8[start : start + nbytes]
        return
    width = min(nbytes & -nbytes, alignment, 64)  # divides every start
    # Every run of nbytes starting at a multiple of width, as the rows of one strided view:
    # one fancy index copies each record's bytes with one memcpy, no index array per byte.
    rows = np.ndarray(((len(u8) - nbytes) // width + 1, nbytes), np.uint8, u8, 0, (width, 1))
    dest[...] = rows[starts // width]


def decode_batch(
    layout: Layout,
    buf: Any,
    frames: np.ndarray,
    crcs: np.ndarray,
    checksum: Any,
    alloc: Alloc,
) -> list | None:
    """The columns of the records whose frames start at ``buf[frames]`` (int64 offsets,
    multiples of the layout's alignment; the frames must lie inside ``buf``), or None when
    a record does not have this layout or fails its ``checksum`` (a function; None: not
    checked): the caller then reads record by record, which says which and why.
    ``alloc(slot, shape, dtype)`` gives the array a stacked column goes in."""
    plan = plan_of(layout)
    u8 = np.frombuffer(buf, np.uint8)
    count = len(frames)
    u64 = u8[: len(u8) // 8 * 8].view("<u8")
    rows = plan.gather(buf, u64, frames)  # [B, W]
    if rows is None or not ((rows & plan.mask) == plan.expected).all():
        return None
    if not ((rows[:, 0] >> np.uint64(32)) == crcs).all():  # word 0: magic, checksum
        return None
    if checksum is not None:
        got = checksum_ranges(checksum, buf, frames + FRAME_SIZE, layout.length)
        if not (got == crcs).all():
            return None
    columns: list[Any] = []
    for k, ((kind, _, at, detail), place) in enumerate(zip(layout.slots, plan.at)):
        if kind == S_NONE:
            columns.append([None] * count)
            continue
        if kind == S_TENSOR:
            dtype, shape, strides, nbytes, numel = detail
            out = alloc(k, shape, dtype)
            if place is not None:
                out[...] = _strided(rows, place, dtype, shape, strides)
            elif not nbytes:
                pass
            elif numel is None:  # stored in a dim order: its bytes, then viewed in that order
                data = np.empty((count, nbytes), np.uint8)
                _copy_data(u8, frames + at, nbytes, data, layout.alignment)
                out[...] = np.ndarray((count, *shape), dtype, data, 0, (nbytes, *strides))
            else:
                dest = out.reshape(count, -1).view(np.uint8)
                _copy_data(u8, frames + at, nbytes, dest, layout.alignment)
            columns.append(out)
        elif kind == S_SCALAR or kind == S_BOOL:
            values = _strided(rows, place, detail if kind == S_SCALAR else np.uint8)
            if kind == S_BOOL:
                if values.max(initial=0) > 1:
                    return None
                values = values.view(BOOL)
            out = alloc(k, (), BOOL if kind == S_BOOL else detail)
            out[...] = values
            columns.append(out)
        else:
            if not detail:
                items = [b""] * count
            elif place is not None:
                items = _strided(rows, place, np.dtype(f"V{detail}")).tolist()
            else:
                starts = (frames + at)[:, None] + np.arange(detail)
                items = u8[starts].view(f"V{detail}").ravel().tolist()
            if kind == S_TEXT:
                try:
                    items = list(map(bytes.decode, items))  # UTF-8, strict
                except UnicodeDecodeError:
                    return None
            columns.append(items)
    return columns


def _strided(
    rows: np.ndarray, place: int, dtype: Any, shape: tuple = (), strides: tuple = ()
) -> np.ndarray:
    """The value at byte ``place`` of every gathered row, as one [B, *shape] view
    (``strides``: the value's own, C order for a small tensor)."""
    return np.ndarray((len(rows), *shape), dtype, rows, place, (rows.shape[1] * 8, *strides))
