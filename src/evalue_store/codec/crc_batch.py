"""The payload checksums of a batch of same-layout records, computed without a call per
record where that is cheaper.

Both checksums a file may use (CRC-32 and CRC-32C) are affine over GF(2) for a fixed
length: crc(m) = crc(s) XOR A(m XOR s), A linear. Records of one layout agree with the
layout's sample ``s`` on every structural byte (the batch decoder checks that first), so
m XOR s is zero except on the value bytes, and crc(m) is crc(s) XORed with one table entry
per value byte: T[j][byte j]. The tables are built once per layout by calling the
checksum itself (8 calls per value byte), so they are right for whichever function the
file uses. This computes every record's checksum exactly: it is the same check as one
call per record, only vectorised. For records with many value bytes one call per record
is cheaper, and is what ``checksums`` does then.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..container import FRAME_SIZE

MAX_TABLE_BYTES = 48  # value bytes per record up to which the table method is used...
MIN_TABLE_BATCH = 40  # ...for batches at least this big (measured: below, a call per record wins)
_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)  # [byte, bit]


class Tables:
    """The checksum of a layout's payloads as a function of their value bytes: ``table``
    (flattened [V, 256] uint32, row j from ``rows[j]``), ``base`` (the checksum of the
    sample with its value bytes zeroed), and where the value bytes are: ``at`` (frame
    offsets, [V, 1]) and ``cols`` (offsets in the batch decoder's gathered words, or None
    when some are not among them)."""

    __slots__ = ("checksum", "at", "cols", "rows", "table", "base")

    def __init__(self, checksum: Any, layout: Any, plan: Any):
        payload = np.array(layout.frame[FRAME_SIZE:])
        structural = layout.check_at
        values = np.ones(len(payload), bool)
        values[structural[structural >= FRAME_SIZE] - FRAME_SIZE] = False
        positions = np.flatnonzero(values)
        payload[positions] = 0
        self.checksum = checksum
        self.base = checksum(payload.tobytes())
        basis = np.empty((len(positions), 8), np.uint32)
        probe = bytearray(payload.tobytes())
        for j, p in enumerate(positions.tolist()):
            for bit in range(8):
                probe[p] = 1 << bit
                basis[j, bit] = checksum(probe) ^ self.base
            probe[p] = 0
        table = np.bitwise_xor.reduce(np.where(_BITS, basis[:, None, :], 0), axis=2)
        self.table = table.astype(np.uint32).ravel()
        self.at = (positions + FRAME_SIZE)[:, None]
        self.cols = plan.row_bytes(positions + FRAME_SIZE)
        self.rows = (np.arange(len(positions), dtype=np.uint16) * 256)[:, None]  # V <= 256

    def __call__(self, u8: np.ndarray, frames: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The payload checksums (uint32) of the frames at ``u8[frames]``, whose gathered
        words are ``rows``."""
        if not len(self.at):
            return np.full(len(frames), self.base, np.uint32)
        if self.cols is not None:  # [V, B]: reduced over axis 0, numpy's fast direction
            values = rows.view(np.uint8).T[self.cols]
        else:
            values = u8[self.at + frames]
        return np.bitwise_xor.reduce(self.table[values + self.rows], axis=0) ^ np.uint32(self.base)


def checksums(
    layout: Any,
    plan: Any,
    buf: Any,
    u8: np.ndarray,
    frames: np.ndarray,
    rows: np.ndarray,
    checksum: Any,
) -> np.ndarray:
    """The payload checksums (uint32) of the records of ``layout`` at ``frames``, whose
    structural bytes the caller has checked (``rows``: their gathered words, ``plan``)."""
    tables = layout.crc_tables
    small = layout.value_bytes <= MAX_TABLE_BYTES and len(frames) >= MIN_TABLE_BATCH
    if small and (tables is None or tables.checksum is not checksum):
        tables = layout.crc_tables = Tables(checksum, layout, plan)
    if small:
        return tables(u8, frames, rows)
    view = memoryview(buf)
    length = layout.length
    got = [checksum(view[s : s + length]) for s in (frames + FRAME_SIZE).tolist()]
    return np.array(got, np.uint32)
