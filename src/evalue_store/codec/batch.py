"""Batches of records that share one Layout, encoded from stacked columns with numpy
operations over the whole batch instead of a Python walk per record (the other direction
is batch_decode.py).

``blocks`` give one value position across the batch. The encoder works from the layout's
slots (layout.py), so it agrees with the record codec by construction; tests/test_columns.py
holds it to that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checksums import checksum_ranges
from ..container import FRAME_CRC_AT, FRAME_SIZE
from .layout import Layout


def frame_buffer(layout: Layout, rows: int, alignment: int) -> np.ndarray:
    """A [rows, stride] uint8 buffer of ``rows`` copies of the layout's sample frame, each
    padded with zeros to the alignment: the bytes every frame of the layout shares.
    ``encode_batch`` then writes only what differs between records (the values and the
    checksum), so a buffer reused batch after batch has its structure written once."""
    stride = -(-layout.size // alignment) * alignment
    frames = np.zeros((rows, stride), np.uint8)
    frames[:, : layout.size] = layout.frame
    return frames


def encode_batch(layout: Layout, blocks: list, frames: np.ndarray, checksum: Any) -> np.ndarray:
    """Fill ``frames`` (rows of a ``frame_buffer`` of ``layout``, one per record) with the
    records' values and checksums; returns the payload checksums (uint32).

    ``blocks[k]`` holds the bytes of value k of every record, [count, width] uint8, where
    the layout has value bytes (tensor data, a scalar, a string's bytes) at that slot's
    offset; None for a value without (None). Everything else is the layout's structure,
    the same in every frame: the bytes are those the record codec writes, record by record.
    """
    count, stride = frames.shape
    for (_, _, at, _), block in zip(layout.slots, blocks):
        if block is not None and block.shape[1]:
            # as one opaque item per record: one memcpy each, not a loop over its bytes
            item = np.dtype((np.void, block.shape[1]))
            frames[:, at : at + block.shape[1]].view(item)[:, 0] = block.view(item)[:, 0]
    payloads = np.arange(FRAME_SIZE, count * stride, stride, dtype=np.int64)  # their starts
    crcs = checksum_ranges(checksum, frames, payloads, layout.length)
    frames[:, FRAME_CRC_AT : FRAME_CRC_AT + 4] = crcs.view(np.uint8).reshape(count, 4)
    return crcs
