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
    payloads = np.arange(FRAME_SIZE, count * stride, stride, dtype=np.int64)  # their starts
    crcs = checksum_ranges(checksum, frames, payloads, layout.length)
    frames[:, FRAME_CRC_AT : FRAME_CRC_AT + 4] = crcs.view(np.uint8).reshape(count, 4)
    return frames, crcs
